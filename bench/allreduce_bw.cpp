// Gradient all-reduce cost, measured through the communicator the trainer uses:
//   mpirun -np N build/qkv_bench_allreduce [parameters=10770816] [bucket_kib=4096] [reps=20]
// Reduces a float buffer of `parameters` elements in buckets of bucket_kib KiB, in order, as
// DataParallel::reduce_grads does (without the 1/N scaling pass), `reps` times after two warm-up
// rounds. Rank 0 prints the median time per step, the bytes each rank hands to all-reduce, and
// the "bus bandwidth" 2(N-1)/N * bytes / time (what a ring all-reduce moves per rank), which is
// the figure to compare with a link's bandwidth. The default size is config M's parameter count.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench/bench_args.h"
#include "distributed/data_parallel.h"
#include "distributed/distributed.h"

int main(int argc, char** argv) {
  using namespace qkv;
  // Read before MPI starts, so a bad argument exits without leaving a half-initialised world.
  const std::vector<long long> args = bench::positional_or_exit(
      argc, argv, "mpirun -np N qkv_bench_allreduce [parameters=10770816] [bucket_kib=4096] [reps=20]",
      {{"parameters", 10'770'816, 1ll << 33}, {"bucket_kib", 4096, 1 << 22}, {"reps", 20, 100000}});
  dist::init(&argc, &argv);
  dist::Communicator& comm = dist::world();
  const int64_t n = args[0];
  const int64_t bucket = args[1] * 1024 / 4;
  const int reps = static_cast<int>(args[2]);
  std::vector<float> buf(static_cast<size_t>(n), 1.0f + static_cast<float>(comm.rank()));
  const std::vector<int64_t> bounds = dist::bucket_bounds(n, bucket);
  std::vector<double> ms;
  for (int r = -2; r < reps; ++r) {
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t b = 0; b + 1 < bounds.size(); ++b)
      comm.allreduce_sum(buf.data() + bounds[b], bounds[b + 1] - bounds[b]);
    const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (r >= 0) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  if (comm.is_root() && !ms.empty()) {
    const double med = ms[ms.size() / 2], bytes = 4.0 * static_cast<double>(n), w = comm.world();
    std::printf(
        "{\"ranks\":%d,\"parameters\":%lld,\"buckets\":%zu,\"bytes\":%.0f,\"ms_median\":%.3f,\"ms_min\":%.3f,"
        "\"bus_GBps\":%.3f}\n",
        comm.world(), static_cast<long long>(n), bounds.size() - 1, bytes, med, ms.front(),
        2.0 * (w - 1) / w * bytes / (med * 1e-3) / 1e9);
  }
  dist::finalize();
  return 0;
}
