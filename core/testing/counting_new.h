// Counts the global operator new calls a piece of code makes on its own
// thread: the counting-allocator tests of "no allocation per step"
// (ps/push_alloc_test.cc, ps/sparse_push_alloc_test.cc). Linking this library
// replaces the global operator new/delete of the test binary (malloc/free
// underneath); only the calling thread's calls inside CountNewCalls count.
#ifndef KUBETRAIN_CORE_TESTING_COUNTING_NEW_H_
#define KUBETRAIN_CORE_TESTING_COUNTING_NEW_H_

#include <functional>

namespace kubetrain {

// Runs `fn` and returns how many times it called operator new (or new[]) on
// this thread. `fn` itself is built by the caller, before counting starts.
long CountNewCalls(const std::function<void()>& fn);

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_TESTING_COUNTING_NEW_H_
