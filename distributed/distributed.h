// Process groups for data-parallel training: the few collectives the trainer needs, behind one
// small interface so the transport can change without touching the training loop.
//
//   SingleProcess  world = 1: every collective is the identity (or a copy). Used by builds
//                  without MPI and by any process not started by an MPI launcher.
//   MPI            (QKV_WITH_MPI) one rank per process over MPI_COMM_WORLD, started by
//                  `mpirun -np N qkv train ...`; the host-memory transport.
//   NCCL           (distributed/nccl.h, CUDA + MPI builds) one rank per GPU for the gradient buckets:
//                  float all-reduces on device pointers, queued on the training stream, with the
//                  ncclUniqueId sent to every rank by an MPI broadcast; host-memory collectives
//                  go to the MPI group. DataParallel takes it as its gradient communicator.
//
// Determinism. allreduce_sum's result is the same bits on every rank, and the same bits run to
// run for a fixed world size and call sequence (OpenMPI picks its algorithm from the message
// size and world size only; every algorithm it has reduces each element once along a fixed
// schedule and sends the result, or sums commutative pairs symmetrically). sum_ordered() goes
// further for scalars: it gathers every rank's value and adds them in rank order, so it does not
// depend on the library at all. The trainer uses it for losses, counts and norms.
//
// Faults. A collective never returns an error: MPI's default handler aborts the job, and a rank
// that dies makes the launcher end the others. abort() prints one line naming the rank and ends
// every rank (MPI_Abort), so an exception on one rank cannot leave the others waiting forever.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace qkv::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual const char* backend() const = 0;  // "single" | "mpi"
  virtual int rank() const = 0;
  virtual int world() const = 0;

  // In place: data[i] <- sum over ranks of data[i]. Long buffers are sent in pieces the
  // transport can count (MPI counts are int), always cut at the same places.
  virtual void allreduce_sum(float* data, int64_t n) = 0;
  virtual void allreduce_sum(double* data, int64_t n) = 0;
  // The same sum, started without waiting: the result (the same bits allreduce_sum would give,
  // see Determinism) is in data after wait_all(); data must not be touched before. Every rank
  // must start the same calls in the same order. Transports without it finish the call here.
  virtual void allreduce_sum_start(float* data, int64_t n) { allreduce_sum(data, n); }
  // Lets started calls advance (MPI moves data only inside library calls); cheap, non-blocking.
  virtual void progress() {}
  // Completes every started call.
  virtual void wait_all() {}
  // root's `bytes` bytes at data are copied to every rank's data.
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  // Every rank sends `bytes` bytes; recv (world * bytes) holds them in rank order on every rank.
  virtual void allgather(const void* send, void* recv, int64_t bytes) = 0;
  // In place over a buffer of sum(counts) floats: rank r owns counts[r] elements starting at
  // counts[0] + ... + counts[r-1]; afterwards every rank (allgatherv) or only root (gatherv)
  // holds every rank's part. counts.size() must be world().
  virtual void allgatherv(float* data, std::span<const int64_t> counts) = 0;
  // The same on the memory the float all-reduces take: the host's here, the GPU's for NCCL (the
  // row tree's blocks of invariant training).
  virtual void gradient_allgatherv(float* data, std::span<const int64_t> counts) { allgatherv(data, counts); }
  // Rank r sends counts[r] floats from `send`; on root, recv (sum(counts) floats) receives them
  // at the same offsets as allgatherv (send may already sit at its place in recv). recv is not
  // touched on other ranks and may be null there.
  virtual void gatherv(const float* send, float* recv, std::span<const int64_t> counts, int root) = 0;
  virtual void barrier() = 0;
  // Prints "qkv: rank R/N: message" (or "qkv: message" for one process) on stderr and ends the
  // whole job with exit status `code`. Never returns.
  [[noreturn]] virtual void abort(const std::string& message, int code) = 0;

  bool is_root() const { return rank() == 0; }

  // Sum of one value per rank, added in rank order (0, 1, ..., N-1): identical bits on every rank
  // and run to run, whatever the transport's algorithms.
  double sum_ordered(double v);
  int64_t sum_ordered(int64_t v);
  // Each rank's value, in rank order.
  std::vector<uint64_t> gather_all(uint64_t v);
};

class SingleProcess final : public Communicator {
 public:
  const char* backend() const override { return "single"; }
  int rank() const override { return 0; }
  int world() const override { return 1; }
  void allreduce_sum(float*, int64_t) override {}
  void allreduce_sum(double*, int64_t) override {}
  void broadcast(void*, int64_t, int) override {}
  void allgather(const void* send, void* recv, int64_t bytes) override;
  void allgatherv(float*, std::span<const int64_t>) override {}
  void gatherv(const float* send, float* recv, std::span<const int64_t> counts, int root) override;
  void barrier() override {}
  [[noreturn]] void abort(const std::string& message, int code) override;
};

// True when this build can use MPI (compiled with QKV_WITH_MPI).
bool built_with_mpi();
// True when an MPI launcher started this process (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK
// is set). A plain `qkv train` in an MPI build does not initialise MPI at all, so it behaves
// exactly as a build without MPI.
bool launched_by_mpi();

// Initialises the process group once per process: MPI (MPI_Init_thread, funneled: only the main
// thread calls MPI; OpenMP threads compute) when built with MPI and launched by mpirun, else the
// single-process group. Throws when launched by mpirun in a build without MPI and world > 1,
// since N independent single-process runs would silently overwrite each other's files.
void init(int* argc, char*** argv);
// MPI_Finalize when init() started MPI; harmless otherwise. Call once, after the last collective.
void finalize();
// The process group init() set up; the single-process group when init() was not called.
Communicator& world();

// Ends the job unless `value` is the same on every rank (collective). Rank 0 throws qkv::Error
// "<what> differs across ranks: rank R has H1 but rank 0 has H0"; the other ranks wait for the
// abort that error leads to (cmd_train turns it into abort()), so the message is printed once.
void check_same_on_all_ranks(Communicator& comm, uint64_t value, const std::string& what);

}  // namespace qkv::dist
