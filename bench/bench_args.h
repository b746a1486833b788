// The positional arguments of the bench programs (qkv_bench_tiles, qkv_bench_gemm, qkv_bench_invariant,
// qkv_bench_allreduce): each a decimal integer in [1, max] with a default where it is absent.
// Anything else is a one-line error naming the argument and a non-zero exit; std::atoi read
// "--help" as 0, and qkv_bench_tiles then printed a table of NaN rates for D = 0.
#pragma once
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

namespace qkv::bench {

struct ArgSpec {
  const char* name;
  long long fallback, max;
};

struct ParsedArgs {
  std::vector<long long> values;  // one per spec
  std::string error;              // empty when every argument is valid
  bool help = false;              // -h or --help was given
};

// argv[1..] against `specs`, in order.
inline ParsedArgs parse_positional(int argc, char** argv, std::initializer_list<ArgSpec> specs) {
  ParsedArgs r;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) r.help = true;
  if (r.help) return r;
  if (argc - 1 > static_cast<int>(specs.size())) {
    r.error = "takes at most " + std::to_string(specs.size()) + " arguments, got " + std::to_string(argc - 1);
    return r;
  }
  int i = 1;
  for (const ArgSpec& s : specs) {
    if (i >= argc) {
      r.values.push_back(s.fallback);
      continue;
    }
    const char* text = argv[i++];
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < 1 || v > s.max) {
      r.error = std::string(s.name) + " must be an integer in [1, " + std::to_string(s.max) + "], got '" + text + "'";
      return r;
    }
    r.values.push_back(v);
  }
  return r;
}

// parse_positional for main(): prints `usage` and exits 0 on -h/--help, prints the error (one
// line, naming the program) and exits 2 on bad input.
inline std::vector<long long> positional_or_exit(int argc, char** argv, const char* usage,
                                                 std::initializer_list<ArgSpec> specs) {
  ParsedArgs r = parse_positional(argc, argv, specs);
  if (r.help) {
    std::printf("usage: %s\n", usage);
    std::exit(0);
  }
  if (!r.error.empty()) {
    std::fprintf(stderr, "%s: %s (usage: %s)\n", argv[0], r.error.c_str(), usage);
    std::exit(2);
  }
  return r.values;
}

}  // namespace qkv::bench
