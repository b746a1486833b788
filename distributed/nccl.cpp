// NCCL gradient communicator (see nccl.h).
#include "distributed/nccl.h"

#include <cstdlib>
#include <string>

#include "tensor/error.h"

#if defined(QKV_WITH_CUDA) && defined(QKV_WITH_MPI)
#include <cuda_runtime.h>
#include <nccl.h>

#include "tensor/cuda/cuda_backend.h"
#include "tensor/dynamic_library.h"
#endif

namespace qkv::dist {

#if defined(QKV_WITH_CUDA) && defined(QKV_WITH_MPI)

bool built_with_nccl() { return true; }

namespace {

// The NCCL entry points qkv calls, resolved from libnccl at first use.
struct NcclApi {
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
};

const NcclApi& nccl() {
  static const NcclApi api = [] {
    const char* what = "[nccl] libnccl";
    void* lib = open_first_library({"libnccl.so.2", "libnccl.so"}, what);
    NcclApi a;
    resolve_symbol(lib, "ncclGetUniqueId", &a.get_unique_id, what);
    resolve_symbol(lib, "ncclCommInitRank", &a.comm_init_rank, what);
    resolve_symbol(lib, "ncclAllReduce", &a.all_reduce, what);
    resolve_symbol(lib, "ncclBroadcast", &a.broadcast, what);
    resolve_symbol(lib, "ncclGroupStart", &a.group_start, what);
    resolve_symbol(lib, "ncclGroupEnd", &a.group_end, what);
    resolve_symbol(lib, "ncclCommDestroy", &a.comm_destroy, what);
    resolve_symbol(lib, "ncclGetErrorString", &a.error_string, what);
    return a;
  }();
  return api;
}

void check(ncclResult_t r, const char* call) {
  if (r != ncclSuccess) fail("[nccl] ", call, " failed: ", nccl().error_string(r));
}

void check_cuda(cudaError_t e, const char* call) {
  if (e != cudaSuccess) fail("[nccl] ", call, " failed: ", cudaGetErrorString(e));
}

class NcclGradients final : public Communicator {
 public:
  explicit NcclGradients(Communicator& host) : host_(host) {
    const int devices = cuda::device_count();
    QKV_CHECK(devices > 0, "[nccl] no CUDA device is visible on rank ", host.rank());
    int local = host.rank();
    if (const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) local = std::atoi(v);
    check_cuda(cudaSetDevice(local % devices), "cudaSetDevice");
    ncclUniqueId id{};
    if (host.is_root()) check(nccl().get_unique_id(&id), "ncclGetUniqueId");
    host.broadcast(&id, sizeof(id), 0);
    check(nccl().comm_init_rank(&comm_, host.world(), id, host.rank()), "ncclCommInitRank");
  }
  ~NcclGradients() override {
    if (comm_) nccl().comm_destroy(comm_);
  }
  const char* backend() const override { return "nccl"; }
  int rank() const override { return host_.rank(); }
  int world() const override { return host_.world(); }

  // Device memory: enqueued on the default stream, after the kernels that wrote the gradients.
  void allreduce_sum(float* data, int64_t n) override {
    allreduce_sum_start(data, n);
    wait_all();
  }
  void allreduce_sum_start(float* data, int64_t n) override {
    check(nccl().all_reduce(data, data, static_cast<size_t>(n), ncclFloat32, ncclSum, comm_, nullptr), "ncclAllReduce");
  }
  void wait_all() override { check_cuda(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize"); }
  // Device memory, in place: rank r broadcasts its part (NCCL has no all-gather of unequal parts);
  // the broadcasts form one group, and the call returns once the data is there.
  void gradient_allgatherv(float* data, std::span<const int64_t> counts) override {
    QKV_CHECK(static_cast<int>(counts.size()) == world(), "[nccl] gradient_allgatherv: ", counts.size(), " counts for ",
              world(), " ranks");
    check(nccl().group_start(), "ncclGroupStart");
    int64_t at = 0;
    for (int r = 0; r < world(); ++r) {
      float* part = data + at;
      check(nccl().broadcast(part, part, static_cast<size_t>(counts[r]), ncclFloat32, r, comm_, nullptr),
            "ncclBroadcast");
      at += counts[r];
    }
    check(nccl().group_end(), "ncclGroupEnd");
    wait_all();
  }

  // Host memory: the MPI group.
  void allreduce_sum(double* data, int64_t n) override { host_.allreduce_sum(data, n); }
  void broadcast(void* data, int64_t bytes, int root) override { host_.broadcast(data, bytes, root); }
  void allgather(const void* send, void* recv, int64_t bytes) override { host_.allgather(send, recv, bytes); }
  void allgatherv(float* data, std::span<const int64_t> counts) override { host_.allgatherv(data, counts); }
  void gatherv(const float* send, float* recv, std::span<const int64_t> counts, int root) override {
    host_.gatherv(send, recv, counts, root);
  }
  void barrier() override { host_.barrier(); }
  [[noreturn]] void abort(const std::string& message, int code) override {
    host_.abort(message, code);
    std::_Exit(code);  // the host group's abort does not return; this keeps [[noreturn]] honest
  }

 private:
  Communicator& host_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_gradients(Communicator& host) { return std::make_unique<NcclGradients>(host); }

#else

bool built_with_nccl() { return false; }

std::unique_ptr<Communicator> make_nccl_gradients(Communicator&) {
  fail("[nccl] this build has no NCCL path (it needs both CUDA and MPI: configure with -DQKV_CUDA=ON -DQKV_MPI=ON)");
}

#endif

}  // namespace qkv::dist
