// qkv: the command line. Thin: parses, calls the library, prints.
#include <cstdio>
#include <iostream>

#include "app/commands.h"
#include "tensor/cuda/cuda_backend.h"
#include "tensor/error.h"

namespace qkv::app {
void print_json(const nlohmann::json& j) { std::cout << j.dump() << std::endl; }

Device device_option(const std::string& name) {
  QKV_CHECK(name == "cpu" || name == "cuda", "--device must be cpu or cuda, got '", name, "'");
  if (name == "cpu") return Device::cpu;
  QKV_CHECK(cuda::device_count() > 0, "--device cuda: no CUDA device is visible (or this build has no CUDA backend)");
  return Device::cuda;
}
}  // namespace qkv::app

int main(int argc, char** argv) {
  CLI::App app{"qkv: train and study decoder-only Transformers (tensors, autograd and attention written by hand)"};
  app.require_subcommand(1);
  int exit_code = 0;
  qkv::app::add_train_command(app, exit_code);
  qkv::app::add_sample_command(app, exit_code);
  qkv::app::add_eval_command(app, exit_code);
  qkv::app::add_gradcheck_command(app, exit_code);
  qkv::app::add_prepare_command(app, exit_code);
  qkv::app::add_plot_command(app, exit_code);
  qkv::app::add_bench_command(app, exit_code);
  qkv::app::add_inspect_command(app, exit_code);
  qkv::app::add_leakcheck_command(app, exit_code);
  qkv::app::add_attention_map_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  } catch (const qkv::Error& e) {
    std::fprintf(stderr, "qkv: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qkv: error: %s\n", e.what());
    return 2;
  }
  return exit_code;
}
