// Checkpoints, the bad paths: truncated, bit-flipped, foreign, newer and mismatched files are
// rejected with one line naming the file and the problem, and a failed load leaves the model as
// it was; a save that fails midway leaves the previous checkpoint in place; pruning keeps the
// newest by step number; and `qkv inspect` reports what the file holds.
#include <catch2/catch.hpp>
#include <hdf5.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "checkpoint_test_util.h"
#include "data/h5.h"
#include "train/session.h"
#include "build_dir.h"

using namespace qkv;
using namespace qkv::train;
using namespace qkv::ckpt_test;
using Catch::Contains;

namespace {

// Overwrites dataset `name` of an existing file with `values` (through the C API, so the
// Fletcher-32 checksums are recomputed: the file is consistent, only the numbers are bad).
void overwrite_dataset(const std::string& path, const std::string& name, const std::vector<float>& values) {
  h5::quiet();
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(f >= 0);
  const hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
  REQUIRE(d >= 0);
  REQUIRE(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0);
  H5Dclose(d);
  H5Fclose(f);
}

// Removes object `name` (a dataset or a group) from an existing file.
void delete_object(const std::string& path, const std::string& name) {
  h5::File f = h5::File::open(path, true);
  REQUIRE(H5Ldelete(f.id(), name.c_str(), H5P_DEFAULT) >= 0);
}

// Replaces dataset `name` with a float32 one of `shape` (finite values), written the way qkv
// writes (h5::File::write: checksummed), so only the shape is wrong.
void replace_tensor(const std::string& path, const std::string& name, const Shape& shape) {
  h5::File f = h5::File::open(path, true);
  if (f.has(name)) REQUIRE(H5Ldelete(f.id(), name.c_str(), H5P_DEFAULT) >= 0);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i % 7);
  f.write(name, v.data(), shape);
}

// Replaces dataset `name` with a scalar (rank 0) float32, through the C API (qkv writes none).
void replace_with_scalar(const std::string& path, const std::string& name) {
  h5::File f = h5::File::open(path, true);
  REQUIRE(H5Ldelete(f.id(), name.c_str(), H5P_DEFAULT) >= 0);
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t d = H5Dcreate2(f.id(), name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(d >= 0);
  const float one = 1;
  REQUIRE(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, &one) >= 0);
  H5Dclose(d);
  H5Sclose(space);
}

// Sets `key = value` in the stored config's [model] section and recomputes the config checksum,
// as a careful hand edit would: the file is self-consistent except for what the edit says.
void edit_model_key(const std::string& path, const std::string& key, const std::string& value) {
  h5::File f = h5::File::open(path, true);
  std::istringstream in(f.attr_string("/", "config"));
  std::string out, section;
  bool done = false;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] == '[') section = line;
    if (section == "[model]" && line.rfind(key + " = ", 0) == 0) {
      line = key + " = " + value;
      done = true;
    }
    out += line + "\n";
  }
  REQUIRE(done);
  f.set_attr("/", "config", out);
  f.set_attr("/", "config_fnv1a64", static_cast<int64_t>(h5::fnv1a64(out.data(), out.size())));
}

std::set<std::string> files_in(const TempDir& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir.path)) out.insert(e.path().filename().string());
  return out;
}

}  // namespace

TEST_CASE("checkpoint rejects a truncated file naming the file", "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  Run r = make_run("gpt2");
  save(r, path);
  const auto size = fs::file_size(path);
  for (const auto keep : {size - 1, size / 2, uintmax_t{512}, uintmax_t{4}, uintmax_t{0}}) {
    INFO("kept " << keep << " of " << size << " bytes");
    fs::copy_file(path, dir.file("cut.h5"), fs::copy_options::overwrite_existing);
    fs::resize_file(dir.file("cut.h5"), keep);
    const std::string msg = error_of([&] { load_everything(dir.file("cut.h5")); });
    CHECK_THAT(msg, Contains(dir.file("cut.h5")));
    if (keep >= 512) CHECK_THAT(msg, Contains("truncated"));
    else CHECK_THAT(msg, Contains("not an HDF5 file"));
    CHECK(msg.find('\n') == std::string::npos);
  }
  CHECK_THAT(error_of([&] { read_checkpoint_meta(dir.file("missing.h5")); }),
             Contains(dir.file("missing.h5")) && Contains("not found"));
}

TEST_CASE("checkpoint rejects flipped bytes in tensor data, metadata and the config text", "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  Run r = make_run("llama");
  save(r, path);
  const std::vector<char> good = read_bytes(path);
  const std::string bad = dir.file("bad.h5");

  SECTION("a flipped bit in a weight is caught by its chunk checksum; the model is left untouched") {
    const auto params = r.model->named_parameters();
    const Tensor emb = params[0].tensor;  // model.embed_tokens.weight, stored as is
    REQUIRE(params[0].name == "model.embed_tokens.weight");
    const int64_t at = find_bytes(good, emb.data<float>() + 3, 16);
    REQUIRE(at > 0);
    std::vector<char> b = good;
    b[at + 5] ^= 0x10;
    write_bytes(bad, b);
    CHECK_NOTHROW(read_checkpoint_meta(bad));  // the metadata is intact
    auto model = build_model(r.cfg, r.tok->vocab_size());
    model->init_weights(1);
    const auto before = snapshot(*model);
    const std::string msg = error_of([&] { load_model_weights(bad, *model); });
    CHECK_THAT(msg, Contains(bad) && Contains("/model/model.embed_tokens.weight") && Contains("checksum"));
    CHECK(same_weights(*model, before));
  }
  SECTION("a flipped bit in an optimizer moment is caught too") {
    const Tensor m = r.opt->states().back().exp_avg;  // lm_head's moment
    const int64_t at = find_bytes(good, m.data<float>() + 1, 16);
    REQUIRE(at > 0);
    std::vector<char> b = good;
    b[at] ^= 0x01;
    write_bytes(bad, b);
    auto model = build_model(r.cfg, r.tok->vocab_size());
    CHECK_NOTHROW(load_model_weights(bad, *model));
    auto opt = make_optimizer(*model, r.cfg);
    CHECK_THAT(error_of([&] { load_optimizer_state(bad, *opt); }),
               Contains(bad) && Contains("/optimizer/lm_head.weight/exp_avg") && Contains("checksum"));
  }
  SECTION("a flipped byte in the superblock makes the file unopenable") {
    std::vector<char> b = good;
    b[20] ^= 0x40;
    write_bytes(bad, b);
    CHECK_THAT(error_of([&] { read_checkpoint_meta(bad); }), Contains(bad) && Contains("corrupt"));
  }
  SECTION("a changed character in the stored config fails its checksum") {
    const std::string needle = "n_layer = 2";
    const int64_t at = find_bytes(good, needle.data(), needle.size());
    REQUIRE(at > 0);
    std::vector<char> b = good;
    b[at + needle.size() - 1] = '3';  // still valid TOML, a different model: must not pass
    write_bytes(bad, b);
    CHECK_THAT(error_of([&] { read_checkpoint_meta(bad); }),
               Contains(bad) && Contains("config") && Contains("checksum"));
  }
  SECTION("a corrupted string size in HDF5's unchecksummed global heap is refused, not a crash") {
    // HDF5 1.10 would read past the collection (a segfault); the loader walks it first.
    const int64_t at = find_bytes(good, "GCOL\x01\0\0\0", 8);
    REQUIRE(at > 0);
    std::vector<char> b = good;
    b[at + 16 + 8 + 3] ^= 0x40;  // the first object's u64 size, a high byte
    write_bytes(bad, b);
    CHECK_THAT(error_of([&] { read_checkpoint_meta(bad); }), Contains(bad) && Contains("corrupt HDF5 global heap"));
    CHECK_THAT(error_of([&] { list_model_tensors(bad); }), Contains("corrupt HDF5 global heap"));
  }
  SECTION("a changed character in the tokenizer JSON fails its checksum") {
    const std::string needle = "\"kind\"";
    const int64_t at = find_bytes(good, needle.data(), needle.size());
    REQUIRE(at > 0);
    std::vector<char> b = good;
    b[at + 1] = 'K';
    write_bytes(bad, b);
    CHECK_THAT(error_of([&] { read_checkpoint_meta(bad); }), Contains(bad) && Contains("tokenizer"));
  }
}

TEST_CASE("checkpoint rejects every single-byte corruption or loads it unchanged, never silently wrong",
          "[checkpoint][long]") {
  // Corrupt one byte at each of 400 offsets spread over the file (QKV_CHECKPOINT_FUZZ_PROBES=N
  // for more; N >= the file size covers every byte), with single-bit, all-bit and mixed flips.
  // Each result must be an error or a load whose weights, moments and state all equal the
  // original (bytes HDF5 never reads, such as padding).
  TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  Run r = make_run("gpt2", 16, 1);
  save(r, path);
  const std::vector<char> good = read_bytes(path);
  const std::string bad = dir.file("bad.h5");
  int rejected = 0, harmless = 0;
  const char* env = std::getenv("QKV_CHECKPOINT_FUZZ_PROBES");
  const size_t n = good.size(), probes = std::min<size_t>(n, env ? std::max(2l, std::atol(env)) : 400);
  for (size_t k = 0; k < probes; ++k) {
    const size_t at = k * (n - 1) / (probes - 1);
    const int mask = k % 3 == 0 ? 0x5a : k % 3 == 1 ? 1 << (k / 3 % 8) : 0xff;
    std::vector<char> b = good;
    b[at] = static_cast<char>(b[at] ^ mask);
    write_bytes(bad, b);
    try {
      const CheckpointMeta meta = read_checkpoint_meta(bad);
      auto model = build_model(meta.config, meta.tokenizer->vocab_size());
      load_model_weights(bad, *model);
      auto opt = make_optimizer(*model, meta.config);
      load_optimizer_state(bad, *opt);
      INFO("byte " << at << " of " << n << " xor " << mask << " loaded");
      REQUIRE(meta.config == r.cfg);
      REQUIRE(meta.tokenizer->serialize() == r.tok->serialize());
      REQUIRE(meta.state.step == r.state.step);
      REQUIRE(meta.state.tokens_seen == r.state.tokens_seen);
      REQUIRE(meta.state.data == r.state.data);
      REQUIRE(meta.state.batch_mode == r.state.batch_mode);
      REQUIRE(meta.state.best_val_loss == r.state.best_val_loss);
      REQUIRE(meta.state.skipped_steps == r.state.skipped_steps);
      REQUIRE(opt->step_count() == r.opt->step_count());
      REQUIRE(same_weights(*model, snapshot(*r.model)));
      for (const OptimParam& p : r.opt->params()) {
        REQUIRE(bitwise_equal(opt->state(p.name).exp_avg, r.opt->state(p.name).exp_avg));
        REQUIRE(bitwise_equal(opt->state(p.name).exp_avg_sq, r.opt->state(p.name).exp_avg_sq));
      }
      ++harmless;
    } catch (const Error& e) {
      const std::string msg = e.what();
      INFO(msg);
      REQUIRE(msg.find(bad) != std::string::npos);
      REQUIRE(msg.find('\n') == std::string::npos);
      ++rejected;
    }
  }
  std::printf("[checkpoint fuzz] %zu-byte file, %zu flips: %d rejected, %d harmless\n", n, probes, rejected, harmless);
  CHECK(rejected > static_cast<int>(probes) / 2);
}

TEST_CASE("checkpoint rejects a foreign format, a newer version and non-HDF5 files", "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  Run r = make_run("gpt2");
  save(r, path);
  {
    h5::File f = h5::File::open(path, true);
    f.set_attr("/", "format", "qkv-dataset");
  }
  CHECK_THAT(error_of([&] { read_checkpoint_meta(path); }),
             Contains(path) && Contains("not a qkv checkpoint") && Contains("'qkv-dataset'"));
  CHECK_THAT(error_of([&] { list_model_tensors(path); }), Contains("not a qkv checkpoint"));
  save(r, path);
  {
    h5::File f = h5::File::open(path, true);
    f.set_attr("/", "format_version", int64_t{kCheckpointFormatVersion + 1});
  }
  CHECK_THAT(error_of([&] { load_model_weights(path, *r.model); }),
             Contains(path) && Contains("newer qkv") && Contains("format_version 2"));
  {
    h5::File f = h5::File::create(dir.file("plain.h5"));
    f.write("x", std::vector<float>{1, 2});
  }
  CHECK_THAT(error_of([&] { read_checkpoint_meta(dir.file("plain.h5")); }),
             Contains(dir.file("plain.h5")) && Contains("no 'format' attribute"));
  std::ofstream(dir.file("text.h5")) << "just some text, not HDF5 at all\n";
  CHECK_THAT(error_of([&] { read_checkpoint_meta(dir.file("text.h5")); }), Contains("not an HDF5 file"));
}

TEST_CASE("checkpoint /data mode is the batching mode's spelling: each round-trips, an unknown one is refused",
          "[checkpoint][enums]") {
  TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  Run r = make_run("gpt2");
  const std::pair<BatchMode, const char*> modes[] = {{BatchMode::random_windows, "random_windows"},
                                                     {BatchMode::padded_docs, "padded_docs"},
                                                     {BatchMode::packed_docs, "packed_docs"}};
  for (const auto& [mode, spelling] : modes) {
    CAPTURE(spelling);
    r.state.batch_mode = mode;
    save(r, path);
    CHECK(h5::File::open(path).attr_string("data", "mode") == spelling);
    CHECK(read_checkpoint_meta(path).state.batch_mode == mode);
  }
  {
    h5::File f = h5::File::open(path, true);
    f.set_attr("data", "mode", "shuffled");
  }
  CHECK(error_of([&] { read_checkpoint_meta(path); }) ==
        "[checkpoint] " + path + ": unknown batching mode 'shuffled' in /data");
}

TEST_CASE("checkpoint load into a model of another config names the first mismatched tensor and both shapes",
          "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  Run r = make_run("gpt2");  // C = 32, 2 layers, tied
  save(r, path);
  const int64_t V = r.tok->vocab_size();
  const std::string Vs = std::to_string(V);

  Run wide = make_run("gpt2", 48);
  const auto before = snapshot(*wide.model);
  CHECK_THAT(error_of([&] { load_model_weights(path, *wide.model); }),
             Contains(path) && Contains("/model/transformer.wte.weight") && Contains("[" + Vs + ",32]") &&
                 Contains("[" + Vs + ",48]"));
  CHECK(same_weights(*wide.model, before));
  CHECK_THAT(error_of([&] { load_optimizer_state(path, *wide.opt); }),
             Contains("/optimizer/transformer.wte.weight/exp_avg") && Contains("[" + Vs + ",48]"));

  Run deep = make_run("gpt2", 32, 3);
  CHECK_THAT(error_of([&] { load_model_weights(path, *deep.model); }),
             Contains("parameter transformer.h.2.ln_1.weight [32] is missing"));
  CHECK_THAT(error_of([&] { load_optimizer_state(path, *deep.opt); }),
             Contains("optimizer state of transformer.h.2.ln_1.weight is missing"));

  Run shallow = make_run("gpt2", 32, 1);
  CHECK_THAT(error_of([&] { load_model_weights(path, *shallow.model); }),
             Contains("/model/transformer.h.1.") && Contains("not a parameter of this model"));

  Run llama = make_run("llama");
  CHECK_THAT(error_of([&] { load_model_weights(path, *llama.model); }),
             Contains("parameter model.embed_tokens.weight [" + Vs + ",32] is missing"));

  // An untied llama checkpoint into a tied llama: the extra head is named.
  save(llama, path);
  Config tied_cfg = llama.cfg;
  tied_cfg.model.tie_embeddings = true;
  auto tied = build_model(tied_cfg, V);
  CHECK_THAT(error_of([&] { load_model_weights(path, *tied); }), Contains("/model/lm_head.weight is not a parameter"));
}

TEST_CASE("checkpoint refuses non-finite values on load and on save, naming the tensor", "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  Run r = make_run("gpt2");
  save(r, path);
  const std::string name = "transformer.h.1.mlp.c_fc.weight";
  h5::File f = h5::File::open(path);
  std::vector<float> w = f.read<float>("model/" + name);
  f.close();
  w[17] = std::numeric_limits<float>::quiet_NaN();
  overwrite_dataset(path, "model/" + name, w);
  auto model = build_model(r.cfg, r.tok->vocab_size());
  const auto before = snapshot(*model);
  CHECK_THAT(error_of([&] { load_model_weights(path, *model); }),
             Contains(path) && Contains("/model/" + name) && Contains("non-finite") && Contains("element 17"));
  CHECK(same_weights(*model, before));

  r.model->named_parameters()[2].tensor.data<float>()[0] = INFINITY;
  CHECK_THAT(error_of([&] { save(r, dir.file("inf.h5")); }),
             Contains("refusing to save /model/transformer.h.0.ln_1.weight") && Contains("inf"));
  CHECK_FALSE(fs::exists(dir.file("inf.h5")));
}

TEST_CASE("checkpoint save that fails midway leaves the previous checkpoint loadable and no partial file",
          "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("ckpt_10.h5");
  Run first = make_run("gpt2");
  save(first, path);
  const std::vector<char> first_bytes = read_bytes(path);

  // The second save writes every weight, then meets a NaN in the last optimizer moment: the
  // failure comes after most of the file was written to the temporary.
  Run second = make_run("gpt2", 32, 2, 99);
  second.state.step = 20;
  second.opt->states().back().exp_avg_sq.data<float>()[3] = NAN;
  const std::string msg = error_of([&] { save(second, path); });
  CHECK_THAT(msg, Contains("refusing to save /optimizer/") && Contains("exp_avg_sq"));
  CHECK(read_bytes(path) == first_bytes);
  CHECK(files_in(dir) == std::set<std::string>{"ckpt_10.h5"});
  CHECK_NOTHROW(load_everything(path));
  CHECK(read_checkpoint_meta(path).state.step == 2);

  // A crash (no destructor ran) can leave a stale temporary behind: it never shadows the real
  // file, the next save (under a name of its own) is not disturbed by it, and pruning ignores it.
  const std::string stale = path + ".tmp.999999.0.deadbeef";
  write_bytes(stale, std::vector<char>(100, 'x'));
  CHECK_NOTHROW(load_everything(path));
  second.opt->states().back().exp_avg_sq.data<float>()[3] = 0.5f;
  save(second, path);
  CHECK(files_in(dir) == std::set<std::string>{"ckpt_10.h5", "ckpt_10.h5.tmp.999999.0.deadbeef"});
  CHECK(read_bytes(stale) == std::vector<char>(100, 'x'));
  CHECK(read_checkpoint_meta(path).state.step == 20);
  auto model = build_model(second.cfg, second.tok->vocab_size());
  load_model_weights(path, *model);
  CHECK(same_weights(*model, snapshot(*second.model)));

  // A save into a missing directory fails without creating anything.
  CHECK_THAT(error_of([&] { save(second, dir.file("nope/ckpt.h5")); }), Contains("does not exist"));
}

TEST_CASE("checkpoint save rejects a config that does not describe the model", "[checkpoint]") {
  TempDir dir;
  Run r = make_run("gpt2");
  Config other = r.cfg;
  other.model.n_embd = 64;
  CHECK_THAT(error_of([&] { save_checkpoint(dir.file("x.h5"), other, *r.model, r.opt.get(), r.state, *r.tok); }),
             Contains("model.n_embd is 64 in the config but 32 in the model"));
  CHECK_FALSE(fs::exists(dir.file("x.h5")));
  // Without an optimizer the file holds weights only, and loading moments says so.
  save_checkpoint(dir.file("w.h5"), r.cfg, *r.model, nullptr, r.state, *r.tok);
  CHECK_FALSE(read_checkpoint_meta(dir.file("w.h5")).has_optimizer);
  CHECK_THAT(error_of([&] { load_optimizer_state(dir.file("w.h5"), *r.opt); }), Contains("no optimizer state"));
}

TEST_CASE("checkpoint saving and --resume ask one question: every model key is refused or accepted by both",
          "[checkpoint][resume]") {
  // Each used to keep its own comparison: saving compared 13 fields, so a config whose
  // model.dropout, attn_dropout, norm_eps, rope_theta, window, init_std or attn_kernel did not
  // match the model was written as if it did; resume compared every key as written, so an
  // explicit model.vocab_size equal to the tokenizer's was a different model there and the same
  // model here. Both now ask model_difference.
  TempDir dir;
  Run r = make_run("llama");  // resolved: the family defaults are written out
  const int64_t V = r.tok->vocab_size();
  const std::vector<std::pair<std::string, std::string>> changes = {
      {"model.family", "gpt2"},
      {"model.n_layer", "3"},
      {"model.n_head", "8"},
      {"model.n_kv_head", "1"},
      {"model.n_embd", "48"},
      {"model.block_size", "32"},
      {"model.vocab_size", "80"},
      {"model.dropout", "0.25"},
      {"model.attn_dropout", "0.125"},
      {"model.norm_eps", "0.001"},
      {"model.rope_theta", "500.0"},
      {"model.ffn_hidden", "40"},
      {"model.position", "alibi"},
      {"model.norm", "layernorm"},
      {"model.activation", "gelu"},
      {"model.bias", "true"},
      {"model.tie_embeddings", "true"},
      {"model.window", "4"},
      {"model.init_std", "0.05"},
      {"model.attn_kernel", "reference"},
      {"model.attention_pattern", "linear"},
  };
  // Every model key but ffn_multiple_of (which only acts through ffn_hidden, set explicitly here),
  // the model.pattern_* parameters and linear attention's model.linear_* (refused on the full
  // pattern; test_attention_sparse.cpp and test_attention_linear.cpp check that model_difference
  // names each).
  size_t model_keys = 0;
  for (const std::string& k : config_keys())
    model_keys += k.rfind("model.", 0) == 0 && k != "model.ffn_multiple_of" && k.rfind("model.pattern_", 0) != 0 &&
                  k.rfind("model.linear_", 0) != 0;
  CHECK(changes.size() == model_keys);
  for (const auto& [key, value] : changes) {
    CAPTURE(key);
    Config other = r.cfg;
    apply_override(other, key + "=" + value);
    validate(other, "test");
    const std::string shown = key == "model.family" || key == "model.position" || key == "model.norm" ||
                                      key == "model.activation" || key == "model.attn_kernel" ||
                                      key == "model.attention_pattern" || key == "model.linear_feature"
                                  ? "\"" + value + "\""
                                  : value;
    CHECK_THAT(
        error_of([&] { save_checkpoint(dir.file("x.h5"), other, *r.model, nullptr, r.state, *r.tok); }),
        Contains("the config does not describe the model being saved: " + key + " is " + shown + " in the config"));
    CHECK_THAT(error_of([&] { check_resumable(other, model_config(other, V), r.cfg, V, "ck.h5"); }),
               Contains("ck.h5: " + key + " is "));
    CHECK_THAT(error_of([&] { check_resumable(other, model_config(other, V), r.cfg, V, "ck.h5"); }),
               Contains(" but " + shown + " now (it must not change across a resume)"));
  }
  CHECK_FALSE(fs::exists(dir.file("x.h5")));
  // The same model spelt differently (the tokenizer's size written out; train.recompute on) is
  // accepted by both.
  Config same = r.cfg;
  same.model.vocab_size = V;
  same.train.recompute = true;
  CHECK_NOTHROW(save_checkpoint(dir.file("y.h5"), same, *r.model, nullptr, r.state, *r.tok));
  CHECK_NOTHROW(check_resumable(same, model_config(same, V), r.cfg, V, "ck.h5"));
  CHECK_NOTHROW(
      check_resumable(r.cfg, r.model->config(), read_checkpoint_meta(dir.file("y.h5")).config.resolved(), V, "y.h5"));
}

TEST_CASE("prune_checkpoints keeps the newest keep_last by step number and never best.h5", "[checkpoint]") {
  TempDir dir;
  // The trainer zero-pads (ckpt_000100.h5); the step number decides, whatever the width.
  for (const char* name : {"ckpt_000005.h5", "ckpt_10.h5", "ckpt_000100.h5", "ckpt_20.h5", "ckpt_0.h5", "best.h5",
                           "ckpt_7.h5.tmp", "ckpt_x.h5", "ckpt_.h5", "notes.txt", "ckpt_-3.h5"})
    write_bytes(dir.file(name), {'x'});
  fs::create_directory(dir.file("ckpt_1.h5"));  // not a file: left alone
  prune_checkpoints(dir.path.string(), 2);
  // Lexicographic order would have kept ckpt_10 and ckpt_20.
  CHECK(files_in(dir) == std::set<std::string>{"ckpt_20.h5", "ckpt_000100.h5", "best.h5", "ckpt_7.h5.tmp", "ckpt_x.h5",
                                               "ckpt_.h5", "notes.txt", "ckpt_-3.h5", "ckpt_1.h5"});
  prune_checkpoints(dir.path.string(), 5);  // fewer than keep_last: nothing goes
  CHECK(files_in(dir).size() == 9);
  prune_checkpoints(dir.path.string(), 1);
  CHECK(files_in(dir).count("ckpt_20.h5") == 0);
  CHECK(files_in(dir).count("ckpt_000100.h5") == 1);
  CHECK(files_in(dir).count("best.h5") == 1);
  CHECK_THAT(error_of([&] { prune_checkpoints(dir.path.string(), 0); }), Contains("keep_last"));
  CHECK_THAT(error_of([&] { prune_checkpoints(dir.file("absent"), 3); }), Contains("cannot list"));
}

TEST_CASE("check_checkpoint_loads refuses what the loaders refuse, with their message naming the culprit",
          "[checkpoint][long]") {
  TempDir dir;
  const std::string good = dir.file("good.h5");
  Run r = make_run("gpt2");  // C = 32, 2 layers, 4 heads, block 16, AdamW moments, step 2
  save(r, good);
  const std::string V = std::to_string(r.tok->vocab_size());
  REQUIRE(error_of([&] { load_everything(good); }) == "(no error)");
  CHECK(check_checkpoint_loads(good).resume);
  CHECK(check_checkpoint_loads(good).inference);

  struct Case {
    const char* what;
    std::function<void(const std::string&)> corrupt;
    std::vector<std::string> culprit;  // what the one-line error must name
  };
  const std::string fc = "transformer.h.0.mlp.c_fc.weight";  // stored [in, out] = [32, 128]
  const std::vector<Case> cases = {
      {"a transposed weight",
       [&](const std::string& p) {
         replace_tensor(p, "/model/" + fc, {128, 32});
       },
       {"/model/" + fc, "[128,32]", "[32,128]"}},
      {"a reshaped embedding",
       [&](const std::string& p) {
         replace_tensor(p, "/model/transformer.wte.weight", {r.tok->vocab_size() * 2, 16});
       },
       {"/model/transformer.wte.weight", "[" + V + ",32]"}},
      {"a scalar where a matrix belongs",
       [](const std::string& p) { replace_with_scalar(p, "/model/transformer.h.1.attn.c_proj.weight"); },
       {"/model/transformer.h.1.attn.c_proj.weight has shape []", "[32,32]"}},
      {"a missing layer",
       [&](const std::string& p) {
         for (const auto& t : list_model_tensors(p))
           if (t.name.rfind("transformer.h.1.", 0) == 0) delete_object(p, "/model/" + t.name);
       },
       {"parameter transformer.h.1.ln_1.weight [32] is missing from /model"}},
      {"an extra tensor",
       [](const std::string& p) { replace_tensor(p, "/model/transformer.h.2.ln_1.weight", {32}); },
       {"/model/transformer.h.2.ln_1.weight is not a parameter of this model"}},
      {"config n_layer edited",
       [](const std::string& p) { edit_model_key(p, "n_layer", "3"); },
       {"parameter transformer.h.2.ln_1.weight [32] is missing"}},
      {"config n_embd edited",
       [](const std::string& p) { edit_model_key(p, "n_embd", "64"); },
       {"/model/transformer.wte.weight has shape [" + V + ",32] but this model expects [" + V + ",64]"}},
      {"config block_size edited",
       [](const std::string& p) { edit_model_key(p, "block_size", "32"); },
       {"/model/transformer.wpe.weight has shape [16,32] but this model expects [32,32]"}},
      {"config family edited",
       [](const std::string& p) { edit_model_key(p, "family", "\"llama\""); },
       {"model.embed_tokens.weight", "is missing from /model"}},
      {"config n_kv_head edited",
       [](const std::string& p) { edit_model_key(p, "n_kv_head", "2"); },
       {"/model/transformer.h.0.attn.c_attn.weight has shape [32,96] but this model expects [32,64]"}},
      {"config vocab_size edited",
       [&](const std::string& p) { edit_model_key(p, "vocab_size", "80"); },
       {"/model/transformer.wte.weight has shape [" + V + ",32] but this model expects [80,32]"}},
      {"a negative step",
       [](const std::string& p) { h5::File::open(p, true).set_attr("/", "step", int64_t{-3}); },
       {"negative step (-3)"}},
      {"a step past max_steps",
       [](const std::string& p) { h5::File::open(p, true).set_attr("/", "step", int64_t{1} << 40); },
       {"step 1099511627776 is past train.max_steps 100"}},
      {"an optimizer step past the step",
       [](const std::string& p) { h5::File::open(p, true).set_attr("optimizer", "step", int64_t{7}); },
       {"optimizer step (attribute step of /optimizer) is 7, past the checkpoint's step 2"}},
      {"a transposed AdamW moment",
       [&](const std::string& p) {
         replace_tensor(p, "/optimizer/" + fc + "/exp_avg_sq", {128, 32});
       },
       {"/optimizer/" + fc + "/exp_avg_sq has shape [128,32] but this model expects [32,128]"}},
      {"a missing AdamW moment",
       [](const std::string& p) { delete_object(p, "/optimizer/transformer.h.1.ln_2.bias"); },
       {"optimizer state of transformer.h.1.ln_2.bias is missing from /optimizer"}},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const std::string path = dir.file("bad.h5");
    fs::copy_file(good, path, fs::copy_options::overwrite_existing);
    c.corrupt(path);
    // The loaders refuse it, and the check says exactly what they say: the same code path.
    const std::string loaders = error_of([&] { load_everything(path); });
    const std::string checked = error_of([&] { check_checkpoint_loads(path); });
    CHECK(checked == loaders);
    CHECK_THAT(checked, Contains("[checkpoint] " + path + ": "));
    for (const std::string& name : c.culprit) CHECK_THAT(checked, Contains(name));
    CHECK(checked.find('\n') == std::string::npos);
  }

  // Weights only: loads for inference and --init-from, not for --resume.
  const std::string weights = dir.file("weights.h5");
  train::save_checkpoint(weights, r.cfg, *r.model, nullptr, r.state, *r.tok);
  CHECK_FALSE(check_checkpoint_loads(weights).resume);
  // A step past max_steps is never written.
  Run far = make_run("gpt2");
  far.state.step = far.cfg.train.max_steps + 1;
  CHECK_THAT(error_of([&] { save(far, dir.file("far.h5")); }), Contains("refusing to save step 101"));
}

TEST_CASE("qkv inspect prints step, tokens, tokenizer, config and every tensor, as text and JSON",
          "[checkpoint][cli]") {
  const std::string qkv = std::string(QKV_BINARY_DIR) + "/qkv";
  std::string out;
  if (::access(qkv.c_str(), X_OK) != 0 || run_command(qkv + " inspect --help 2>/dev/null", out) != 0) {
    WARN("the qkv binary with `inspect` is not built in " << QKV_BINARY_DIR << ": CLI not checked");
    return;
  }
  TempDir dir;
  const std::string path = dir.file("ckpt_2.h5");
  Run r = make_run("gpt2");
  save(r, path);

  REQUIRE(run_command(qkv + " inspect " + path + " --json 2>/dev/null", out) == 0);
  const std::string last = out.substr(out.find_last_of('\n', out.size() - 2) + 1);
  const nlohmann::json j = nlohmann::json::parse(last);
  CHECK(j["valid"] == true);
  CHECK(j["loads"] == nlohmann::json{{"inference", true}, {"init_from", true}, {"resume", true}});
  CHECK(j["step"] == 2);
  CHECK(j["tokens_seen"] == 12345);
  CHECK(j["config"] == to_toml(r.cfg));
  CHECK(j["tokenizer"]["kind"] == "char");
  CHECK(j["tokenizer"]["vocab_size"] == r.tok->vocab_size());
  CHECK(j["parameters"] == r.model->parameter_count());
  REQUIRE(j["tensors"].size() == r.model->named_parameters().size());
  std::map<std::string, nlohmann::json> by_name;
  int64_t sum = 0;
  for (const auto& t : j["tensors"]) {
    by_name[t["name"]] = t;
    int64_t n = 1;
    for (int64_t d : t["shape"]) n *= d;
    CHECK(t["numel"] == n);
    sum += n;
  }
  CHECK(sum == j["parameters"].get<int64_t>());
  CHECK(by_name.at("transformer.h.0.attn.c_attn.weight")["shape"] == nlohmann::json::array({32, 96}));
  CHECK(by_name.at("transformer.h.1.mlp.c_fc.weight")["numel"] == 32 * 128);
  // Listed in the model's order (as a state dict is), not HDF5's alphabetical one.
  const auto params = r.model->named_parameters();
  for (size_t i = 0; i < params.size(); ++i) CHECK(j["tensors"][i]["name"] == params[i].name);

  REQUIRE(run_command(qkv + " inspect " + path + " 2>/dev/null", out) == 0);
  CHECK_THAT(out,
             Contains("valid        loads for inference (sample, eval, export) and training (--init-from, --resume)"));
  CHECK_THAT(out, Contains("step         2") && Contains("tokens_seen  12345") &&
                      Contains("char, vocab " + std::to_string(r.tok->vocab_size())) &&
                      Contains("transformer.h.1.mlp.c_proj.weight") && Contains("[128,32]") && Contains("[model]"));

  std::ofstream(dir.file("junk.h5")) << "junk";
  CHECK(run_command(qkv + " inspect " + dir.file("junk.h5") + " 2>&1", out) == 2);
  CHECK_THAT(out, Contains(dir.file("junk.h5")) && Contains("not an HDF5 file"));
  CHECK(std::count(out.begin(), out.end(), '\n') == 1);

  // Weights only: valid, for inference and --init-from but not --resume.
  const std::string weights = dir.file("weights.h5");
  train::save_checkpoint(weights, r.cfg, *r.model, nullptr, r.state, *r.tok);
  REQUIRE(run_command(qkv + " inspect " + weights + " --json 2>/dev/null", out) == 0);
  CHECK(nlohmann::json::parse(out)["loads"]["resume"] == false);
  REQUIRE(run_command(qkv + " inspect " + weights + " 2>/dev/null", out) == 0);
  CHECK_THAT(out, Contains("training (--init-from; not --resume: no optimizer state)"));
}

TEST_CASE("qkv inspect refuses a checkpoint the loaders refuse: one line naming the culprit, exit 2",
          "[checkpoint][cli]") {
  const std::string qkv = std::string(QKV_BINARY_DIR) + "/qkv";
  std::string out;
  if (::access(qkv.c_str(), X_OK) != 0 || run_command(qkv + " inspect --help 2>/dev/null", out) != 0) {
    WARN("the qkv binary with `inspect` is not built in " << QKV_BINARY_DIR << ": CLI not checked");
    return;
  }
  TempDir dir;
  Run r = make_run("gpt2");
  const std::string tensor = dir.file("tensor.h5"), config = dir.file("config.h5");
  save(r, tensor);
  replace_tensor(tensor, "/model/transformer.h.0.mlp.c_fc.weight", {128, 32});  // transposed
  save(r, config);
  edit_model_key(config, "n_layer", "3");  // the checksum recomputed: only the loaders' checks see it
  for (const auto& [path, culprit] : {std::pair{tensor, std::string("/model/transformer.h.0.mlp.c_fc.weight")},
                                      std::pair{config, std::string("transformer.h.2.ln_1.weight")}}) {
    INFO(path);
    const std::string expected = error_of([&] { load_everything(path); });
    CHECK_THAT(expected, Contains(culprit));
    CHECK(run_command(qkv + " inspect " + path + " 2>&1 >/dev/null", out) == 2);  // stderr alone
    CHECK(out == "qkv: " + expected + "\n");
    CHECK(run_command(qkv + " inspect " + path + " 2>/dev/null", out) == 2);  // nothing listed
    CHECK(out.empty());
    CHECK(run_command(qkv + " inspect " + path + " --json 2>/dev/null", out) == 2);
    const nlohmann::json j = nlohmann::json::parse(out);
    CHECK(j["valid"] == false);
    CHECK(j["error"] == expected);
    CHECK(j["checkpoint"] == path);
    CHECK_FALSE(j.contains("tensors"));
  }
}
