// gtest before cpprest: cpprest defines a macro U that breaks gtest's templates.
#include <gtest/gtest.h>

#include "operator/health_server.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>

#include <cpprest/http_client.h>

namespace kubetrain {
namespace {

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

int Get(int port, const std::string& path) {
  web::http::client::http_client client("http://127.0.0.1:" + std::to_string(port));
  return client.request(web::http::methods::GET, path).get().status_code();
}

TEST(HealthServerTest, HealthzAlwaysReadyzWhenReady) {
  const int port = FreePort();
  std::atomic<bool> ready{false};
  auto server =
      HealthServer::Start("127.0.0.1:" + std::to_string(port), [&] { return ready.load(); });
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(Get(port, "/healthz"), 200);
  EXPECT_EQ(Get(port, "/readyz"), 503);
  ready = true;
  EXPECT_EQ(Get(port, "/readyz"), 200);
  EXPECT_EQ(Get(port, "/metrics"), 404);
}

TEST(HealthServerTest, AnAddressInUseIsAnError) {
  const int port = FreePort();
  auto first = HealthServer::Start("127.0.0.1:" + std::to_string(port), [] { return true; });
  ASSERT_TRUE(first.ok());
  auto second = HealthServer::Start("127.0.0.1:" + std::to_string(port), [] { return true; });
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find(std::to_string(port)), std::string::npos)
      << second.status();
}

}  // namespace
}  // namespace kubetrain
