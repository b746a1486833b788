// `qkv train` with one fault the tests need: rank 1 of a multi-rank job leaves with _Exit(1),
// without finalising MPI, just before it runs step STEP (a crashed node, as far as the others
// can tell). Test-only: the fault goes in through TrainOptions::before_step, so the qkv binary
// itself has no such switch. tests/distributed/test_distributed_mpi.cpp launches it under mpirun.
//
//   qkv_rank_dies_at_step STEP CONFIG [KEY=VALUE ...]
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "distributed/distributed.h"
#include "train/config.h"
#include "train/trainer.h"

int main(int argc, char** argv) {
  using namespace qkv;
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s STEP CONFIG [KEY=VALUE ...]\n", argv[0]);
    return 2;
  }
  const long long die_at = std::atoll(argv[1]);
  dist::init(&argc, &argv);
  dist::Communicator& comm = dist::world();
  try {
    const Config cfg = parse_config(argv[2], std::vector<std::string>(argv + 3, argv + argc));
    train::TrainOptions o;
    o.progress = false;
    o.before_step = [&comm, die_at](int64_t step) {
      if (comm.world() < 2 || comm.rank() != 1 || step != die_at) return;
      std::fprintf(stderr, "qkv_rank_dies_at_step: rank 1 exits with status 1 before step %lld\n", die_at);
      std::fflush(stderr);
      std::_Exit(1);
    };
    train::run_training(cfg, o);
  } catch (const std::exception& e) {
    if (comm.world() > 1) comm.abort(e.what(), 2);
    std::fprintf(stderr, "qkv: %s\n", e.what());
    dist::finalize();
    return 2;
  }
  dist::finalize();
  return 0;
}
