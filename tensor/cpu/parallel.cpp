#include "tensor/cpu/parallel.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace qkv::cpu {
namespace {

thread_local bool t_is_helper = false;
thread_local SplitTrace t_trace;  // the calling thread's last run_split

class SplitPool {
 public:
  // Returns how many helpers joined.
  int run(int64_t chunks, int threads, const std::function<void(int64_t)>& fn) {
    std::unique_lock<std::mutex> lk(mu_);
    if (busy_) {  // another thread's split is running: do ours alone rather than queue behind it
      lk.unlock();
      for (int64_t c = 0; c < chunks; ++c) fn(c);
      return 0;
    }
    busy_ = true;
    while (static_cast<int>(helpers_.size()) < threads - 1) helpers_.emplace_back([this] { helper_loop(); });
    fn_ = &fn;
    chunks_ = chunks;
    next_.store(0, std::memory_order_relaxed);
    want_ = threads - 1;
    joined_ = 0;
    open_ = true;
    ++gen_;
    lk.unlock();
    if (want_ == 1) wake_.notify_one();
    else wake_.notify_all();
    claim_all();
    lk.lock();
    open_ = false;  // a helper that wakes from now on goes back to sleep without touching fn
    idle_.wait(lk, [this] { return active_ == 0; });  // only helpers that joined: they are running
    fn_ = nullptr;
    busy_ = false;
    return joined_;
  }

 private:
  void claim_all() {
    for (int64_t c; (c = next_.fetch_add(1, std::memory_order_relaxed)) < chunks_;) (*fn_)(c);
  }

  void helper_loop() {
    t_is_helper = true;
    std::unique_lock<std::mutex> lk(mu_);
    uint64_t seen = 0;
    for (;;) {
      wake_.wait(lk, [&] { return open_ && gen_ != seen && joined_ < want_; });
      seen = gen_;
      ++joined_;
      ++active_;
      lk.unlock();
      claim_all();  // fn_ and chunks_ stay valid: the caller waits for active_ == 0
      lk.lock();
      if (--active_ == 0 && !open_) idle_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::vector<std::thread> helpers_;  // never joined: the pool lives as long as the process
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t chunks_ = 0;
  std::atomic<int64_t> next_{0};
  uint64_t gen_ = 0;
  int want_ = 0, joined_ = 0, active_ = 0;
  bool open_ = false, busy_ = false;
};

SplitPool& pool() {
  static auto* p = new SplitPool();  // never destroyed: helpers sleep in it until the process exits
  return *p;
}

}  // namespace

int split_threads(int64_t bytes, int max_threads) {
  const int64_t by_size = std::max<int64_t>(1, bytes / kSplitBytesPerThread);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(max_threads, by_size)));
}

void run_split(int64_t chunks, int threads, const std::function<void(int64_t)>& fn) {
  threads = static_cast<int>(std::min<int64_t>(threads, chunks));
  if (threads <= 1 || t_is_helper || omp_in_parallel()) {
    t_trace = {1, 0};
    for (int64_t c = 0; c < chunks; ++c) fn(c);
    return;
  }
  t_trace = {threads, 0};
  t_trace.helpers_joined = pool().run(chunks, threads, fn);
}

SplitTrace last_split_trace() { return t_trace; }

OmpThreadsGuard::OmpThreadsGuard() : previous_(omp_get_max_threads()) {}
OmpThreadsGuard::OmpThreadsGuard(int threads) : previous_(omp_get_max_threads()) { omp_set_num_threads(threads); }
OmpThreadsGuard::~OmpThreadsGuard() { omp_set_num_threads(previous_); }

}  // namespace qkv::cpu
