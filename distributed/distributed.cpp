// Process groups (see distributed.h): the single-process group, the MPI group, and the
// process-wide init/finalize around them.
//
// The MPI group uses only MPI-1/2 collectives on MPI_COMM_WORLD: MPI_Allreduce (in place),
// MPI_Bcast, MPI_Allgather, MPI_Allgatherv / MPI_Gatherv (in place). MPI counts are `int`, so
// buffers longer than kMaxCount elements go in fixed pieces of kMaxCount (the same pieces on every
// rank and every run, so the reduction order stays fixed). The default error handler
// (MPI_ERRORS_ARE_FATAL) is kept: a failed collective ends the job instead of returning.
#include "distributed/distributed.h"

#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "tensor/error.h"

#ifdef QKV_WITH_MPI
#include <mpi.h>
#endif

namespace qkv::dist {

double Communicator::sum_ordered(double v) {
  std::vector<double> all(static_cast<size_t>(world()));
  allgather(&v, all.data(), sizeof v);
  double s = 0;
  for (double x : all) s += x;
  return s;
}

int64_t Communicator::sum_ordered(int64_t v) {
  std::vector<int64_t> all(static_cast<size_t>(world()));
  allgather(&v, all.data(), sizeof v);
  return std::accumulate(all.begin(), all.end(), int64_t{0});
}

std::vector<uint64_t> Communicator::gather_all(uint64_t v) {
  std::vector<uint64_t> all(static_cast<size_t>(world()));
  allgather(&v, all.data(), sizeof v);
  return all;
}

void SingleProcess::allgather(const void* send, void* recv, int64_t bytes) {
  if (send != recv) std::memmove(recv, send, static_cast<size_t>(bytes));
}

void SingleProcess::gatherv(const float* send, float* recv, std::span<const int64_t> counts, int) {
  if (send != recv && !counts.empty()) std::memmove(recv, send, static_cast<size_t>(counts[0]) * sizeof(float));
}

void SingleProcess::abort(const std::string& message, int code) {
  std::fprintf(stderr, "qkv: %s\n", message.c_str());
  std::fflush(stderr);
  std::_Exit(code);
}

#ifdef QKV_WITH_MPI
namespace {

constexpr int64_t kMaxCount = int64_t{1} << 30;  // elements per MPI call (fits an int)

void check_counts(std::span<const int64_t> counts, int world, std::vector<int>& c, std::vector<int>& displ) {
  QKV_CHECK(static_cast<int>(counts.size()) == world, "[dist] ", counts.size(), " counts for ", world, " ranks");
  c.resize(counts.size());
  displ.resize(counts.size());
  int64_t at = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    QKV_CHECK(counts[r] >= 0 && counts[r] <= INT_MAX && at <= INT_MAX, "[dist] gather of ", counts[r],
              " elements at offset ", at, " exceeds MPI's int counts; gather in pieces");
    c[r] = static_cast<int>(counts[r]);
    displ[r] = static_cast<int>(at);
    at += counts[r];
  }
}

class MpiGroup final : public Communicator {
 public:
  MpiGroup() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_);
  }
  const char* backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int world() const override { return world_; }

  void allreduce_sum(float* data, int64_t n) override { allreduce(data, n, MPI_FLOAT); }
  void allreduce_sum(double* data, int64_t n) override { allreduce(data, n, MPI_DOUBLE); }
  void allreduce_sum_start(float* data, int64_t n) override {
    for (int64_t at = 0; at < n; at += kMaxCount) {
      requests_.emplace_back();
      MPI_Iallreduce(MPI_IN_PLACE, data + at, static_cast<int>(std::min(kMaxCount, n - at)), MPI_FLOAT, MPI_SUM,
                     MPI_COMM_WORLD, &requests_.back());
    }
  }
  void progress() override {
    if (requests_.empty()) return;
    int done = 0;
    MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE);
  }
  void wait_all() override {
    MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
    requests_.clear();
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    auto* p = static_cast<char*>(data);
    for (int64_t at = 0; at < bytes; at += kMaxCount)
      MPI_Bcast(p + at, static_cast<int>(std::min(kMaxCount, bytes - at)), MPI_BYTE, root, MPI_COMM_WORLD);
  }
  void allgather(const void* send, void* recv, int64_t bytes) override {
    QKV_CHECK(bytes <= INT_MAX, "[dist] allgather of ", bytes, " bytes per rank exceeds MPI's int counts");
    MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE, MPI_COMM_WORLD);
  }
  void allgatherv(float* data, std::span<const int64_t> counts) override {
    check_counts(counts, world_, counts_, displ_);
    MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, counts_.data(), displ_.data(), MPI_FLOAT, MPI_COMM_WORLD);
  }
  void gatherv(const float* send, float* recv, std::span<const int64_t> counts, int root) override {
    check_counts(counts, world_, counts_, displ_);
    if (rank_ != root)
      MPI_Gatherv(send, counts_[rank_], MPI_FLOAT, nullptr, nullptr, nullptr, MPI_FLOAT, root, MPI_COMM_WORLD);
    else if (send == recv + displ_[rank_])
      MPI_Gatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, counts_.data(), displ_.data(), MPI_FLOAT, root,
                  MPI_COMM_WORLD);
    else
      MPI_Gatherv(send, counts_[rank_], MPI_FLOAT, recv, counts_.data(), displ_.data(), MPI_FLOAT, root,
                  MPI_COMM_WORLD);
  }
  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
  [[noreturn]] void abort(const std::string& message, int code) override {
    std::fprintf(stderr, "qkv: rank %d/%d: %s\n", rank_, world_, message.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; this keeps [[noreturn]] honest
  }

 private:
  template <class T>
  void allreduce(T* data, int64_t n, MPI_Datatype type) {
    for (int64_t at = 0; at < n; at += kMaxCount)
      MPI_Allreduce(MPI_IN_PLACE, data + at, static_cast<int>(std::min(kMaxCount, n - at)), type, MPI_SUM,
                    MPI_COMM_WORLD);
  }
  int rank_ = 0, world_ = 1;
  std::vector<int> counts_, displ_;    // reused by the v-collectives
  std::vector<MPI_Request> requests_;  // started all-reduces (MPI_REQUEST_NULL once complete)
};

}  // namespace
#endif

namespace {
SingleProcess g_single;
Communicator* g_world = &g_single;
std::unique_ptr<Communicator> g_owned;
bool g_mpi_started = false;

// The launcher's world size, from its environment; 0 when it does not say.
[[maybe_unused]] int launcher_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return 0;
}
}  // namespace

bool built_with_mpi() {
#ifdef QKV_WITH_MPI
  return true;
#else
  return false;
#endif
}

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

void init(int* argc, char*** argv) {
  if (g_owned || !launched_by_mpi()) return;
#ifdef QKV_WITH_MPI
  int already = 0;
  MPI_Initialized(&already);
  if (!already) {
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    g_mpi_started = true;
  }
  g_owned = std::make_unique<MpiGroup>();
  g_world = g_owned.get();
#else
  const int n = launcher_world_size();
  QKV_CHECK(n <= 1, "this qkv was built without MPI but was started by an MPI launcher with ", n,
            " ranks; rebuild with -DQKV_MPI=ON (needs libopenmpi-dev) or run one process");
#endif
}

void finalize() {
#ifdef QKV_WITH_MPI
  if (g_mpi_started) {
    int done = 0;
    MPI_Finalized(&done);
    if (!done) MPI_Finalize();
    g_mpi_started = false;
  }
#endif
  g_world = &g_single;
  g_owned.reset();
}

Communicator& world() { return *g_world; }

void check_same_on_all_ranks(Communicator& comm, uint64_t value, const std::string& what) {
  if (comm.world() == 1) return;
  const std::vector<uint64_t> all = comm.gather_all(value);
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    if (comm.is_root()) {
      char h0[20], hr[20];
      std::snprintf(h0, sizeof h0, "%016llx", static_cast<unsigned long long>(all[0]));
      std::snprintf(hr, sizeof hr, "%016llx", static_cast<unsigned long long>(all[r]));
      fail(what, " differs across ranks: rank ", r, " has hash ", hr, " but rank 0 has ", h0);
    }
    comm.barrier();  // rank 0 never arrives: its error aborts the job
    fail(what, " differs across ranks (reported by rank 0)");
  }
}

}  // namespace qkv::dist
