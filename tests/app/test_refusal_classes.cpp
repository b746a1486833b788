// The classes of input qkv used to answer with exit 0 and a plausible result, each now refused in
// one line naming the culprit, or answered exactly and said so: degenerate sizes, an option given
// without the one it acts with, text that is not text, an output directory another command or a
// run owns, and messages that named the wrong thing (or nothing).
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "app/commands.h"
#include "data/tokenizer.h"
#include "data/utf8.h"
#include "tensor/error.h"
#include "train/config.h"
#include "train/output_paths.h"
#include "build_dir.h"

using namespace qkv;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

struct Run {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A scratch directory of its own, removed at the end of the test case.
struct Scratch {
  fs::path dir;
  explicit Scratch(const std::string& name)
      : dir(fs::temp_directory_path() / ("qkv_refusal_classes_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string path(const std::string& name) const { return (dir / name).string(); }
};

// `qkv ARGS` run from the source tree (configs/ and data/ are relative to it); ARGS is shell text.
Run qkv_cli(const std::string& args) {
  const fs::path base = fs::temp_directory_path() / ("qkv_refusal_classes_" + std::to_string(::getpid()));
  const std::string out = base.string() + ".out", err = base.string() + ".err";
  const std::string cmd = std::string("cd ") + QKV_SOURCE_DIR + " && " + QKV_BINARY_DIR + "/qkv " + args + " >" + out +
                          " 2>" + err + " </dev/null";
  const int rc = std::system(cmd.c_str());
  Run r{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, slurp(out), slurp(err)};
  fs::remove(out);
  fs::remove(err);
  return r;
}

bool have_binary() {
  if (fs::exists(std::string(QKV_BINARY_DIR) + "/qkv")) return true;
  WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
  return false;
}

// A refusal: exit 2 and one stderr line holding every one of `names`.
void check_refused(const Run& r, std::initializer_list<std::string> names) {
  INFO("rc " << r.rc << ", stderr: " << r.err);
  CHECK(r.rc == 2);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  for (const std::string& n : names) CHECK(r.err.find(n) != std::string::npos);
}

}  // namespace

TEST_CASE("a zero size or count is refused naming the option", "[refusals][cli]") {
  if (!have_binary()) return;
  // Options are read before any file is opened: no config or checkpoint needs to exist.
  for (const auto& [args, option] : std::vector<std::pair<std::string, std::string>>{
           {"cost --config x.toml --context 0", "--context"},
           {"cost --config x.toml --vocab 0", "--vocab"},
           {"heads --checkpoint x.h5 --data y.txt --length 0", "--length"},
           {"bench --what attention --hkv 0", "--hkv"},
           {"bench --what attention --pattern strided --pattern-stride 0", "--pattern-stride"},
           {"bench --threads 0", "--threads"},
           {"study --config x.toml --variants full --budget-tokens 0", "--budget-tokens"},
           {"study --config x.toml --variants full --lengths 0", "--lengths"},
           {"study --config x.toml --variants window:0", "--variants"},
       }) {
    INFO(args);
    check_refused(qkv_cli(args), {option});
  }
}

TEST_CASE("an option that only acts with another is refused alone, naming the one it needs", "[refusals][cli]") {
  if (!have_binary()) return;
  Scratch s("alone");
  std::ofstream(s.path("in.txt")) << "some text to tokenize\n";
  for (const auto& [args, names] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"bench --what step --config configs/tiny.toml --pattern-stride 4",
            {"--pattern-stride", "--what attention"}},
           {"bench --what attention --pattern window --pattern-stride 4", {"--pattern-stride", "--pattern strided"}},
           {"bench --what attention --pattern strided --linear-feature relu", {"--linear-feature", "--pattern linear"}},
           {"bench --what attention --rounds 3", {"--rounds", "--versus-full"}},
           {"bench --what gemm --config configs/tiny.toml --tokens 8", {"--tokens", "--what decode"}},
           {"cost --config configs/tiny.toml --set model.vocab_size=100 --vocab 50", {"--vocab", "model.vocab_size"}},
           {"prepare --input " + s.path("in.txt") + " --out " + s.path("o.h5") +
                " --tokenizer char --bpe-vocab-size 300",
            {"--bpe-vocab-size", "--tokenizer bpe"}},
           {"gradcheck --seed 3", {"--seed", "--config"}},
           {"heads --checkpoint x.h5 --data y.txt --force", {"--force", "--report"}},
           {"sample --checkpoint x.h5 --batch-size 2", {"--batch-size", "--prompts"}},
       }) {
    INFO(args);
    const Run r = qkv_cli(args);
    INFO("rc " << r.rc << ", stderr: " << r.err);
    CHECK(r.rc == 2);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    for (const std::string& n : names) CHECK(r.err.find(n) != std::string::npos);
  }
  CHECK_FALSE(fs::exists(s.path("o.h5")));
}

TEST_CASE("text that is not UTF-8 is kept exactly by the char tokenizer, and prepare says where it stops being text",
          "[tokenizer][cli]") {
  const std::string binary("ab\0c\xFF\xC3\xA9z\xE2\x82", 10);  // NUL, a stray byte, é, a cut-off €
  CHECK(first_non_text_byte("plain caf\xC3\xA9\n") == std::string_view::npos);
  CHECK(first_non_text_byte(binary) == 2);
  CHECK(first_non_text_byte(binary.substr(3)) == 1);  // 0xFF
  CHECK(first_non_text_byte(binary.substr(5)) == 3);  // the € cut short at the end
  CHECK(first_non_text_byte("\xC0\x80") == 0);        // an overlong NUL is not UTF-8
  const auto tok = make_tokenizer(TokenizerKind::character, binary, {});
  CHECK(tok->decode(tok->encode(binary)) == binary);  // lossless, as docs/config.md says
  if (!have_binary()) return;
  Scratch s("text");
  std::ofstream(s.path("bin.txt"), std::ios::binary) << binary;
  const Run r = qkv_cli("prepare --input " + s.path("bin.txt") + " --out " + s.path("bin.h5") + " --tokenizer char");
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK_THAT(r.err, Contains(s.path("bin.txt") + " is not UTF-8 text: byte 0x00 at byte offset 2"));
  // Plain text: no word.
  std::ofstream(s.path("plain.txt")) << "plain caf\xC3\xA9\n";
  const Run plain =
      qkv_cli("prepare --input " + s.path("plain.txt") + " --out " + s.path("plain.h5") + " --tokenizer char");
  CHECK(plain.rc == 0);
  CHECK(plain.err.find("not UTF-8") == std::string::npos);
}

TEST_CASE("a BPE vocabulary the corpus cannot reach is reported with both sizes", "[tokenizer][cli]") {
  if (!have_binary()) return;
  Scratch s("bpe");
  std::ofstream(s.path("small.txt")) << "the cat sat on the mat; the cat sat on the hat\n";
  const Run r = qkv_cli("prepare --input " + s.path("small.txt") + " --out " + s.path("small.h5") +
                        " --tokenizer bpe --bpe-vocab-size 5000 --json");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  const size_t at = r.out.find("\"vocab_size\":");
  REQUIRE(at != std::string::npos);
  const int got = std::stoi(r.out.substr(at + 13));
  CHECK(got < 5000);
  CHECK_THAT(r.err, Contains("asked for a BPE vocabulary of 5000 tokens, the corpus gives " + std::to_string(got)));
}

TEST_CASE("a report directory holding what its command did not write is refused unless --force", "[refusals][output]") {
  Scratch s("owner");
  const std::string run = s.path("run"), fresh = s.path("fresh"), mine = s.path("mine");
  fs::create_directories(run);
  std::ofstream(run + "/metrics.jsonl") << "{}\n";  // a training run's folder
  train::OutputGuard guard;
  const train::OutputRule study{.make_parents = true, .owner = "study"};
  CHECK_THROWS_WITH(
      guard.check_dir("--report", run, study),
      Contains("--report " + run + " holds metrics.jsonl, which qkv study did not write") && Contains("--force"));
  CHECK_NOTHROW(guard.check_dir("--report", run, {.replace = true, .make_parents = true, .owner = "study"}));
  CHECK_NOTHROW(guard.check_dir("--report", fresh, study));  // not there yet
  fs::create_directories(fresh);
  CHECK_NOTHROW(guard.check_dir("--report", fresh, study));  // there, empty
  train::mark_output_dir(mine, "study");
  std::ofstream(mine + "/index.html") << "<html></html>";
  CHECK_NOTHROW(guard.check_dir("--report", mine, study));  // study's own: its next run rewrites it
  CHECK_THROWS_WITH(guard.check_dir("--report", mine, {.make_parents = true, .owner = "heads"}),
                    Contains("which qkv heads did not write"));
  if (!have_binary()) return;
  // The commands, before they train or load anything.
  check_refused(qkv_cli("study --config configs/tiny.toml --variants full --report " + run), {"--report", run});
  check_refused(qkv_cli("leakcheck --config configs/tiny.toml --report " + run), {"--report", run});
  CHECK(slurp(run + "/metrics.jsonl") == "{}\n");
  CHECK(fs::directory_iterator(run) != fs::directory_iterator());
  CHECK_FALSE(fs::exists(run + "/index.html"));
}

TEST_CASE("messages name what is at fault: a mistyped command, an empty path, a negative global position",
          "[refusals][cli]") {
  // The did-you-mean, in-process on the parser qkv builds.
  CLI::App app;
  int exit_code = 0;
  app::add_all_commands(app, exit_code);
  CHECK(app::unknown_command(app, "trian") ==
        "unknown command 'trian' (did you mean 'train'?); `qkv --help` lists the commands");
  CHECK(app::unknown_command(app, "xyzzy") == "unknown command 'xyzzy'; `qkv --help` lists the commands");
  CHECK_FALSE(app::unknown_command(app, "train"));
  CHECK_FALSE(app::unknown_command(app, "--help"));

  CHECK_THROWS_WITH(
      parse_config_text("", "x.toml", {"model.attention_pattern=global", "model.pattern_global_tokens=0,-3"}),
      Contains("model.pattern_global_tokens") && Contains("-3 is negative"));
  if (!have_binary()) return;
  check_refused(qkv_cli("trian --config configs/tiny.toml"), {"unknown command 'trian'", "did you mean 'train'"});
  check_refused(qkv_cli("inspect ''"), {"empty path"});
}

TEST_CASE(
    "prepare --tokenizer-from reads a Hugging Face tokenizer folder without config.json, or names what is missing",
    "[tokenizer][cli]") {
  if (!have_binary()) return;
  Scratch s("hf");
  std::ofstream(s.path("in.txt")) << "Hello world, hello tokenizer.\n";
  // What tokenizer.save_pretrained writes for GPT-2: vocab.json, merges.txt, tokenizer.json.
  const std::string hf = std::string(QKV_SOURCE_DIR) + "/tests/reference/gpt2_bpe";
  const Run ok =
      qkv_cli("prepare --input " + s.path("in.txt") + " --out " + s.path("o.h5") + " --tokenizer-from " + hf);
  INFO(ok.err);
  CHECK(ok.rc == 0);
  CHECK_THAT(ok.out, Contains("gpt2_bpe tokenizer"));
  fs::create_directories(s.path("empty_hf"));
  check_refused(qkv_cli("prepare --input " + s.path("in.txt") + " --out " + s.path("p.h5") + " --tokenizer-from " +
                        s.path("empty_hf")),
                {s.path("empty_hf"), "tokenizer.json", "vocab.json + merges.txt"});
}
