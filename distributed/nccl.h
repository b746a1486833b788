// NCCL for the gradient all-reduce of data-parallel training on GPUs: one rank per GPU, the
// NCCL communicator bootstrapped through the job's MPI group (rank 0 makes the unique id and
// broadcasts it). It is a dist::Communicator whose float all-reduces take DEVICE pointers and run
// on the device's one stream (the training stream, so they are ordered with backward's kernels);
// every other collective (scalars, metrics, checks: host memory) is passed to the MPI group.
// libnccl is opened with dlopen when the first rank needs it, like cuBLAS.
#pragma once
#include <memory>

#include "distributed/distributed.h"

namespace qkv::dist {

// True when this build can use NCCL (CUDA and MPI both built in).
bool built_with_nccl();

// Selects this rank's GPU (local rank modulo the visible devices; OMPI_COMM_WORLD_LOCAL_RANK
// when the launcher sets it) and creates the NCCL communicator over `host`'s ranks. Collective.
// Throws naming the reason when NCCL cannot be used (no CUDA/MPI in this build, library missing).
std::unique_ptr<Communicator> make_nccl_gradients(Communicator& host);

}  // namespace qkv::dist
