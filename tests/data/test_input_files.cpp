// Inputs that are not what a reader expects (data/input_file.h, data/h5.h, train/checkpoint.h):
// a FIFO, a link to /dev/zero, a directory or an oversize file as a data path, config.json,
// tokenizer file, model.safetensors or block_sparse layout; malformed JSON; and checkpoints with
// a second hard link to a tensor or an object the schema does not describe. Each is refused
// with one line naming the file (and the object), never hung, never a library's own text.
//
// FIFOs here never get a writer: the reader opens non-blocking and refuses after fstat, so a
// call returns at once; the CLI cases run under `timeout` only so that a regression reports
// status 124 instead of stalling the suite.
#include <catch2/catch.hpp>

#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "attention/pattern/pattern.h"
#include "checkpoint_test_util.h"
#include "data/dataset.h"
#include "data/h5.h"
#include "data/input_file.h"
#include "data/safetensors.h"
#include "data/tokenizer.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/hf_interop.h"
#include "train/session.h"
#include "train/trainer.h"
#include "build_dir.h"

using namespace qkv;
using namespace qkv::ckpt_test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// One line, no library text.
bool one_clean_line(const std::string& msg) {
  const bool single = msg.find('\n') == std::string::npos || msg.find('\n') == msg.size() - 1;
  return single && msg.find("json.exception") == std::string::npos && msg.find("bad_alloc") == std::string::npos &&
         msg.find("HDF5-DIAG") == std::string::npos && msg.find("filesystem error") == std::string::npos;
}

std::string qkv_binary() { return std::string(QKV_BINARY_DIR) + "/qkv"; }
bool have_cli() { return ::access(qkv_binary().c_str(), X_OK) == 0; }

// Runs `qkv ARGS` (under `timeout`: a hang is status 124); its exit status, stderr in `err`.
int run_qkv(const std::string& args, const std::string& dir, std::string& err) {
  const std::string errfile = dir + "/stderr.txt";
  std::string out;
  const int rc = run_command("timeout 60 " + qkv_binary() + " " + args + " >/dev/null 2>" + errfile, out);
  std::ifstream in(errfile);
  err.assign(std::istreambuf_iterator<char>(in), {});
  fs::remove(errfile);
  return rc;
}

// Two stored tensors of one shape (the first pair in the file), so that a hard link from one
// name to the other's object makes a checkpoint every shape check accepts.
std::pair<std::string, std::string> same_shape_pair(const std::string& ckpt) {
  const std::vector<train::StoredTensor> ts = train::list_model_tensors(ckpt);
  for (size_t i = 0; i < ts.size(); ++i)
    for (size_t j = i + 1; j < ts.size(); ++j)
      if (ts[i].shape == ts[j].shape) return {"/model/" + ts[i].name, "/model/" + ts[j].name};
  FAIL("no two tensors of one shape in " << ckpt);
  return {};
}

// Replaces the link `alias` by a second hard link to the object at `target` (two names, one
// object), with the HDF5 C API directly.
void hard_link_over(const std::string& ckpt, const std::string& target, const std::string& alias) {
  const hid_t f = H5Fopen(ckpt.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(f >= 0);
  REQUIRE(H5Ldelete(f, alias.c_str(), H5P_DEFAULT) >= 0);
  REQUIRE(H5Lcreate_hard(f, target.c_str(), f, alias.c_str(), H5P_DEFAULT, H5P_DEFAULT) >= 0);
  REQUIRE(H5Fclose(f) >= 0);
}

}  // namespace

TEST_CASE("input files: a FIFO, a link to /dev/zero, a directory or an oversize file is refused by name",
          "[input_files]") {
  TempDir dir;
  const std::string fifo = dir.file("data.fifo"), zero = dir.file("zero.txt"), sub = dir.file("sub");
  const std::string small = dir.file("small.txt");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  fs::create_symlink("/dev/zero", zero);
  fs::create_directories(sub);
  write_text(small, "0123456789A");  // 11 bytes

  const std::string m_fifo = error_of([&] { read_input_file(fifo, 1 << 20, "a test file"); });
  CHECK_THAT(m_fifo, Contains(fifo + ": is a pipe or FIFO, not a regular file"));
  const std::string m_zero = error_of([&] { read_input_file(zero, 1 << 20, "a test file"); });
  CHECK_THAT(m_zero, Contains(zero + ": is a character device, not a regular file"));
  CHECK_THAT(error_of([&] { read_input_file(sub, 1 << 20, "a test file"); }),
             Contains(sub + ": is a directory, not a regular file"));
  CHECK_THAT(error_of([&] { read_input_file(small, 10, "a test file"); }),
             Contains(small + ": is 11 bytes, over the 10-byte limit for a test file"));
  CHECK(read_input_file(small, 11, "a test file") == "0123456789A");  // the cap itself is allowed
  CHECK(one_clean_line(m_fifo));
  CHECK(one_clean_line(m_zero));

  // Every reader of a data path: prepare, train (load_or_prepare), eval, heads (read_text_file).
  const auto tok = CharTokenizer::train(kCorpus);
  PrepareOptions o;
  o.tokenizer = TokenizerKind::character;
  for (const std::string& bad : {fifo, zero}) {
    const std::string kind = bad == fifo ? "is a pipe or FIFO" : "is a character device";
    CHECK_THAT(error_of([&] { load_or_prepare(bad, o, dir.file("cache")); }), Contains(bad + ": " + kind));
    CHECK_THAT(error_of([&] { load_eval_tokens(bad, *tok); }), Contains(bad + ": " + kind));
    CHECK_THAT(error_of([&] { prepare_dataset(bad, dir.file("out.h5"), o); }), Contains(bad + ": " + kind));
    CHECK_THAT(error_of([&] { read_text_file(bad); }), Contains(bad + ": " + kind));
    // HDF5 files (checkpoints, prepared data) are checked before H5Fopen.
    CHECK_THAT(error_of([&] { h5::File::open(bad); }), Contains(bad + ": " + kind + ", not a regular file"));
    CHECK_THAT(error_of([&] { train::read_checkpoint_meta(bad); }), Contains(bad));
    // safetensors and a block_sparse layout.
    CHECK_THAT(error_of([&] { safetensors::Reader r(bad); }), Contains(bad + ": " + kind));
    attn::SparsePattern p;
    p.kind = attn::Pattern::block_sparse;
    p.layout = bad;
    CHECK_THAT(error_of([&] { attn::load_layout(p); }), Contains(bad + ": " + kind));
  }
}

TEST_CASE("input files: Hugging Face config.json and tokenizer files that are FIFOs, devices, oversize or not JSON",
          "[input_files]") {
  TempDir dir;
  const std::string hf = dir.file("hf");
  fs::create_directories(hf);
  // config.json as a FIFO, then as a link to /dev/zero.
  REQUIRE(::mkfifo((hf + "/config.json").c_str(), 0600) == 0);
  CHECK_THAT(error_of([&] { train::read_hf_config(hf); }), Contains(hf + "/config.json: is a pipe or FIFO"));
  fs::remove(hf + "/config.json");
  fs::create_symlink("/dev/zero", hf + "/config.json");
  CHECK_THAT(error_of([&] { train::read_hf_config(hf); }), Contains(hf + "/config.json: is a character device"));
  fs::remove(hf + "/config.json");
  // Malformed JSON: the position, not nlohmann's message.
  write_text(hf + "/config.json", "{\n  \"model_type\": \"gpt2\",\n  \"n_embd\": ,\n}\n");
  const std::string bad_json = error_of([&] { train::read_hf_config(hf); });
  CHECK_THAT(bad_json, Contains(hf + "/config.json: not valid JSON at line 3, column 13"));
  CHECK(one_clean_line(bad_json));

  // tokenizer.json: sparse, one byte over the cap (nothing is read); then malformed.
  const std::string tj = hf + "/tokenizer.json";
  {
    std::ofstream(tj).close();
    fs::resize_file(tj, kJsonFileCap + 1);
  }
  CHECK_THAT(error_of([&] { train::read_hf_tokenizer(hf); }),
             Contains(tj + ": is " + std::to_string(kJsonFileCap + 1) + " bytes, over the " +
                      std::to_string(kJsonFileCap) + "-byte limit"));
  write_text(tj, "{\"model\": {\"vocab\": [1, 2}}");
  const std::string tok_msg = error_of([&] { train::read_hf_tokenizer(hf); });
  CHECK_THAT(tok_msg, Contains(tj + ": ") && Contains("not valid JSON at line 1, column 26"));
  CHECK(one_clean_line(tok_msg));
  // A value of the wrong type inside valid JSON: named by its key, without the library's text.
  write_text(tj, R"({"model": {"type": 5}})");
  const std::string type_msg = error_of([&] { train::read_hf_tokenizer(hf); });
  CHECK_THAT(type_msg, Contains(tj + ": ") && Contains("model.type is a JSON number, expected a string"));
  CHECK(one_clean_line(type_msg));
  fs::remove(tj);
  // vocab.json + merges.txt, one of them a FIFO.
  write_text(hf + "/vocab.json", "{}");
  REQUIRE(::mkfifo((hf + "/merges.txt").c_str(), 0600) == 0);
  CHECK_THAT(error_of([&] { train::read_hf_tokenizer(hf); }), Contains(hf + "/merges.txt: is a pipe or FIFO"));

  // A safetensors header that is not JSON.
  const std::string header = "{\"a\": {\"dtype\": \"F32\",";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  write_text(dir.file("m.safetensors"), bytes + header);
  const std::string st_msg = error_of([&] { safetensors::Reader r(dir.file("m.safetensors")); });
  CHECK_THAT(st_msg, Contains(dir.file("m.safetensors") + ": safetensors header: not valid JSON"));
  CHECK(one_clean_line(st_msg));
}

TEST_CASE("input files: a checkpoint with a second hard link to a tensor is refused by every reader",
          "[input_files][checkpoint]") {
  TempDir dir;
  const std::string ckpt = dir.file("ckpt.h5");
  Run r = make_run("gpt2");
  save(r, ckpt);
  const auto [target, alias] = same_shape_pair(ckpt);
  hard_link_over(ckpt, target, alias);

  // Two names, one object: every shape check passes, so only the link count tells.
  const std::string want = "[h5] " + ckpt + ": object ";
  for (const auto& read : std::vector<std::function<void()>>{
           [&] { train::read_checkpoint_meta(ckpt); },
           [&] {
             auto model = train::build_model(r.cfg, r.tok->vocab_size());
             train::load_model_weights(ckpt, *model);
           },
           [&] { train::load_optimizer_state(ckpt, *r.opt); }, [&] { train::list_model_tensors(ckpt); },
           [&] { train::verify_checkpoint_data(ckpt); }}) {
    const std::string msg = error_of(read);
    CHECK_THAT(msg, Contains(want) && Contains(" is reached by 2 names"));
    CHECK((msg.find(target) != std::string::npos || msg.find(alias) != std::string::npos));
    CHECK(one_clean_line(msg));
  }
  // h5::File on its own refuses reading either name.
  const h5::File f = h5::File::open(ckpt);
  CHECK_THAT(error_of([&] { f.read<float>(alias); }), Contains(alias + " is reached by 2 names"));
  CHECK_THAT(error_of([&] { f.read<float>(target); }), Contains(target + " is reached by 2 names"));
}

TEST_CASE("input files: a checkpoint holding an object the schema does not describe is refused naming it",
          "[input_files][checkpoint]") {
  TempDir dir;
  Run r = make_run("llama");
  const std::string clean = dir.file("clean.h5");
  save(r, clean);
  REQUIRE_NOTHROW(load_everything(clean));

  struct Extra {
    std::string what, object;
    std::function<void(h5::File&)> add;
  };
  const std::vector<Extra> extras = {
      {"a dataset under /train", "dataset /train/notes",
       [](h5::File& f) {
         f.write("/train/notes", std::vector<int32_t>{1, 2});
       }},
      {"a group at the root", "group /extra", [](h5::File& f) { f.create_group("/extra"); }},
      {"a group under /model", "group /model/sub", [](h5::File& f) { f.create_group("/model/sub"); }},
      {"a third optimizer moment", "dataset /optimizer/model.norm.weight/exp_avg_cubed",
       [](h5::File& f) { f.write("/optimizer/model.norm.weight/exp_avg_cubed", std::vector<float>{0.f}); }},
      {"a dataset directly under /optimizer", "dataset /optimizer/loose",
       [](h5::File& f) { f.write("/optimizer/loose", std::vector<float>{0.f}); }},
  };
  for (const Extra& e : extras) {
    DYNAMIC_SECTION(e.what) {
      const std::string ckpt = dir.file("extra.h5");
      fs::copy_file(clean, ckpt, fs::copy_options::overwrite_existing);
      {
        h5::File f = h5::File::open(ckpt, /*writable=*/true);
        e.add(f);
        f.close();
      }
      const std::string msg = error_of([&] { train::read_checkpoint_meta(ckpt); });
      CHECK_THAT(msg, Contains("[checkpoint] " + ckpt + ": " + e.object + " is not part of the checkpoint schema"));
      CHECK(one_clean_line(msg));
      CHECK_THAT(error_of([&] { load_everything(ckpt); }), Contains(e.object));
      CHECK_THAT(error_of([&] { train::verify_checkpoint_data(ckpt); }), Contains(e.object));
    }
  }
}

TEST_CASE("input files: the CLI refuses a FIFO data path and a hard-linked checkpoint with exit 2 and one line",
          "[input_files][cli]") {
  if (!have_cli()) {
    WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
    return;
  }
  TempDir dir;
  Config c;
  c.model.n_layer = 1;
  c.model.n_head = 2;
  c.model.n_embd = 16;
  c.model.block_size = 16;
  std::string text;
  for (int i = 0; i < 60; ++i) text += kCorpus;
  c.data.path = dir.file("corpus.txt");
  write_text(c.data.path, text);
  c.data.separator = DocSeparator::none;
  c.train.batch_size = 4;
  c.train.max_steps = 4;
  c.train.eval_interval = 2;
  c.train.eval_batches = 1;
  c.train.out_dir = dir.file("run");
  const std::string ckpt = train::run_training(c, {.progress = false}).checkpoint;
  REQUIRE(fs::exists(ckpt));
  const std::string fifo = dir.file("data.fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string cfg = dir.file("config.toml");
  write_text(cfg, to_toml(c));

  std::string err;
  const std::vector<std::string> commands = {
      "eval --checkpoint " + ckpt + " --data " + fifo,
      "heads --checkpoint " + ckpt + " --data " + fifo,
      "prepare --input " + fifo + " --tokenizer char --out " + dir.file("p.h5"),
      "train --config " + cfg + " --set data.path=" + fifo + " --set train.out_dir=" + dir.file("run2"),
  };
  for (const std::string& cmd : commands) {
    INFO(cmd);
    CHECK(run_qkv(cmd, dir.path, err) == 2);
    CHECK_THAT(err, Contains(fifo + ": is a pipe or FIFO, not a regular file"));
    CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  }

  hard_link_over(ckpt, "/model/transformer.h.0.ln_1.weight", "/model/transformer.h.0.ln_2.weight");
  for (const std::string& cmd : {"eval --checkpoint " + ckpt + " --data " + c.data.path, "inspect " + ckpt,
                                 "sample --checkpoint " + ckpt + " --max-new-tokens 2"}) {
    INFO(cmd);
    CHECK(run_qkv(cmd, dir.path, err) == 2);
    CHECK_THAT(err, Contains(ckpt) && Contains("transformer.h.0.ln_") && Contains("is reached by 2 names"));
    CHECK(std::count(err.begin(), err.end(), '\n') == 1);
    CHECK(err.find("HDF5-DIAG") == std::string::npos);
  }
}

TEST_CASE("an HDF5 string or scalar attribute holding several values is refused, not read into one", "[data][h5]") {
  TempDir dir;
  const std::string path = dir.file("multi.h5");
  {
    h5::File f = h5::File::create(path);
    // Three int64 values where qkv reads one (a checkpoint's "step"), and two strings where it reads
    // one (its tokenizer JSON), made as any HDF5 writer could.
    const hsize_t three[1] = {3}, two[1] = {2};
    const int64_t steps[3] = {1, 2, 3};
    hid_t space = H5Screate_simple(1, three, nullptr);
    hid_t a = H5Acreate2(f.id(), "step", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, steps);
    H5Aclose(a);
    a = H5Acreate2(f.id(), "loss", H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    const double losses[3] = {1, 2, 3};
    H5Awrite(a, H5T_NATIVE_DOUBLE, losses);
    H5Aclose(a);
    H5Sclose(space);
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    space = H5Screate_simple(1, two, nullptr);
    const char* texts[2] = {"{}", "{}"};
    hid_t d = H5Dcreate2(f.id(), "json", type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, texts);
    H5Dclose(d);
    a = H5Acreate2(f.id(), "config", type, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, type, texts);
    H5Aclose(a);
    H5Sclose(space);
    H5Tclose(type);
  }
  const h5::File f = h5::File::open(path);
  const std::string at = "[h5] " + path + ": ";
  CHECK_THROWS_MATCHES(f.attr_int("/", "step"), Error,
                       Catch::Message(at + "attribute 'step' of / holds 3 values, expected one"));
  CHECK_THROWS_MATCHES(f.attr_double("/", "loss"), Error,
                       Catch::Message(at + "attribute 'loss' of / holds 3 values, expected one"));
  CHECK_THROWS_MATCHES(f.read_string("json"), Error, Catch::Message(at + "dataset /json holds 2 values, expected one"));
  CHECK_THROWS_MATCHES(f.attr_string("/", "config"), Error,
                       Catch::Message(at + "attribute 'config' of / holds 2 values, expected one"));
}
