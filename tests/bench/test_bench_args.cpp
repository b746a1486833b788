// The bench programs' positional arguments (bench/bench_args.h): defaults, bounds, junk, --help,
// and the exit a user sees from qkv_bench_tiles itself.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_args.h"
#include "build_dir.h"

using qkv::bench::parse_positional;

namespace {

qkv::bench::ParsedArgs parse(std::vector<std::string> args) {
  std::vector<char*> argv{const_cast<char*>("prog")};
  for (std::string& a : args) argv.push_back(a.data());
  return parse_positional(static_cast<int>(argv.size()), argv.data(), {{"D", 64, 1024}, {"repeats", 15, 100}});
}

}  // namespace

TEST_CASE("bench arguments: defaults where absent and the values given where valid", "[bench]") {
  CHECK(parse({}).values == std::vector<long long>{64, 15});
  CHECK(parse({"128"}).values == std::vector<long long>{128, 15});
  const auto r = parse({"1", "100"});
  CHECK(r.error.empty());
  CHECK(r.values == std::vector<long long>{1, 100});
}

TEST_CASE("bench arguments: zero or negative or junk or out of range or too many is an error naming the argument",
          "[bench]") {
  CHECK(parse({"0"}).error == "D must be an integer in [1, 1024], got '0'");
  CHECK(parse({"-3"}).error == "D must be an integer in [1, 1024], got '-3'");
  CHECK(parse({"64x"}).error == "D must be an integer in [1, 1024], got '64x'");
  CHECK(parse({""}).error == "D must be an integer in [1, 1024], got ''");
  CHECK(parse({"64", "101"}).error == "repeats must be an integer in [1, 100], got '101'");
  CHECK(parse({"99999999999999999999"}).error.rfind("D must be", 0) == 0);  // overflows strtoll
  CHECK(parse({"1", "2", "3"}).error == "takes at most 2 arguments, got 3");
  CHECK(parse({"7", "--help"}).help);
  CHECK(parse({"-h"}).help);
}

TEST_CASE("qkv_bench_tiles: a bad argument exits 2 with one line on stderr and --help exits 0", "[bench]") {
  namespace fs = std::filesystem;
  const std::string bin = std::string(QKV_BINARY_DIR) + "/qkv_bench_tiles";
  if (!fs::exists(bin)) {
    WARN("qkv_bench_tiles is not built in " << QKV_BINARY_DIR << ": not run");
    return;
  }
  const std::string err = (fs::temp_directory_path() / ("qkv_bench_args_" + std::to_string(::getpid()))).string();
  auto run = [&](const std::string& args) {
    const int rc = std::system((bin + " " + args + " >/dev/null 2>" + err).c_str());
    std::ifstream in(err);
    std::stringstream text;
    text << in.rdbuf();
    return std::make_pair(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, text.str());
  };
  const auto [rc_bad, msg] = run("0");
  CHECK(rc_bad == 2);
  CHECK(msg.find("D must be an integer in [1, 1024], got '0'") != std::string::npos);
  CHECK(std::count(msg.begin(), msg.end(), '\n') == 1);
  CHECK(run("--help").first == 0);
  std::filesystem::remove(err);
}
