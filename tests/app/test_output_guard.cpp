// Outputs written over inputs (train/output_paths.h): the checker on its own (identity through
// symbolic and hard links, files inside an input directory, existing files and --force,
// directories that are or contain an input, the parent directory in the way), then every writing
// command of the CLI aimed at one of its own inputs: exit 2, one stderr line naming the option,
// and the input unchanged byte for byte.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint_test_util.h"
#include "train/config.h"
#include "train/output_paths.h"
#include "build_dir.h"

using namespace qkv;
using namespace qkv::ckpt_test;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using train::OutputGuard;

namespace {

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

}  // namespace

TEST_CASE("an output that is an input through a symbolic or hard link is refused naming both", "[outputs]") {
  TempDir dir;
  const std::string ckpt = dir.file("a.h5"), sym = dir.file("sym.h5"), hard = dir.file("hard.h5");
  write_text(ckpt, "weights");
  fs::create_symlink(ckpt, sym);
  fs::create_hard_link(ckpt, hard);
  OutputGuard g;
  g.add_input("--checkpoint", ckpt);
  for (const bool force : {false, true}) {
    CHECK(error_of([&] { g.check_file("--out", ckpt, {.replace = force}); }) ==
          "--out " + ckpt + " is the input --checkpoint " + ckpt);
    CHECK(error_of([&] { g.check_file("--out", sym, {.replace = force}); }) ==
          "--out " + sym + " is the input --checkpoint " + ckpt);
    CHECK(error_of([&] { g.check_file("--out", hard, {.replace = force}); }) ==
          "--out " + hard + " is the input --checkpoint " + ckpt);
  }
  // The same through a path spelt another way.
  const std::string other = (dir.path / "." / "a.h5").string();
  CHECK_THAT(error_of([&] { g.check_file("--out", other); }), StartsWith("--out " + other + " is the input"));
  // An input given as a link: the file it leads to is the input.
  OutputGuard via_link;
  via_link.add_input("--metrics", sym);
  CHECK(error_of([&] { via_link.check_file("--out", ckpt, {.replace = true}); }) ==
        "--out " + ckpt + " is the input --metrics " + sym);
  // A new file beside the input is fine.
  CHECK(error_of([&] { g.check_file("--out", dir.file("new.h5")); }) == "(no error)");
}

TEST_CASE("an existing file inside an input directory is refused even with --force; a new one is not", "[outputs]") {
  TempDir dir;
  const std::string hf = dir.file("hf");
  fs::create_directories(hf + "/sub");
  write_text(hf + "/model.safetensors", "w");
  write_text(hf + "/sub/notes.txt", "n");
  OutputGuard g;
  g.add_input("--from", hf);
  for (const bool force : {false, true}) {
    CHECK(error_of([&] { g.check_file("--out", hf + "/model.safetensors", {.replace = force}); }) ==
          "--out " + hf + "/model.safetensors is a file inside the input --from " + hf +
              "; write it outside that directory");
    CHECK_THAT(error_of([&] { g.check_file("--out", hf + "/sub/notes.txt", {.replace = force}); }),
               StartsWith("--out " + hf + "/sub/notes.txt is a file inside the input --from " + hf));
  }
  CHECK(error_of([&] { g.check_file("--out", hf + "/imported.h5"); }) == "(no error)");
  // The directory itself as a file output.
  CHECK(error_of([&] { g.check_file("--out", hf, {.replace = true}); }) ==
        "--out " + hf + " is the input --from " + hf);

  // add_input_files_in names the file itself (a hard link outside the directory is caught too).
  OutputGuard files;
  files.add_input_files_in("--from", hf);
  fs::create_hard_link(hf + "/model.safetensors", dir.file("elsewhere.safetensors"));
  CHECK(error_of([&] { files.check_file("--out", dir.file("elsewhere.safetensors"), {.replace = true}); }) ==
        "--out " + dir.file("elsewhere.safetensors") + " is the input --from " + hf + "/model.safetensors");
}

TEST_CASE("an existing output file needs --force; a directory, a dangling link or a missing parent is refused",
          "[outputs]") {
  TempDir dir;
  const std::string png = dir.file("x.png");
  write_text(png, "old");
  const OutputGuard g;
  CHECK(error_of([&] { g.check_file("--out", png); }) == "--out " + png + " exists; pass --force to replace it");
  CHECK(error_of([&] { g.check_file("--out", png, {.replace = true}); }) == "(no error)");
  CHECK(error_of([&] { g.check_file("--out", dir.file("y.png")); }) == "(no error)");

  fs::create_symlink(dir.file("nowhere"), dir.file("dangling.png"));
  CHECK(error_of([&] { g.check_file("--out", dir.file("dangling.png")); }) ==
        "--out " + dir.file("dangling.png") + " exists; pass --force to replace it");

  CHECK(error_of([&] { g.check_file("--grid", dir.path.string(), {.replace = true}); }) ==
        "--grid " + dir.path.string() + " is a directory; give a file path");
  // A file where a directory of the path should be.
  CHECK(error_of([&] { g.check_file("--out", png + "/a/b.png"); }) ==
        "--out " + png + "/a/b.png: " + png + " is a file, not a directory");
  CHECK(error_of([&] { g.check_file("--out", png + "/a/b.png", {.make_parents = true}); }) ==
        "--out " + png + "/a/b.png: " + png + " is a file, not a directory");
  CHECK(error_of([&] { g.check_file("--out", dir.file("no/such/b.png")); }) ==
        "--out " + dir.file("no/such/b.png") + ": directory " + dir.file("no/such") + " does not exist");
  CHECK(error_of([&] { g.check_file("--plot", dir.file("no/such/b.png"), {.make_parents = true}); }) == "(no error)");
  if (::geteuid() != 0) {  // root writes anywhere: a read-only directory cannot be made for it
    fs::create_directories(dir.file("ro"));
    fs::permissions(dir.file("ro"), fs::perms::owner_read | fs::perms::owner_exec);
    CHECK(error_of([&] { g.check_file("--out", dir.file("ro/x.png")); }) ==
          "--out " + dir.file("ro/x.png") + ": cannot write in " + dir.file("ro") + " (Permission denied)");
    fs::permissions(dir.file("ro"), fs::perms::owner_all);
  }
}

TEST_CASE("an output directory that is or contains an input, or is a file, is refused", "[outputs]") {
  TempDir dir;
  const std::string run = dir.file("run"), ckpt = dir.file("run/nested/best.h5");
  fs::create_directories(run + "/nested");
  write_text(ckpt, "weights");
  OutputGuard g;
  g.add_input("--checkpoint", ckpt);
  const train::OutputRule report{.replace = true, .make_parents = true};
  CHECK(error_of([&] { g.check_dir("--report", run, report); }) ==
        "--report " + run + " contains the input --checkpoint " + ckpt);
  CHECK(error_of([&] { g.check_dir("--report", run + "/nested/", report); }) ==
        "--report " + run + "/nested/ contains the input --checkpoint " + ckpt);
  CHECK(error_of([&] { g.check_dir("--report", dir.path.string(), report); }) ==
        "--report " + dir.path.string() + " contains the input --checkpoint " + ckpt);
  CHECK(error_of([&] { g.check_dir("--report", ckpt, report); }) ==
        "--report " + ckpt + " is the input --checkpoint " + ckpt);
  // A symbolic link to the directory holding the input is that directory.
  fs::create_directory_symlink(run, dir.file("link"));
  CHECK(error_of([&] { g.check_dir("--report", dir.file("link"), report); }) ==
        "--report " + dir.file("link") + " contains the input --checkpoint " + ckpt);

  OutputGuard by_dir;
  by_dir.add_input("--from", run);
  CHECK(error_of([&] { by_dir.check_dir("--out", run); }) == "--out " + run + " is the input --from " + run);

  // Neither is nor contains: a sibling directory may exist (a report) or must be new (export).
  fs::create_directories(dir.file("other"));
  CHECK(error_of([&] { g.check_dir("--report", dir.file("other"), report); }) == "(no error)");
  CHECK(error_of([&] { g.check_dir("--out", dir.file("other")); }) ==
        "--out " + dir.file("other") + " already exists; choose a directory that does not");
  CHECK(error_of([&] { g.check_dir("--out", dir.file("fresh")); }) == "(no error)");
  CHECK(error_of([&] { g.check_dir("--report", run + "/nested/inner", report); }) == "(no error)");
  write_text(dir.file("plain"), "x");
  CHECK(error_of([&] { g.check_dir("--report", dir.file("plain"), report); }) ==
        "--report " + dir.file("plain") + " is a file, not a directory");
  CHECK(error_of([&] { g.check_dir("--out", dir.file("plain") + "/sub"); }) ==
        "--out " + dir.file("plain") + "/sub: " + dir.file("plain") + " is a file, not a directory");
  CHECK(error_of([&] { g.check_dir("--out", dir.file("a/b")); }) ==
        "--out " + dir.file("a/b") + ": directory " + dir.file("a") + " does not exist");
  CHECK(error_of([&] { g.check_dir("--report", dir.file("a/b"), report); }) == "(no error)");
}

// ---- the CLI ----

namespace {

const std::string kQkv = std::string(QKV_BINARY_DIR) + "/qkv";

struct Cli {
  int rc = -1;
  std::string out, err;
};

Cli run_qkv(const TempDir& dir, const std::string& args) {
  const std::string base = dir.file("cli");
  const int rc = std::system((kQkv + " " + args + " >" + base + ".out 2>" + base + ".err").c_str());
  Cli r;
  r.rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  const auto out = read_bytes(base + ".out"), err = read_bytes(base + ".err");
  r.out.assign(out.begin(), out.end());
  r.err.assign(err.begin(), err.end());
  return r;
}

// `args` exits 2 with the one line "qkv: <expected>", and every file in `inputs` keeps its bytes.
void expect_refused(const TempDir& dir, const std::string& args, const std::string& expected,
                    const std::vector<std::string>& inputs) {
  std::vector<std::vector<char>> before;
  for (const auto& f : inputs) before.push_back(read_bytes(f));
  const Cli r = run_qkv(dir, args);
  INFO("qkv " << args << "\nstderr: " << r.err);
  CHECK(r.rc == 2);
  CHECK(r.err == "qkv: " + expected + "\n");
  for (size_t i = 0; i < inputs.size(); ++i) {
    INFO("input " << inputs[i]);
    CHECK(!before[i].empty());
    CHECK(read_bytes(inputs[i]) == before[i]);
  }
}

// A checkpoint (char tokenizer over kCorpus) whose config names `corpus` as data.path.
std::string tiny_checkpoint(const TempDir& dir, const std::string& corpus) {
  Run r = make_run("gpt2");
  r.cfg.data.path = corpus;
  const std::string path = dir.file("tiny.h5");
  save(r, path);
  return path;
}

bool have_cli() {
  if (fs::exists(kQkv)) return true;
  WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
  return false;
}

}  // namespace

TEST_CASE("qkv import refuses --out onto its own files or an existing checkpoint", "[outputs][cli]") {
  if (!have_cli()) return;
  TempDir dir;
  // A copy of the committed fixture: a failure here must not damage the original.
  const std::string hf = dir.file("hf");
  fs::copy(std::string(QKV_SOURCE_DIR) + "/tests/reference/hf/gpt2_tiny", hf, fs::copy_options::recursive);
  const std::string weights = hf + "/model.safetensors", config = hf + "/config.json";
  for (const std::string force : {"", " --force"}) {
    expect_refused(dir, "import --from " + hf + " --out " + weights + force,
                   "--out " + weights + " is the input --from " + weights, {weights, config});
    expect_refused(dir, "import --from " + hf + " --out " + config + force,
                   "--out " + config + " is the input --from " + config, {weights, config});
  }
  // Through a symbolic link placed outside the directory.
  fs::create_symlink(weights, dir.file("w.h5"));
  expect_refused(dir, "import --from " + hf + " --out " + dir.file("w.h5") + " --force",
                 "--out " + dir.file("w.h5") + " is the input --from " + weights, {weights});

  // An existing checkpoint needs --force, and then is replaced.
  const std::string ckpt = tiny_checkpoint(dir, "");
  expect_refused(dir, "import --from " + hf + " --out " + ckpt, "--out " + ckpt + " exists; pass --force to replace it",
                 {ckpt});
  const Cli forced = run_qkv(dir, "import --from " + hf + " --out " + ckpt + " --force");
  INFO(forced.err);
  REQUIRE(forced.rc == 0);
  CHECK(train::read_checkpoint_meta(ckpt).config.model.block_size == 32);  // gpt2_tiny's n_positions, not tiny.h5's 16
}

TEST_CASE("qkv prepare and qkv plot refuse --out onto their input", "[outputs][cli]") {
  if (!have_cli()) return;
  TempDir dir;
  const std::string text = dir.file("corpus.txt");
  write_text(text, kCorpus);
  for (const std::string force : {"", " --force"})
    expect_refused(dir, "prepare --input " + text + " --tokenizer char --out " + text + force,
                   "--out " + text + " is the input --input " + text, {text});
  fs::create_hard_link(text, dir.file("hard.h5"));
  expect_refused(dir, "prepare --input " + text + " --tokenizer char --out " + dir.file("hard.h5") + " --force",
                 "--out " + dir.file("hard.h5") + " is the input --input " + text, {text});
  // --tokenizer-from a checkpoint is an input too.
  const std::string ckpt = tiny_checkpoint(dir, text);
  expect_refused(dir, "prepare --input " + text + " --tokenizer-from " + ckpt + " --out " + ckpt + " --force",
                 "--out " + ckpt + " is the input --tokenizer-from " + ckpt, {ckpt, text});
  // An existing data file needs --force.
  const std::string h5 = dir.file("data.h5");
  REQUIRE(run_qkv(dir, "prepare --input " + text + " --tokenizer char --out " + h5).rc == 0);
  expect_refused(dir, "prepare --input " + text + " --tokenizer char --out " + h5,
                 "--out " + h5 + " exists; pass --force to replace it", {h5});
  CHECK(run_qkv(dir, "prepare --input " + text + " --tokenizer char --out " + h5 + " --force").rc == 0);

  const std::string metrics = dir.file("metrics.jsonl");
  write_text(metrics, "{\"step\": 1, \"loss\": 2.5}\n{\"step\": 2, \"loss\": 2.25}\n");
  for (const std::string force : {"", " --force"})
    expect_refused(dir, "plot --metrics " + metrics + " --out " + metrics + force,
                   "--out " + metrics + " is the input --metrics " + metrics, {metrics});
  const std::string svg = dir.file("loss.svg");
  write_text(svg, "<svg/>");
  expect_refused(dir, "plot --metrics " + metrics + " --out " + svg,
                 "--out " + svg + " exists; pass --force to replace it", {svg, metrics});
  const Cli forced = run_qkv(dir, "plot --metrics " + metrics + " --out " + svg + " --force");
  INFO(forced.err);
  CHECK(forced.rc == 0);
  CHECK(read_bytes(svg).size() > 100);
}

TEST_CASE("qkv attention-map refuses --out or --grid onto its checkpoint or its corpus", "[outputs][cli]") {
  if (!have_cli()) return;
  TempDir dir;
  const std::string corpus = dir.file("corpus.txt");
  write_text(corpus, kCorpus);
  const std::string ckpt = tiny_checkpoint(dir, corpus);
  const std::string base = "attention-map --checkpoint " + ckpt + " --text 'It was the best' ";
  const std::string png = dir.file("map.png");
  for (const std::string force : {"", " --force"}) {
    expect_refused(dir, base + "--out " + ckpt + force, "--out " + ckpt + " is the input --checkpoint " + ckpt,
                   {ckpt, corpus});
    expect_refused(dir, base + "--out " + png + " --grid " + ckpt + force,
                   "--grid " + ckpt + " is the input --checkpoint " + ckpt, {ckpt, corpus});
    expect_refused(dir, base + "--out " + png + " --grid " + corpus + force,
                   "--grid " + corpus + " is the input data.path " + corpus, {ckpt, corpus});
  }
  CHECK_FALSE(fs::exists(png));  // refused before anything was written
  expect_refused(dir, base + "--out " + png + " --grid " + png,
                 "--grid " + png + " is the same file as --out " + png + "; give two paths", {ckpt});
  REQUIRE(run_qkv(dir, base + "--out " + png).rc == 0);
  expect_refused(dir, base + "--out " + png, "--out " + png + " exists; pass --force to replace it", {png});
  CHECK(run_qkv(dir, base + "--out " + png + " --force").rc == 0);
}

TEST_CASE("qkv export refuses an --out that is, contains or blocks its checkpoint, in one line", "[outputs][cli]") {
  if (!have_cli()) return;
  TempDir dir;
  const std::string ckpt = tiny_checkpoint(dir, "");
  const std::string base = "export --checkpoint " + ckpt + " --out ";
  expect_refused(dir, base + ckpt, "--out " + ckpt + " is the input --checkpoint " + ckpt, {ckpt});
  expect_refused(dir, base + dir.path.string(),
                 "--out " + dir.path.string() + " contains the input --checkpoint " + ckpt, {ckpt});
  const std::string file = dir.file("plain.txt");
  write_text(file, "x");
  expect_refused(dir, base + file, "--out " + file + " is a file, not a directory", {file, ckpt});
  expect_refused(dir, base + file + "/hf", "--out " + file + "/hf: " + file + " is a file, not a directory",
                 {file, ckpt});
  expect_refused(dir, base + dir.file("no/hf"),
                 "--out " + dir.file("no/hf") + ": directory " + dir.file("no") + " does not exist", {ckpt});
  fs::create_directories(dir.file("taken"));
  expect_refused(dir, base + dir.file("taken"),
                 "--out " + dir.file("taken") + " already exists; choose a directory that does not", {ckpt});
  CHECK(run_qkv(dir, base + dir.file("fresh")).rc == 0);
}

TEST_CASE("leakcheck, heads and study refuse a --report that is or contains an input; train --plot its inputs",
          "[outputs][cli]") {
  if (!have_cli()) return;
  TempDir dir;
  const std::string corpus = dir.file("corpus.txt");
  std::string text;
  for (int i = 0; i < 40; ++i) text += std::string(kCorpus) + "\n";  // enough for train and val windows
  write_text(corpus, text);
  const std::string ckpt = tiny_checkpoint(dir, corpus);
  const std::string root = dir.path.string();

  expect_refused(dir, "leakcheck --checkpoint " + ckpt + " --report " + root,
                 "--report " + root + " contains the input --checkpoint " + ckpt, {ckpt, corpus});
  expect_refused(dir, "leakcheck --checkpoint " + ckpt + " --report " + corpus,
                 "--report " + corpus + " is the input data.path " + corpus, {ckpt, corpus});
  expect_refused(dir, "heads --checkpoint " + ckpt + " --data " + corpus + " --report " + corpus,
                 "--report " + corpus + " is the input --data " + corpus, {ckpt, corpus});
  expect_refused(dir, "heads --checkpoint " + ckpt + " --data " + corpus + " --report " + root,
                 "--report " + root + " contains the input --checkpoint " + ckpt, {ckpt, corpus});

  // study and train: a config over the corpus, in a directory of its own.
  fs::create_directories(dir.file("cfg"));
  Config c = make_run("gpt2").cfg;
  c.data.path = corpus;
  c.data.separator = DocSeparator::none;
  c.train.max_steps = 2;
  c.train.out_dir = dir.file("run");
  const std::string toml = dir.file("cfg/base.toml");
  write_text(toml, to_toml(c));
  expect_refused(dir, "study --config " + toml + " --variants full --report " + dir.file("cfg"),
                 "--report " + dir.file("cfg") + " contains the input --config " + toml, {toml});
  expect_refused(dir, "study --config " + toml + " --variants full --report " + root,
                 "--report " + root + " contains the input --config " + toml, {toml, corpus});
  CHECK_FALSE(fs::exists(dir.file("run")));

  // OUT_DIR/loss.svg is a link to the corpus: refused before any training.
  fs::create_directories(dir.file("run"));
  fs::create_symlink(corpus, dir.file("run/loss.svg"));
  expect_refused(dir, "train --config " + toml + " --plot --quiet",
                 "--plot " + dir.file("run/loss.svg") + " is the input data.path " + corpus, {corpus, toml});
  CHECK_FALSE(fs::exists(dir.file("run/metrics.jsonl")));
  fs::remove(dir.file("run/loss.svg"));
  const Cli trained = run_qkv(dir, "train --config " + toml + " --plot --quiet");
  INFO(trained.err);
  CHECK(trained.rc == 0);
  CHECK(read_bytes(dir.file("run/loss.svg")).size() > 100);
}
