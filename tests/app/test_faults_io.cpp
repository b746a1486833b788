// File and HDF5 faults: a full disk during any HDF5 write gives one line
// and exit 2 (HDF5 used to crash at exit, SIGSEGV), keeps the previous file and leaves no
// temporary; temporaries have unique names; pipes and FIFOs are refused, never
// hanging; a directory or FIFO as --config is refused; a checkpoint whose
// datasets are soft or external links is refused by name; `qkv inspect` verifies every
// dataset's checksum.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <hdf5.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "checkpoint_test_util.h"
#include "data/dataset.h"
#include "data/h5.h"
#include "data/h5_atomic.h"
#include "train/atomic_file.h"
#include "data/input_file.h"
#include "train/config.h"
#include "build_dir.h"

using namespace qkv;
using namespace qkv::train;
using namespace qkv::ckpt_test;
using Catch::Contains;

namespace {

std::set<std::string> files_in(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// Turns injected write failures off when a test ends, whatever happens in it.
struct InjectedFault {
  explicit InjectedFault(int64_t bytes) { h5::fail_writes_after(bytes); }
  ~InjectedFault() { h5::fail_writes_after(-1); }
};

// Files (not other objects) HDF5 still has open in this process: a write failure used to leave
// the failed file half-closed in HDF5's tables, which crashed at exit.
ssize_t open_hdf5_files() { return H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_FILE); }

std::string qkv_binary() { return std::string(QKV_BINARY_DIR) + "/qkv"; }
bool cli_available() {
  std::string out;
  return ::access(qkv_binary().c_str(), X_OK) == 0 && run_command(qkv_binary() + " --help >/dev/null 2>&1", out) == 0;
}

// Runs the CLI under `timeout` (a hang is status 124): its exit status and its stderr. With
// `file_limit_kib` > 0 it runs under that file-size limit (RLIMIT_FSIZE, `ulimit -f` in 512-byte
// blocks): a write past it fails with EFBIG ("File too large"), a real limit of the kernel where a
// full disk needs root (the tmpfs case below). SIGXFSZ, which would end the process instead, is
// ignored first, as `trap '' XFSZ` does for a shell user.
int run_qkv(const std::string& env_and_args, const std::string& dir, std::string& err, int64_t file_limit_kib = 0) {
  const std::string errfile = dir + "/stderr.txt";
  const std::string limit =
      file_limit_kib > 0 ? "trap '' XFSZ; ulimit -f " + std::to_string(2 * file_limit_kib) + "; " : "";
  std::string out;
  const int rc = run_command(limit + "timeout 60 env " + env_and_args + " >/dev/null 2>" + errfile, out);
  std::ifstream in(errfile);
  err.assign(std::istreambuf_iterator<char>(in), {});
  fs::remove(errfile);
  return rc;
}
std::string qkv_cmd(const std::string& args) { return qkv_binary() + " " + args; }

std::string corpus_text() {
  std::string text;
  for (int i = 0; i < 40; ++i) text += kCorpus;
  return text;
}

}  // namespace

// ---- 1. a full disk ----

TEST_CASE("a checkpoint save that runs out of disk space at any point throws one line and leaves the previous file",
          "[faults][io][checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("ckpt_10.h5");
  Run first = make_run("gpt2");
  save(first, path);
  const std::vector<char> first_bytes = read_bytes(path);
  const auto size = static_cast<int64_t>(first_bytes.size());
  Run second = make_run("gpt2", 32, 2, 99);
  second.state.step = 20;
  // A save with `budget` bytes of space left: its error message ("(no error)" when it fits).
  auto save_with_space = [&](int64_t budget) {
    InjectedFault fault(budget);
    return error_of([&] { save(second, path); });
  };
  // The fewest bytes a save needs (HDF5 leaves some gaps unwritten, and rewrites a little).
  int64_t lo = 0, hi = 4 * size;  // fails with lo, fits in hi
  REQUIRE(save_with_space(hi) == "(no error)");
  save(first, path);
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    (save_with_space(mid) == "(no error)" ? hi : lo) = mid;
    save(first, path);
  }
  const int64_t needed = hi;
  CHECK(needed > size / 2);
  // From the first byte (the superblock) to the very last (the metadata HDF5 writes at close).
  for (const int64_t budget :
       {int64_t{0}, int64_t{100}, int64_t{4096}, needed / 3, needed / 2, needed - 2000, needed - 100, needed - 1}) {
    INFO("the disk fills after " << budget << " of the " << needed << " bytes a save writes");
    const std::string msg = save_with_space(budget);
    CHECK_THAT(msg,
               Contains("[h5] " + path + ".tmp.") && Contains("cannot write") && Contains("No space left on device"));
    CHECK(msg.find('\n') == std::string::npos);
    CHECK(read_bytes(path) == first_bytes);
    CHECK(files_in(dir.path) == std::set<std::string>{"ckpt_10.h5"});
    CHECK(open_hdf5_files() == 0);
  }
  // With space again, the same process saves and loads normally.
  save(second, path);
  CHECK(read_checkpoint_meta(path).state.step == 20);
  CHECK_NOTHROW(load_everything(path));
  CHECK(files_in(dir.path) == std::set<std::string>{"ckpt_10.h5"});
}

TEST_CASE("a prepared dataset or data cache that runs out of disk space throws one line and leaves no file",
          "[faults][io][data]") {
  TempDir dir;
  const std::string txt = dir.file("corpus.txt"), out = dir.file("corpus.h5");
  std::ofstream(txt) << corpus_text();
  PrepareOptions o;
  o.tokenizer = TokenizerKind::character;
  for (const int64_t budget : {int64_t{0}, int64_t{3000}, int64_t{9000}}) {
    INFO("the disk fills after " << budget << " bytes");
    std::string msg;
    {
      InjectedFault fault(budget);
      msg = error_of([&] { prepare_dataset(txt, out, o); });
    }
    CHECK_THAT(msg, Contains(out + ".tmp.") && Contains("No space left on device"));
    CHECK(files_in(dir.path) == std::set<std::string>{"corpus.txt"});
    CHECK(open_hdf5_files() == 0);
    // load_or_prepare writes the same cache file through the same path.
    {
      InjectedFault fault(budget);
      msg = error_of([&] { load_or_prepare(txt, o, dir.path.string()); });
    }
    CHECK_THAT(msg, Contains("corpus.txt.char.h5.tmp.") && Contains("No space left on device"));
    CHECK(files_in(dir.path) == std::set<std::string>{"corpus.txt"});
  }
  const Dataset ds = load_or_prepare(txt, o, dir.path.string());
  CHECK(ds.train->size() + ds.val->size() == static_cast<int64_t>(corpus_text().size()));
  // A plain file written atomically (plots, PNGs) fails the same way.
  {
    InjectedFault fault(10);
    CHECK_THAT(error_of([&] { write_file_atomic(dir.file("plot.svg"), std::string(100, 'x')); }),
               Contains(dir.file("plot.svg")) && Contains("No space left on device"));
  }
  CHECK_FALSE(fs::exists(dir.file("plot.svg")));
}

TEST_CASE("qkv prepare and qkv train exit 2 with one line when a write meets the file-size limit (no SIGSEGV)",
          "[faults][io][cli]") {
  if (!cli_available()) {
    WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
    return;
  }
  TempDir dir;
  const std::string txt = dir.file("corpus.txt"), h5 = dir.file("corpus.h5");
  std::ofstream(txt) << corpus_text();
  std::string err;
  const std::string prepare = qkv_cmd("prepare --input " + txt + " --tokenizer char --out " + h5);
  CHECK(run_qkv(prepare, dir.path, err, 2) == 2);  // the prepared file is larger than 2 KiB
  CHECK_THAT(err, Contains("qkv: [h5] " + h5 + ".tmp.") && Contains("File too large"));
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  CHECK(files_in(dir.path) == std::set<std::string>{"corpus.txt"});
  REQUIRE(run_qkv(prepare, dir.path, err) == 0);

  // A run whose checkpoint save meets a full disk (the data is already prepared).
  Config cfg = tiny_config("gpt2");
  cfg.data.path = h5;
  cfg.train.batch_size = 2;
  cfg.train.max_steps = 2;
  cfg.train.eval_interval = 2;
  cfg.train.eval_batches = 1;
  cfg.train.out_dir = dir.file("run");
  std::ofstream(dir.file("run.toml")) << to_toml(cfg);
  // 64 KiB: the prepared data is read, metrics are written, the checkpoint (~300 KB) does not fit.
  REQUIRE(fs::file_size(h5) < 64 * 1024);
  CHECK(run_qkv(qkv_cmd("train --config " + dir.file("run.toml")), dir.path, err, 64) == 2);
  CHECK_THAT(err, Contains("File too large") && Contains(".h5.tmp."));
  for (const auto& e : fs::directory_iterator(dir.file("run")))
    CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
}

TEST_CASE("a real full file system (a small tmpfs) gives exit 2 and one line for prepare and checkpoints",
          "[faults][io][cli][tmpfs]") {
  if (!cli_available()) {
    WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
    return;
  }
  TempDir dir;
  const std::string mnt = dir.file("small_fs");
  fs::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=64k") != 0) {
    WARN("cannot mount a tmpfs (" << std::strerror(errno) << "; needs root): the real disk-full run is not checked");
    return;
  }
  struct Unmount {
    std::string at;
    ~Unmount() { ::umount2(at.c_str(), MNT_DETACH); }
  } unmount{mnt};

  const std::string txt = dir.file("big.txt");
  {
    std::ofstream f(txt);
    for (int i = 0; i < 3000; ++i) f << kCorpus;  // ~200 KB of tokens: more than fits
  }
  std::string err;
  CHECK(run_qkv(qkv_cmd("prepare --input " + txt + " --tokenizer char --out " + mnt + "/big.h5"), dir.path, err) == 2);
  CHECK_THAT(err, Contains(mnt + "/big.h5.tmp.") && Contains("No space left on device"));
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  CHECK(files_in(mnt).empty());

  // Checkpoints: prepared data outside, the run directory on the small file system.
  const std::string h5 = dir.file("corpus.h5"), small = dir.file("corpus.txt");
  std::ofstream(small) << corpus_text();
  REQUIRE(run_qkv(qkv_cmd("prepare --input " + small + " --tokenizer char --out " + h5), dir.path, err) == 0);
  Config cfg = tiny_config("gpt2", 64, 4);  // a ~0.9 MB checkpoint with its moments
  cfg.data.path = h5;
  cfg.train.batch_size = 2;
  cfg.train.max_steps = 1;
  cfg.train.eval_interval = 1;
  cfg.train.eval_batches = 1;
  cfg.train.out_dir = mnt + "/run";
  std::ofstream(dir.file("run.toml")) << to_toml(cfg);
  CHECK(run_qkv(qkv_cmd("train --config " + dir.file("run.toml")), dir.path, err) == 2);
  CHECK_THAT(err, Contains("No space left on device"));
  for (const auto& e : fs::recursive_directory_iterator(mnt))
    CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
}

// ---- 2. unique temporaries ----

TEST_CASE("temporaries get unique names: concurrent writers of one target never share one", "[faults][io]") {
  TempDir dir;
  const std::string target = dir.file("out.txt");
  std::set<std::string> names;
  for (int i = 0; i < 100; ++i) names.insert(temp_path_for(target));
  CHECK(names.size() == 100);
  CHECK_THAT(*names.begin(), Contains(target + ".tmp." + std::to_string(::getpid()) + "."));

  // Threads of one process (same pid) replacing the same file: every write succeeds and the file
  // always holds one writer's complete content.
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        try {
          write_file_atomic(target, std::string(5000 + t, static_cast<char>('a' + t)));
        } catch (const Error&) { ++failures; }
      }
    });
  for (auto& th : threads) th.join();
  CHECK(failures == 0);
  const std::vector<char> got = read_bytes(target);
  REQUIRE(got.size() >= 5000);
  const int t = static_cast<int>(got.size()) - 5000;
  CHECK(got == std::vector<char>(5000 + t, static_cast<char>('a' + t)));
  CHECK(files_in(dir.path) == std::set<std::string>{"out.txt"});

  // Two HDF5 writers of one target at once: each has its own temporary; the last commit wins.
  const std::string h5path = dir.file("ckpt.h5");
  {
    h5::AtomicWriter a(h5path), b(h5path);
    CHECK(a.temp_path() != b.temp_path());
    a.file().write("/v", std::vector<int32_t>{1, 2, 3});
    b.file().write("/v", std::vector<int32_t>{4, 5});
    a.commit();
    b.commit();
  }
  CHECK(h5::File::open(h5path).read<int32_t>("/v") == std::vector<int32_t>{4, 5});
  CHECK(files_in(dir.path) == std::set<std::string>{"out.txt", "ckpt.h5"});
}

// ---- 3. pipes and FIFOs ----

TEST_CASE("eval and training data through a FIFO are refused before it is opened", "[faults][io][data]") {
  TempDir dir;
  const std::string fifo = dir.file("data.fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto tok = CharTokenizer::train(kCorpus);
  // Nobody writes into the FIFO: a reader that opened it would block; the refusal comes first.
  CHECK_THAT(error_of([&] { load_eval_tokens(fifo, *tok); }), Contains(fifo) && Contains("not a regular file"));
  PrepareOptions o;
  o.tokenizer = TokenizerKind::character;
  CHECK_THAT(error_of([&] { load_or_prepare(fifo, o, dir.file("cache")); }),
             Contains(fifo) && Contains("not a regular file"));
  CHECK_FALSE(fs::exists(dir.file("cache/data.fifo.char.h5")));
}

TEST_CASE("qkv eval --data <(cat f) is refused; FIFOs as checkpoint or config are refused, not hung",
          "[faults][io][cli]") {
  if (!cli_available()) {
    WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
    return;
  }
  TempDir dir;
  const std::string txt = dir.file("corpus.txt"), ckpt = dir.file("ckpt.h5"), fifo = dir.file("x.fifo");
  std::ofstream(txt) << corpus_text();
  Run r = make_run("gpt2");
  save(r, ckpt);
  // A pipe is not a regular file: refused, whatever it carries (text or an HDF5 file).
  const std::string eval = qkv_binary() + " eval --json --checkpoint " + ckpt + " --data ";
  std::string err;
  for (const std::string& carried : {txt, ckpt}) {
    CHECK(run_command("bash -c '" + eval + "<(cat " + carried + ") 2>&1 >/dev/null'", err) == 2);
    CHECK_THAT(err, Contains("is a pipe or FIFO, not a regular file"));
  }

  // Nobody ever writes into these FIFOs: anything that opens one blocks; `timeout` gives 124.
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(run_qkv(qkv_cmd("inspect " + fifo), dir.path, err) == 2);
  CHECK_THAT(err, Contains(fifo) && Contains("not a regular file"));
  CHECK(run_qkv(qkv_cmd("eval --checkpoint " + fifo + " --data " + txt), dir.path, err) == 2);
  CHECK_THAT(err, Contains(fifo) && Contains("not a regular file"));
  CHECK(run_qkv(qkv_cmd("train --config " + fifo), dir.path, err) == 2);
  CHECK_THAT(err, Contains(fifo) && Contains("not a regular file"));
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
}

// ---- 4. --config DIR ----

TEST_CASE("a directory or other non-regular file as the config is refused naming it", "[faults][io][config]") {
  TempDir dir;
  const std::string d = dir.file("configs");
  fs::create_directories(d);
  CHECK_THAT(error_of([&] { parse_config(d); }), Contains(d + ": is a directory, not a config file"));
  CHECK_THAT(error_of([&] { parse_config("/dev/null"); }), Contains("/dev/null: not a regular file"));
  CHECK_THAT(error_of([&] { parse_config(dir.file("missing.toml")); }),
             Contains(dir.file("missing.toml") + ": cannot open config file"));
  // A regular file past the cap (sparse: nothing is written) is refused before it is read.
  const std::string huge = dir.file("huge.toml");
  { std::ofstream(huge) << "[train]\n"; }
  fs::resize_file(huge, kConfigFileCap + 1);
  CHECK_THAT(error_of([&] { parse_config(huge); }),
             Contains(huge + ": is " + std::to_string(kConfigFileCap + 1) + " bytes, over the " +
                      std::to_string(kConfigFileCap) + "-byte limit for config file"));
  if (cli_available()) {
    std::string err;
    CHECK(run_qkv(qkv_cmd("train --config " + d), dir.path, err) == 2);
    CHECK_THAT(err, Contains(d) && Contains("is a directory"));
  }
}

// ---- 5. links inside a checkpoint ----

TEST_CASE("a checkpoint whose datasets are soft or external links is refused naming the link",
          "[faults][io][checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("ckpt.h5"), other = dir.file("other.h5");
  Run r = make_run("gpt2");
  save(r, path);
  Run o = make_run("gpt2", 32, 2, 99);
  save(o, other);
  const std::string bad = dir.file("bad.h5");
  // Replaces link `name` of a copy of the checkpoint with what `make_link` creates.
  auto relink = [&](const std::string& name, const std::function<herr_t(hid_t)>& make_link) {
    fs::copy_file(path, bad, fs::copy_options::overwrite_existing);
    h5::quiet();
    const hid_t f = H5Fopen(bad.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(f >= 0);
    REQUIRE(H5Ldelete(f, name.c_str(), H5P_DEFAULT) >= 0);
    REQUIRE(make_link(f) >= 0);
    REQUIRE(H5Fclose(f) >= 0);
  };
  auto model = build_model(r.cfg, r.tok->vocab_size());
  const auto before = snapshot(*model);

  SECTION("a soft link from one layer's tensor to another's (same shape: it used to load silently)") {
    relink("/model/transformer.h.1.ln_1.weight", [](hid_t f) {
      return H5Lcreate_soft("/model/transformer.h.0.ln_1.weight", f, "/model/transformer.h.1.ln_1.weight", H5P_DEFAULT,
                            H5P_DEFAULT);
    });
    const std::string msg = error_of([&] { load_model_weights(bad, *model); });
    CHECK_THAT(msg,
               Contains(bad) &&
                   Contains("/model/transformer.h.1.ln_1.weight is a soft link to /model/transformer.h.0.ln_1.weight"));
    CHECK(same_weights(*model, before));
    CHECK_THAT(error_of([&] { list_model_tensors(bad); }), Contains("soft link"));
    CHECK_THAT(error_of([&] { verify_checkpoint_data(bad); }), Contains("soft link"));
  }
  SECTION("an external link pulling a tensor from another file") {
    relink("/model/transformer.wte.weight", [&](hid_t f) {
      return H5Lcreate_external(other.c_str(), "/model/transformer.wte.weight", f, "/model/transformer.wte.weight",
                                H5P_DEFAULT, H5P_DEFAULT);
    });
    const std::string msg = error_of([&] { load_model_weights(bad, *model); });
    CHECK_THAT(msg, Contains(bad) && Contains("/model/transformer.wte.weight is an external link to " + other));
    CHECK(same_weights(*model, before));
  }
  SECTION("an external link standing in for the whole optimizer group") {
    relink("/optimizer", [&](hid_t f) {
      return H5Lcreate_external(other.c_str(), "/optimizer", f, "/optimizer", H5P_DEFAULT, H5P_DEFAULT);
    });
    // Every reader walks the whole file first, so even one that needs no optimizer refuses it.
    CHECK_THAT(error_of([&] { load_model_weights(bad, *model); }), Contains("/optimizer is an external link"));
    auto opt = make_optimizer(*model, r.cfg);
    CHECK_THAT(error_of([&] { load_optimizer_state(bad, *opt); }),
               Contains(bad) && Contains("/optimizer is an external link"));
    CHECK_THAT(error_of([&] { read_checkpoint_meta(bad); }), Contains("/optimizer is an external link"));
  }
}

// ---- 6. inspect verifies checksums ----

TEST_CASE("qkv inspect verifies every dataset's checksum and exits 2 naming a corrupt one",
          "[faults][io][checkpoint][cli]") {
  TempDir dir;
  const std::string path = dir.file("ckpt.h5"), bad = dir.file("bad.h5");
  Run r = make_run("gpt2");
  save(r, path);
  const std::vector<char> good = read_bytes(path);
  CHECK(verify_checkpoint_data(path) > static_cast<int64_t>(r.model->named_parameters().size()));

  const Tensor m = r.opt->states().back().exp_avg_sq;  // the last optimizer moment
  const auto params = r.model->named_parameters();
  const std::string last = params.back().name;
  const int64_t at = find_bytes(good, m.data<float>() + 2, 16);
  REQUIRE(at > 0);
  std::vector<char> b = good;
  b[at + 1] ^= 0x08;
  write_bytes(bad, b);
  CHECK_NOTHROW(read_checkpoint_meta(bad));  // what inspect read before: it said OK
  CHECK_NOTHROW(list_model_tensors(bad));
  CHECK_THAT(error_of([&] { verify_checkpoint_data(bad); }),
             Contains(bad) && Contains("/optimizer/" + last + "/exp_avg_sq") && Contains("checksum"));

  if (!cli_available()) {
    WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
    return;
  }
  std::string err, out;
  CHECK(run_qkv(qkv_cmd("inspect " + bad), dir.path, err) == 2);
  CHECK_THAT(err, Contains("/optimizer/" + last + "/exp_avg_sq") && Contains("checksum"));
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  REQUIRE(run_command(qkv_cmd("inspect --json " + path + " 2>/dev/null | tail -1"), out) == 0);
  CHECK(nlohmann::json::parse(out)["verified_datasets"].get<int64_t>() == verify_checkpoint_data(path));
  REQUIRE(run_command(qkv_cmd("inspect " + path + " 2>/dev/null"), out) == 0);
  CHECK_THAT(out, Contains("datasets pass their checksums"));
}

// A corrupt object header makes HDF5's existence queries fail (a negative result, not "no").
// has()/has_attr() must report that as a corrupt file rather than as "absent": an absent
// optional attribute (a checksum, say) is skipped by its readers, so calling a damaged one absent
// would skip the very check that catches the damage. Every single-byte corruption of the file's
// first 4 KiB that HDF5 still opens must either answer truthfully or throw one line.
TEST_CASE("h5 existence queries on a corrupt file throw instead of answering 'absent'", "[faults][io]") {
  TempDir dir;
  const std::string path = dir.file("exists.h5");
  {
    h5::File f = h5::File::create(path);
    f.write_string("/group/text", "some text");
    f.set_attr("/", "format", "probe");
    f.set_attr("/group", "count", int64_t{7});
    f.close();
  }
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  REQUIRE(bytes.size() > 4096);
  int opened = 0, threw = 0;
  const std::string corrupt = dir.file("corrupt.h5");
  for (size_t off = 0; off < 4096; ++off) {
    std::string b = bytes;
    b[off] = static_cast<char>(b[off] ^ 0x5a);
    {
      std::ofstream out(corrupt, std::ios::binary | std::ios::trunc);
      out.write(b.data(), static_cast<std::streamsize>(b.size()));
    }
    std::optional<h5::File> f;
    try {
      f.emplace(h5::File::open(corrupt));
    } catch (const Error&) {
      continue;  // refused at open: fine
    }
    ++opened;
    for (const auto& [obj, name] : {std::pair<std::string, std::string>{"/", "format"}, {"/group", "count"}}) {
      INFO("byte " << off << " flipped, attribute " << name << " of " << obj);
      try {
        const bool present = f->has_attr(obj, name);  // outside CHECK, which would swallow a throw
        CHECK(present);                               // it is there; "no" would be a lie
      } catch (const Error& e) {
        ++threw;
        CHECK(std::string(e.what()).find('\n') == std::string::npos);
      }
    }
  }
  INFO("opened " << opened << ", threw " << threw);
  CHECK(opened > 0);
}
