#include "core/testing/counting_new.h"

#include <cstdlib>
#include <new>

namespace {
thread_local bool counting = false;
thread_local long calls = 0;
}  // namespace

void* operator new(std::size_t n) {
  if (counting) ++calls;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace kubetrain {

long CountNewCalls(const std::function<void()>& fn) {
  calls = 0;
  counting = true;
  fn();
  counting = false;
  return calls;
}

}  // namespace kubetrain
