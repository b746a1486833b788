// qkv_example_reverse: trains nn::EncoderDecoder (bidirectional encoder, decoder with causal
// self-attention and cross-attention) to reverse random strings of 1-8 symbols with padding, and
// prints the held-out exact-sequence accuracy as it goes (examples/reverse_task.h has the task).
//   build/qkv_example_reverse [--steps N] [--seed S] [--threads T]
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "examples/reverse_task.h"

using namespace qkv;

int main(int argc, char** argv) {
  examples::ReverseTask task;
  examples::ReverseTrainOptions o;
  int threads = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--steps" && has_value) {
      o.steps = std::atoll(argv[++i]);
    } else if (a == "--seed" && has_value) {
      o.seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--threads" && has_value) {
      threads = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "qkv_example_reverse: unknown or incomplete argument '%s' (--steps N, --seed S, --threads T)\n",
                   a.c_str());
      return 2;
    }
  }
  if (o.steps <= 0 || threads <= 0) {
    std::fprintf(stderr, "qkv_example_reverse: --steps and --threads must be > 0\n");
    return 2;
  }
  omp_set_num_threads(threads);
  nn::EncoderDecoderConfig cfg;
  cfg.vocab_size = task.vocab();
  cfg.max_len = task.max_len + 1;
  nn::EncoderDecoder model(cfg);
  model.init_weights(o.seed);
  std::printf("reverse strings of %lld-%lld symbols (alphabet %lld): encoder-decoder, %lld parameters, %d threads\n",
              static_cast<long long>(task.min_len), static_cast<long long>(task.max_len),
              static_cast<long long>(task.alphabet), static_cast<long long>(model.parameter_count()), threads);
  std::fflush(stdout);
  const auto rep = examples::train_reverse(model, task, o, [](int64_t step, double loss, double acc) {
    std::printf("step %5lld  loss %.4f  held-out exact-sequence accuracy %.1f%%\n", static_cast<long long>(step), loss,
                100 * acc);
    std::fflush(stdout);
  });
  std::printf("final: %.1f%% of %lld held-out strings reversed exactly after %lld steps, %.1f s\n", 100 * rep.accuracy,
              static_cast<long long>(o.heldout), static_cast<long long>(rep.steps), rep.seconds);
  return rep.accuracy >= o.target_accuracy ? 0 : 1;
}
