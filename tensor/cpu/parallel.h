// Splitting small, latency-bound ops (a decode step's matrix-vector products) over threads without
// ever waiting for a thread that is not running.
//
// An OpenMP region waits at its end for every thread of its team. On a machine whose cores are
// busy with other work, one of those threads may be descheduled for a whole time slice, and
// libgomp's default barrier spins meanwhile, so a decode step of ~50 short regions ran 2x slower
// with 2 threads than with 1 when another process held one of two cores. run_split() instead
// cuts the work into fixed chunks that threads claim from a shared counter: the calling thread
// starts at once and claims chunks until none are left; a helper that is woken late finds the
// counter exhausted and goes back to sleep. The caller waits only for chunks a helper has already
// claimed, and it waits asleep (condition variable), never spinning.
//
// Chunk boundaries depend only on the problem (never on the thread count) and every chunk is
// computed by the same code whichever thread runs it, so results are bitwise independent of the
// number of threads.
#pragma once
#include <cstdint>
#include <functional>

namespace qkv::cpu {

// Bytes a thread must stream through before another thread is worth waking (~50 µs of memory
// traffic on one core, several times a wake-up's cost).
constexpr int64_t kSplitBytesPerThread = int64_t(1) << 20;

// Threads worth using for a memory-bound pass over `bytes`: 1 below 2·kSplitBytesPerThread, at
// most max_threads (omp_get_max_threads(): OMP_NUM_THREADS, train.threads or --threads).
int split_threads(int64_t bytes, int max_threads);

// Calls fn(c) for every chunk c in [0, chunks), each exactly once, on the calling thread plus up to
// threads - 1 pool helpers (passive: they sleep between calls). Runs everything on the calling
// thread when threads <= 1, inside an OpenMP region, from a helper, or while another thread is
// using the pool. fn must not throw.
void run_split(int64_t chunks, int threads, const std::function<void(int64_t)>& fn);

// What the calling thread's last run_split call did (for tests): the threads it allowed (1 when it
// ran serially) and how many helpers woke while chunks were left.
struct SplitTrace {
  int threads = 0;         // threads the last call allowed
  int helpers_joined = 0;  // helpers that woke while chunks were left
};
SplitTrace last_split_trace();

// Runs the calling thread's OpenMP regions (and OpenBLAS's, which are OpenMP's) on `threads`
// threads for the guard's lifetime, then restores the count before. omp_set_num_threads sets the
// calling thread's count only (libgomp keeps it per thread), so other threads keep theirs. The
// default one changes nothing and restores the count at its end (around code that sets it).
class OmpThreadsGuard {
 public:
  OmpThreadsGuard();
  explicit OmpThreadsGuard(int threads);
  ~OmpThreadsGuard();
  OmpThreadsGuard(const OmpThreadsGuard&) = delete;
  OmpThreadsGuard& operator=(const OmpThreadsGuard&) = delete;

 private:
  int previous_;
};

}  // namespace qkv::cpu
