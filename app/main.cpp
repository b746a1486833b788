// qkv: the command line. Thin: parses, calls the library, prints.
//
// The exit contract lives here, in one place: 0 success, 1 a check failed (the command prints
// its own JSON), 2 bad input or any other error. With `--json`, an error also ends stdout with
// {"error": "<the one-line message>", "exit": 2}, so a script always finds one JSON object as the
// last stdout line, whatever happened.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <new>
#include <stdexcept>
#include <string>

#include "app/commands.h"
#include "tensor/cpu/gemm/bf16_gemm.h"
#include "tensor/cpu/gemm/gemm.h"
#include "tensor/error.h"

namespace {

// Whether the command line asks for JSON. Read from argv rather than from the parser, because a
// parse error leaves the parser's view of the options incomplete.
bool json_requested(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) return false;
    if (std::strcmp(argv[i], "--json") == 0) return true;
  }
  return false;
}

// Prints the one-line error on stderr (and the error JSON on stdout with --json); returns 2.
int report_error(bool json, const char* prefix, const std::string& message) {
  std::fprintf(stderr, "qkv: %s%s\n", prefix, message.c_str());
  if (json) qkv::app::print_error_json(std::string(prefix) + message, 2);
  return 2;
}

// "out of memory while running `qkv train`: ...": the library's own text ("std::bad_alloc") says
// neither what ran nor what to do.
std::string out_of_memory(CLI::App& app, const char* what) {
  std::string command = "qkv";
  for (const CLI::App* sub : app.get_subcommands()) command += " " + sub->get_name();
  return "out of memory while running `" + command + "`: " + what +
         "; `qkv cost --config FILE` estimates what a config needs";
}

// libgomp reads its barrier wait policy once, when it is loaded (before main, so setenv here is
// too late), and by default spins ~300k iterations at every barrier before it sleeps. On a machine
// whose cores are busy, a thread then burns its time slice waiting for a partner that is not
// running: measured with a two-job build beside it, eval of a small model took 37 s on 2 threads
// and 9 s on 1, and the S training step 612 ms against 155 ms with a 1000-iteration spin. Unless the
// user chose a policy (OMP_WAIT_POLICY or GOMP_SPINCOUNT), qkv re-executes itself once with
// GOMP_SPINCOUNT=1000: a microsecond of spinning, then sleep. The benchmarks ran with the passive
// policy (spin 0) all along, so their figures hold. If the re-exec fails, qkv runs on as it is.
void use_short_openmp_spin(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (setenv("GOMP_SPINCOUNT", "1000", 1) != 0) return;
  execv("/proc/self/exe", argv);
}

}  // namespace

int main(int argc, char** argv) {
  use_short_openmp_spin(argv);
  CLI::App app{"qkv: train and study decoder-only Transformers (tensors, autograd and attention written by hand)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "qkv " QKV_VERSION);
  int exit_code = 0;
  qkv::app::add_all_commands(app, exit_code);
  const bool json = json_requested(argc, argv);
  if (argc > 1)
    if (const auto unknown = qkv::app::unknown_command(app, argv[1])) return report_error(json, "", *unknown);
  try {
    // QKV_GEMM and QKV_GEMM_BF16 (tensor/cpu/gemm/) are checked before any command reads or
    // writes anything.
    qkv::cpu::requested_gemm_kernel();
    qkv::cpu::requested_bf16_kernel();
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    return report_error(json, "", qkv::app::parse_error_line(app, e, argc, argv));
  } catch (const qkv::Error& e) { return report_error(json, "", e.what()); } catch (const std::bad_alloc&) {
    // The budget check (train/memory_budget.h) refuses models that cannot fit before they are
    // built; this is the last line for what it does not count (data, caches, process overhead).
    return report_error(json, "", out_of_memory(app, "a memory request failed"));
  } catch (const std::length_error&) {
    return report_error(json, "", out_of_memory(app, "a size exceeded what a container can hold"));
  } catch (const std::exception& e) { return report_error(json, "error: ", e.what()); }
  // Output that never reached its destination (a full disk behind a redirect) is an error too.
  std::cout.flush();
  if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "qkv: cannot write to standard output (%s)\n", std::strerror(errno));
    return 2;
  }
  return exit_code;
}
