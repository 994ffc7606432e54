// gtest before cpprest: cpprest defines a macro U that breaks gtest's templates.
#include <gtest/gtest.h>

#include "operator/progress.h"

#include "core/job_report.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cpprest/http_listener.h>

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

TEST(ProgressTest, ScrapesTheChiefsMetrics) {
  const int port = FreePort();
  web::http::experimental::listener::http_listener metrics(
      utility::conversions::to_string_t("http://127.0.0.1:" + std::to_string(port)));
  metrics.support(web::http::methods::GET, [](web::http::http_request req) {
    req.reply(web::http::status_codes::OK,
              "# HELP kubetrain_global_step x\n# TYPE kubetrain_global_step "
              "gauge\nkubetrain_global_step 1200\n"
              "kubetrain_target_steps 3750\nkubetrain_training_loss "
              "0.4125\nkubetrain_eval_accuracy 0.8712\n"
              "kubetrain_rpc_duration_seconds_count{method=\"Pull\",side=\"client\"} 5\n");
  });
  metrics.open().wait();
  auto text = ScrapeMetrics("127.0.0.1", port, absl::Seconds(2));
  metrics.close().wait();
  ASSERT_TRUE(text.has_value());
  auto p = ProgressFromMetrics(*text);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->global_step, 1200);
  EXPECT_EQ(p->target_steps, 3750);
  EXPECT_DOUBLE_EQ(*p->loss, 0.4125);
  EXPECT_DOUBLE_EQ(*p->accuracy, 0.8712);
}

TEST(ProgressTest, NothingListeningIsNoProgress) {
  EXPECT_FALSE(ScrapeMetrics("127.0.0.1", FreePort(), absl::Milliseconds(500)).has_value());
}

}  // namespace
}  // namespace kubetrain
