// Hugging Face interop (train/hf_interop.h) without Python: the committed fixtures
// tests/reference/hf/ were made and scored by `transformers` 4.36.2 (make_hf_fixture.py), so
// importing them must give HF's loss (float64 reference, 1e-6 relative), logits and greedy
// continuation; export -> import must give back the same weights bit for bit; and everything HF
// cannot express or qkv cannot read is refused by name. (tests/interop/ checks the other
// direction against the real `transformers` when Python has it.)
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint_test_util.h"
#include "data/safetensors.h"
#include "tensor/dtype.h"
#include "train/evaluate.h"
#include "train/hf_interop.h"
#include "train/sampler.h"
#include "build_dir.h"

using namespace qkv;
using namespace qkv::ckpt_test;
namespace st = qkv::safetensors;
using nlohmann::json;

namespace {

std::string hf_fixture(const std::string& name) { return std::string(QKV_SOURCE_DIR) + "/tests/reference/hf/" + name; }

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.is_open());
  return json::parse(in);
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

struct Loaded {
  train::CheckpointMeta meta;
  std::unique_ptr<nn::DecoderModel> model;
};
Loaded load(const std::string& ckpt) {
  Loaded l;
  l.meta = train::read_checkpoint_meta(ckpt);
  l.model = train::build_model(l.meta.config.resolved(), l.meta.tokenizer->vocab_size());
  train::load_model_weights(ckpt, *l.model);
  l.model->eval();
  return l;
}

// A copy of fixture `name` in `dir` that carries a qkv byte tokenizer file (what `qkv export`
// writes for a byte model): the directory itself says its ids are bytes and rows past 255 are
// padding, which `--tokenizer byte` alone cannot say (train/hf_interop.h).
std::string with_byte_tokenizer(const TempDir& dir, const std::string& name) {
  const std::string d = dir.file(name + "_bytes");
  std::filesystem::copy(hf_fixture(name), d, std::filesystem::copy_options::recursive);
  write_text(
      d + "/qkv_tokenizer.json",
      json{{"format", "qkv-tokenizer-mapping"}, {"kind", "byte"}, {"qkv", json::parse(ByteTokenizer().serialize())}}
          .dump());
  return d;
}

// The imported fixture (directory `src`, default the fixture itself) against what transformers computed.
void check_against_fixture(const std::string& name, const train::HfImportOptions& opts,
                           const std::string& tokenizer_kind, std::string src = "") {
  TempDir dir;
  const json e = read_json_file(hf_fixture(name + ".expected.json"));
  const std::string ckpt = dir.file("imported.h5");
  const train::HfImportResult r = train::import_hf(src.empty() ? hf_fixture(name) : src, ckpt, opts);
  CHECK(r.tokenizer == tokenizer_kind);
  Loaded l = load(ckpt);
  const auto ids = e["ids"].get<std::vector<int32_t>>();
  CHECK(l.meta.tokenizer->encode(e["text"].get<std::string>()) == ids);
  const int64_t T = e["block_size"];
  REQUIRE(l.model->config().block_size == T);

  const double loss = train::evaluate_windows(*l.model, ids, name).mean();
  const double want = e["loss"];
  INFO(name << ": qkv " << loss << " transformers " << want);
  CHECK(std::abs(loss - want) <= 1e-6 * std::abs(want));

  Tensor x = Tensor::empty({1, T}, DType::i64);
  for (int64_t t = 0; t < T; ++t) x.data<int64_t>()[t] = ids[static_cast<size_t>(t)];
  nn::ForwardArgs a;
  a.ids = x;
  const Tensor logits = l.model->forward(a).contiguous();
  const auto want_logits = e["logits_first_window"].get<std::vector<double>>();
  double worst = 0;
  for (size_t i = 0; i < want_logits.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(logits.data<float>()[i]) - want_logits[i]));
  CHECK(worst < 1e-4);

  train::SampleOptions so;
  so.max_new_tokens = 12;
  so.temperature = 0;
  CHECK(train::generate(*l.model, e["prompt_ids"].get<std::vector<int32_t>>(), so) ==
        e["greedy"].get<std::vector<int32_t>>());
}

}  // namespace

TEST_CASE("hf import: a GPT2LMHeadModel saved by transformers gives its loss, logits and greedy tokens", "[hf]") {
  check_against_fixture("gpt2_tiny", {}, "gpt2_bpe");
}

TEST_CASE("hf import: a sharded bfloat16 LlamaForCausalLM with GQA gives its loss, logits and greedy tokens", "[hf]") {
  // Its 300 rows over byte ids: the directory's own byte tokenizer file declares rows 256.. padding.
  TempDir dir;
  check_against_fixture("llama_gqa_tiny", {}, "byte", with_byte_tokenizer(dir, "llama_gqa_tiny"));
  // Without tokenizer files the directory is refused, saying what to do.
  CHECK_THAT(error_of([&] { train::import_hf(hf_fixture("llama_gqa_tiny"), dir.file("x.h5")); }),
             Catch::Contains("no tokenizer files") && Catch::Contains("--tokenizer byte"));
}

TEST_CASE("hf export writes what the HF classes read and import gives the weights back bit for bit", "[hf]") {
  for (const std::string family : {"gpt2", "llama"}) {
    INFO(family);
    TempDir dir;
    Run run = make_run(family);
    const std::string ckpt = dir.file("run.h5");
    save(run, ckpt);
    const std::string out = dir.file("hf");
    const train::HfExportResult r = train::export_hf(ckpt, out);
    CHECK(r.tokenizer == "mapping");  // a char tokenizer is no HF tokenizer
    // ... and AutoTokenizer must refuse the folder rather than build an empty GPT2Tokenizer.
    CHECK(read_json_file(out + "/tokenizer_config.json")["tokenizer_class"] == "QkvTokenizerMappingNotForTransformers");
    const json cfg = read_json_file(out + "/config.json");
    const ModelSettings& m = run.cfg.model;
    if (family == "gpt2") {
      CHECK(cfg["architectures"] == json{"GPT2LMHeadModel"});
      CHECK(cfg["n_embd"] == m.n_embd);
      CHECK(cfg["n_positions"] == m.block_size);
      CHECK(cfg["activation_function"] == "gelu_new");
      CHECK(cfg["tie_word_embeddings"] == true);
    } else {
      CHECK(cfg["architectures"] == json{"LlamaForCausalLM"});
      CHECK(cfg["num_key_value_heads"] == 2);
      CHECK(cfg["num_attention_heads"] == 4);
      CHECK(cfg["rope_theta"] == m.rope_theta);
      CHECK(cfg["intermediate_size"] == m.resolved_ffn_hidden());
      CHECK(cfg["tie_word_embeddings"] == false);
    }
    CHECK(cfg["vocab_size"] == run.tok->vocab_size());
    // The safetensors file: every parameter, HF layout (gpt2's Conv1D [in, out]), F32.
    st::Reader rd(out + "/model.safetensors");
    CHECK(rd.header().metadata.at("format") == "pt");
    CHECK(static_cast<int64_t>(rd.header().tensors.size()) == r.tensors);
    for (const auto& p : run.model->named_parameters()) {
      const st::TensorInfo* t = rd.header().find(p.name);
      REQUIRE(t);
      CHECK(t->dtype == st::DType::F32);
      if (p.name.find("attn.c_attn.weight") != std::string::npos) {
        CHECK(t->shape == std::vector<int64_t>{p.tensor.shape()[1], p.tensor.shape()[0]});
        const auto v = rd.read_f32(*t);
        // element [in=1, out=2] of the file is our [out=2, in=1]
        CHECK(v[static_cast<size_t>(1 * t->shape[1] + 2)] == p.tensor.data<float>()[2 * p.tensor.shape()[1] + 1]);
      }
    }
    // Back: the same weights and tokenizer.
    const std::string back = dir.file("back.h5");
    train::import_hf(out, back);
    Loaded l = load(back);
    CHECK(same_weights(*l.model, snapshot(*run.model)));
    CHECK(l.meta.tokenizer->serialize() == run.tok->serialize());
    CHECK(nn::family_name(l.meta.config.model.family) == family);

    // bf16: each value rounded to nearest even.
    const std::string out16 = dir.file("hf16");
    train::HfExportOptions o;
    o.dtype = "bf16";
    train::export_hf(ckpt, out16, o);
    CHECK(read_json_file(out16 + "/config.json")["torch_dtype"] == "bfloat16");
    st::Reader r16(out16 + "/model.safetensors");
    const auto params = run.model->named_parameters();
    const auto& p0 = params.front();
    const auto v16 = r16.read_f32(*r16.header().find(p0.name));
    for (size_t i = 0; i < 50; ++i) CHECK(v16[i] == bf16_to_float(float_to_bf16(p0.tensor.data<float>()[i])));
  }
}

TEST_CASE("hf export of a gpt2_bpe model writes GPT-2's tokenizer files; re-import gives the same tokenizer", "[hf]") {
  TempDir dir;
  const std::string ckpt = dir.file("g.h5");
  train::import_hf(hf_fixture("gpt2_tiny"), ckpt);
  const std::string out = dir.file("hf");
  CHECK(train::export_hf(ckpt, out).tokenizer == "hf");
  for (const char* f : {"vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json",
                        "special_tokens_map.json", "generation_config.json"})
    CHECK(std::filesystem::exists(out + "/" + f));
  CHECK(read_json_file(out + "/config.json")["eos_token_id"] == 0);
  const std::string back = dir.file("back.h5");
  train::import_hf(out, back);
  CHECK(train::read_checkpoint_meta(back).tokenizer->serialize() ==
        train::read_checkpoint_meta(ckpt).tokenizer->serialize());
}

TEST_CASE("hf export refuses what the HF class cannot express, by key, and writes nothing", "[hf]") {
  const auto export_error = [](const std::string& family, const std::function<void(Config&)>& edit) {
    TempDir dir;
    Config cfg = tiny_config(family);
    edit(cfg);
    validate(cfg, "test");
    cfg = cfg.resolved();
    auto tok = CharTokenizer::train(kCorpus);
    auto model = train::build_model(cfg, tok->vocab_size());
    model->init_weights(3);
    train::save_checkpoint(dir.file("c.h5"), cfg, *model, nullptr, train::TrainState{}, *tok);
    const std::string msg = error_of([&] { train::export_hf(dir.file("c.h5"), dir.file("out")); });
    CHECK_FALSE(std::filesystem::exists(dir.file("out")));
    for (const auto& e : std::filesystem::directory_iterator(dir.path))
      CHECK(e.path().filename() == "c.h5");  // no temp left
    return msg;
  };
  CHECK_THAT(export_error("gpt2", [](Config& c) { c.model.position = nn::Position::rope; }),
             Catch::Contains("model.position = rope"));
  CHECK_THAT(export_error("gpt2", [](Config& c) { c.model.position = nn::Position::alibi; }),
             Catch::Contains("model.position = alibi"));
  CHECK_THAT(export_error("gpt2", [](Config& c) { c.model.n_kv_head = 2; }), Catch::Contains("model.n_kv_head = 2"));
  CHECK_THAT(export_error("gpt2", [](Config& c) { c.model.norm = nn::NormKind::rmsnorm; }),
             Catch::Contains("model.norm = rmsnorm"));
  CHECK_THAT(export_error("gpt2", [](Config& c) { c.model.window = 4; }), Catch::Contains("model.window = 4"));
  CHECK_THAT(export_error("llama", [](Config& c) { c.model.bias = true; }), Catch::Contains("model.bias = true"));
  CHECK_THAT(export_error("llama", [](Config& c) { c.model.activation = nn::Activation::gelu; }),
             Catch::Contains("model.activation = gelu"));

  TempDir dir;
  Run run = make_run("gpt2");
  save(run, dir.file("c.h5"));
  std::filesystem::create_directory(dir.file("taken"));
  CHECK_THAT(error_of([&] { train::export_hf(dir.file("c.h5"), dir.file("taken")); }),
             Catch::Contains("already exists"));
  train::HfExportOptions o;
  o.dtype = "f16";
  CHECK_THAT(error_of([&] { train::export_hf(dir.file("c.h5"), dir.file("x"), o); }), Catch::Contains("--dtype f16"));
}

TEST_CASE("hf import refuses pickles, unknown architectures, settings qkv lacks and mismatched tensors", "[hf]") {
  namespace fs = std::filesystem;
  TempDir dir;
  const auto copy_of = [&](const std::string& src, const std::string& name) {
    const std::string d = dir.file(name);
    fs::copy(hf_fixture(src), d, fs::copy_options::recursive);
    return d;
  };
  const auto import_error = [&](const std::string& d) {
    return error_of([&] { train::import_hf(d, dir.file("out.h5")); });
  };
  const auto edit_config = [&](const std::string& d, const std::function<void(json&)>& edit) {
    json c = read_json_file(d + "/config.json");
    edit(c);
    write_text(d + "/config.json", c.dump());
  };

  CHECK_THAT(import_error(dir.file("absent")), Catch::Contains("absent: not a directory"));
  // A pickle is refused, saying why.
  std::string d = copy_of("gpt2_tiny", "pickle");
  fs::rename(d + "/model.safetensors", d + "/pytorch_model.bin");
  CHECK_THAT(import_error(d), Catch::Contains("pytorch_model.bin") && Catch::Contains("arbitrary code"));

  d = copy_of("gpt2_tiny", "bert");
  edit_config(d, [](json& c) { c["architectures"] = {"BertForMaskedLM"}; });
  CHECK_THAT(import_error(d), Catch::Contains("\"BertForMaskedLM\" is not supported"));

  d = copy_of("llama_gqa_tiny", "scaled");
  edit_config(d, [](json& c) { c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; });
  CHECK_THAT(error_of([&] { train::import_hf(d, dir.file("o.h5"), {"byte"}); }),
             Catch::Contains("\"rope_scaling.type\" = \"linear\" cannot be imported"));

  // Mistral's sliding window is model.window; LlamaConfig has none, so a llama config carrying one
  // is refused.
  d = with_byte_tokenizer(dir, "llama_gqa_tiny");
  edit_config(d, [](json& c) { c["sliding_window"] = 16; });
  CHECK_THAT(error_of([&] { train::import_hf(d, dir.file("o.h5"), {"byte"}); }),
             Catch::Contains("\"sliding_window\" = 16") && Catch::Contains("LlamaForCausalLM has no sliding window"));
  edit_config(d, [](json& c) { c["architectures"] = {"MistralForCausalLM"}; });
  train::import_hf(d, dir.file("mistral_w.h5"));
  CHECK(train::read_checkpoint_meta(dir.file("mistral_w.h5")).config.model.window == 16);
  edit_config(d, [](json& c) { c["sliding_window"] = nullptr; });
  CHECK_NOTHROW(train::import_hf(d, dir.file("mistral.h5")));

  d = copy_of("gpt2_tiny", "activation");
  edit_config(d, [](json& c) { c["activation_function"] = "silu"; });
  CHECK_THAT(import_error(d), Catch::Contains("\"activation_function\" = \"silu\""));

  // A config that disagrees with the tensors: the shape error names the tensor.
  d = copy_of("gpt2_tiny", "shape");
  edit_config(d, [](json& c) { c["n_inner"] = 64; });
  CHECK_THAT(import_error(d), Catch::Contains("\"transformer.h.0.mlp.c_fc.weight\" has shape [32,128]"));

  // A tensor missing, and one that is not a parameter.
  st::Reader src(hf_fixture("gpt2_tiny/model.safetensors"));
  std::vector<st::WriteTensor> ts;
  for (const auto& t : src.header().tensors) ts.push_back({t.name, t.dtype, t.shape, src.read_bytes(t)});
  d = copy_of("gpt2_tiny", "missing");
  auto fewer = ts;
  fewer.erase(std::remove_if(fewer.begin(), fewer.end(), [](auto& t) { return t.name == "transformer.ln_f.bias"; }),
              fewer.end());
  write_text(d + "/model.safetensors", st::serialize(fewer, {{"format", "pt"}}));
  CHECK_THAT(import_error(d), Catch::Contains("\"transformer.ln_f.bias\" is missing"));
  d = copy_of("gpt2_tiny", "extra");
  auto more = ts;
  more.push_back({"transformer.h.0.attn.extra", st::DType::F32, {1}, std::string(4, '\0')});
  write_text(d + "/model.safetensors", st::serialize(more, {{"format", "pt"}}));
  CHECK_THAT(import_error(d), Catch::Contains("\"transformer.h.0.attn.extra\" is not a parameter"));

  // The original GPT-2 files name tensors without "transformer."; HF's buffers are skipped.
  d = copy_of("gpt2_tiny", "unprefixed");
  auto bare = ts;
  for (auto& t : bare)
    if (t.name.rfind("transformer.", 0) == 0) t.name = t.name.substr(12);
  bare.push_back({"h.0.attn.bias", st::DType::F32, {1}, std::string(4, '\0')});
  write_text(d + "/model.safetensors", st::serialize(bare, {{"format", "pt"}}));
  train::import_hf(d, dir.file("bare.h5"));
  train::import_hf(hf_fixture("gpt2_tiny"), dir.file("ref.h5"));
  CHECK(same_weights(*load(dir.file("bare.h5")).model, snapshot(*load(dir.file("ref.h5")).model)));

  // A shard index pointing outside the directory is refused.
  d = copy_of("llama_gqa_tiny", "escape");
  json idx = read_json_file(d + "/model.safetensors.index.json");
  idx["weight_map"]["lm_head.weight"] = "../../etc/passwd.safetensors";
  write_text(d + "/model.safetensors.index.json", idx.dump());
  CHECK_THAT(error_of([&] { train::import_hf(d, dir.file("o.h5"), {"byte"}); }),
             Catch::Contains("not a .safetensors file name inside"));
}

TEST_CASE("hf config.json values of the wrong JSON type are refused naming the file and key", "[hf]") {
  namespace fs = std::filesystem;
  TempDir dir;
  const std::string d = dir.file("typed");
  fs::copy(hf_fixture("gpt2_tiny"), d, fs::copy_options::recursive);
  const json original = read_json_file(d + "/config.json");
  const std::pair<const char*, json> cases[] = {{"n_layer", "12"},
                                                {"n_layer", -1},
                                                {"layer_norm_epsilon", "1e-5"},
                                                {"tie_word_embeddings", 1},
                                                {"activation_function", json::array({"gelu"})}};
  const char* const want[] = {"not a non-negative integer", "not a non-negative integer", "not a number",
                              "not true or false", "not a string"};
  for (size_t i = 0; i < std::size(cases); ++i) {
    json c = original;
    c[cases[i].first] = cases[i].second;
    write_text(d + "/config.json", c.dump());
    CHECK(error_of([&] { train::import_hf(d, dir.file("o.h5")); }) ==
          d + "/config.json: \"" + cases[i].first + "\" is " + cases[i].second.dump() + ", " + want[i]);
  }
}

TEST_CASE("hf tokenizer files with a value of the wrong JSON type are refused naming the file and key", "[hf]") {
  TempDir dir;
  const std::string d = dir.file("mapping");
  std::filesystem::create_directories(d);
  const json byte = json::parse(ByteTokenizer().serialize());
  write_text(d + "/qkv_tokenizer.json", json{{"format", 5}, {"qkv", byte}}.dump());
  CHECK(error_of([&] { train::read_hf_tokenizer(d, ""); }) == d + "/qkv_tokenizer.json: \"format\" is 5, not a string");
  write_text(d + "/qkv_tokenizer.json",
             json{{"format", "qkv-tokenizer-mapping"}, {"qkv", {{"kind", "byte"}, {"version", "1"}}}}.dump());
  CHECK(error_of([&] { train::read_hf_tokenizer(d, ""); }) ==
        d + "/qkv_tokenizer.json: [tokenizer] stored byte tokenizer has version \"1\", this build reads version 1");
  write_text(d + "/qkv_tokenizer.json", json{{"format", "qkv-tokenizer-mapping"}, {"qkv", byte}}.dump());
  CHECK(std::string(train::read_hf_tokenizer(d, "")->kind()) == "byte");
}

TEST_CASE("train --init-from an HF directory starts from its weights and refuses another network or tokenizer",
          "[hf]") {
  const std::string qkv = std::string(QKV_BINARY_DIR) + "/qkv";
  if (!std::filesystem::exists(qkv)) {
    WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
    return;
  }
  TempDir dir;
  const std::string hf = hf_fixture("gpt2_tiny");
  // The corpus tokenized with the directory's GPT-2 BPE (what `qkv prepare --tokenizer-from` does).
  std::string corpus;
  for (int i = 0; i < 40; ++i)
    corpus += std::string(kCorpus) + " It was the age of wisdom, it was the age of foolishness.\n";
  write_text(dir.file("corpus.txt"), corpus);
  std::string out;
  REQUIRE(run_command(qkv + " prepare --input " + dir.file("corpus.txt") + " --tokenizer-from " + hf + " --out " +
                          dir.file("data.h5") + " --json 2>/dev/null",
                      out) == 0);
  CHECK(json::parse(out.substr(out.rfind('{')))["tokenizer"] == "gpt2_bpe");
  write_text(dir.file("ft.toml"),
             "[model]\nfamily = \"gpt2\"\nn_layer = 2\nn_head = 4\nn_embd = 32\nblock_size = 32\n"
             "vocab_size = 662\n[data]\npath = \"" +
                 dir.file("data.h5") +
                 "\"\ntokenizer = \"gpt2_bpe\"\n"
                 "separator = \"none\"\n[train]\nbatch_size = 2\nmax_steps = 1\nlr = 0\nmin_lr = 0\n"
                 "eval_interval = 1000\nout_dir = \"" +
                 dir.file("run") + "\"\n");
  const std::string train = qkv + " train --config " + dir.file("ft.toml") + " --init-from " + hf + " --json";
  // lr 0: the one step leaves the weights as they were loaded.
  REQUIRE(run_command(train + " 2>/dev/null", out) == 0);
  const std::string ckpt = json::parse(out.substr(out.rfind('{')))["checkpoint"];
  train::import_hf(hf, dir.file("imported.h5"));
  CHECK(same_weights(*load(ckpt).model, snapshot(*load(dir.file("imported.h5")).model)));
  // Another network, or data tokenized otherwise, is refused naming what differs.
  CHECK(run_command(train + " --set model.n_embd=64 --set train.out_dir=" + dir.file("run2") + " 2>/dev/null", out) ==
        2);
  CHECK_THAT(out, Catch::Contains("model.n_embd is 32 there but 64"));
  REQUIRE(run_command(qkv + " prepare --input " + dir.file("corpus.txt") + " --tokenizer byte --out " +
                          dir.file("bytes.h5") + " >/dev/null 2>&1",
                      out) == 0);
  CHECK(run_command(train + " --set data.path=" + dir.file("bytes.h5") +
                        " --set data.tokenizer=byte --set train.out_dir=" + dir.file("run3") + " 2>/dev/null",
                    out) == 2);
  CHECK_THAT(out, Catch::Contains("its tokenizer (gpt2_bpe, 662 tokens) is not the one of data.path (byte"));
}

// ---- the file schema of transformers 5 ----
// tests/reference/hf5/ holds the small files transformers 5 wrote when it loaded and saved the
// fixtures above again (make_hf5_fixture.py): config.json with "rope_parameters" and "dtype",
// GPT-2's tokenizer.json with a TemplateProcessing post_processor. Saving again changes no tensor,
// so each test puts them beside the 4.36 fixture's weights.
namespace {

std::string hf5_fixture(const std::string& name) {
  return std::string(QKV_SOURCE_DIR) + "/tests/reference/hf5/" + name;
}

// A directory holding hf/<name>'s weights and hf5/<files_of>'s files (default hf5/<name>), plus,
// for the llama, the byte tokenizer file that with_byte_tokenizer adds.
std::string tf5_directory(const TempDir& dir, const std::string& name, std::string files_of = "") {
  namespace fs = std::filesystem;
  if (files_of.empty()) files_of = name;
  const std::string d = dir.file(files_of + "_tf5");
  fs::create_directories(d);
  for (const auto& e : fs::directory_iterator(hf_fixture(name))) {
    const std::string f = e.path().filename().string();
    if (f.find(".safetensors") != std::string::npos) fs::copy(e.path(), d + "/" + f);
  }
  for (const auto& e : fs::directory_iterator(hf5_fixture(files_of)))
    fs::copy(e.path(), d + "/" + e.path().filename().string());
  if (name == "llama_gqa_tiny")
    write_text(
        d + "/qkv_tokenizer.json",
        json{{"format", "qkv-tokenizer-mapping"}, {"kind", "byte"}, {"qkv", json::parse(ByteTokenizer().serialize())}}
            .dump());
  return d;
}

void edit_json(const std::string& path, const std::function<void(json&)>& edit) {
  json j = read_json_file(path);
  edit(j);
  write_text(path, j.dump());
}

// The logits of the first block of fixture `name`'s ids under the model imported from `src`.
std::vector<float> imported_logits(const std::string& src, const std::string& name) {
  TempDir dir;
  train::import_hf(src, dir.file("m.h5"));
  Loaded l = load(dir.file("m.h5"));
  const json e = read_json_file(hf_fixture(name + ".expected.json"));
  const auto ids = e["ids"].get<std::vector<int32_t>>();
  const int64_t T = e["block_size"];
  Tensor x = Tensor::empty({1, T}, DType::i64);
  for (int64_t t = 0; t < T; ++t) x.data<int64_t>()[t] = ids[static_cast<size_t>(t)];
  nn::ForwardArgs a;
  a.ids = x;
  const Tensor logits = l.model->forward(a).contiguous();
  return std::vector<float>(logits.data<float>(), logits.data<float>() + logits.numel());
}

}  // namespace

TEST_CASE("hf import: a GPT2LMHeadModel and tokenizer saved by transformers 5 give transformers' numbers", "[hf]") {
  // tokenizer.json only (no vocab.json), post_processor TemplateProcessing $A, "dtype" for "torch_dtype".
  TempDir dir;
  const std::string d = tf5_directory(dir, "gpt2_tiny");
  REQUIRE_FALSE(std::filesystem::exists(d + "/vocab.json"));
  REQUIRE(read_json_file(d + "/tokenizer.json")["post_processor"]["type"] == "TemplateProcessing");
  check_against_fixture("gpt2_tiny", {}, "gpt2_bpe", d);
}

TEST_CASE("hf import: a llama saved by transformers 5 takes its RoPE base from rope_parameters", "[hf]") {
  TempDir dir;
  const std::string d = tf5_directory(dir, "llama_gqa_tiny");
  const json cfg = read_json_file(d + "/config.json");
  REQUIRE_FALSE(cfg.contains("rope_theta"));
  REQUIRE(cfg["rope_parameters"]["rope_theta"] == 500.0);
  // transformers' own loss, logits and greedy tokens (computed with base 500) ...
  check_against_fixture("llama_gqa_tiny", {}, "byte", d);
  train::import_hf(d, dir.file("m.h5"));
  CHECK(train::read_checkpoint_meta(dir.file("m.h5")).config.model.rope_theta == 500.0);
  // ... the same logits, bit for bit, as the 4.36 file stating base 500 at the top level ...
  const std::vector<float> nested = imported_logits(d, "llama_gqa_tiny");
  CHECK(nested == imported_logits(with_byte_tokenizer(dir, "llama_gqa_tiny"), "llama_gqa_tiny"));
  // ... and not those of the default base 10000, which a reader of the top level alone would use.
  edit_json(d + "/config.json", [](json& c) { c["rope_parameters"]["rope_theta"] = 10000.0; });
  const std::vector<float> base10k = imported_logits(d, "llama_gqa_tiny");
  REQUIRE(base10k.size() == nested.size());
  double worst = 0;
  for (size_t i = 0; i < nested.size(); ++i) worst = std::max(worst, std::abs(double(nested[i]) - base10k[i]));
  CHECK(worst > 1e-2);
}

TEST_CASE("hf import refuses RoPE settings qkv lacks, in either schema, and bases that disagree", "[hf]") {
  TempDir dir;
  const std::string scaled = tf5_directory(dir, "llama_gqa_tiny", "llama_gqa_tiny_llama3");
  CHECK_THAT(error_of([&] { train::import_hf(scaled, dir.file("o.h5")); }),
             Catch::Contains(scaled + "/config.json: \"rope_parameters.rope_type\" = \"llama3\" cannot be imported") &&
                 Catch::Contains("no scaling"));

  const std::string d = tf5_directory(dir, "llama_gqa_tiny");
  const json original = read_json_file(d + "/config.json");
  const auto error_with = [&](const std::function<void(json&)>& edit) {
    json c = original;
    edit(c);
    write_text(d + "/config.json", c.dump());
    return error_of([&] { train::import_hf(d, dir.file("o.h5")); });
  };
  const auto rope_theta_of = [&](const std::function<void(json&)>& edit) {
    REQUIRE(error_with(edit) == "(no error)");
    return train::read_checkpoint_meta(dir.file("o.h5")).config.model.rope_theta;
  };
  // Both schemas stating one base: read. Absent everywhere: transformers' default, 10000.
  CHECK(rope_theta_of([](json& c) { c["rope_theta"] = 500.0; }) == 500.0);
  CHECK(rope_theta_of([](json& c) { c.erase("rope_parameters"); }) == 10000.0);
  CHECK(rope_theta_of([](json& c) { c["rope_parameters"] = {{"type", "default"}}; }) == 10000.0);
  // Two bases: which one a reader takes depends on its transformers version.
  CHECK_THAT(error_with([](json& c) { c["rope_theta"] = 10000.0; }),
             Catch::Contains("\"rope_theta\" = 10000.0 and \"rope_parameters.rope_theta\" = 500.0 disagree"));
  CHECK_THAT(
      error_with([](json& c) {
        c["rope_scaling"] = {{"rope_type", "default"}, {"rope_theta", 700.0}};
      }),
      Catch::Contains("\"rope_scaling.rope_theta\" = 700.0 and \"rope_parameters.rope_theta\" = 500.0 disagree"));
  // Scaled variants, in the 4.x key and the 5.x one.
  CHECK_THAT(error_with([](json& c) {
               c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
             }),
             Catch::Contains("\"rope_scaling.type\" = \"linear\" cannot be imported"));
  CHECK_THAT(error_with([](json& c) { c["rope_parameters"]["rope_type"] = "yarn"; }),
             Catch::Contains("\"rope_parameters.rope_type\" = \"yarn\" cannot be imported"));
  CHECK_THAT(error_with([](json& c) { c["rope_parameters"]["factor"] = 2.0; }),
             Catch::Contains("\"rope_parameters.factor\" = 2.0 cannot be imported"));
  CHECK_THAT(error_with([](json& c) { c["rope_parameters"]["partial_rotary_factor"] = 0.5; }),
             Catch::Contains("\"rope_parameters.partial_rotary_factor\" = 0.5 cannot be imported"));
  CHECK(error_with([](json& c) { c["rope_parameters"]["partial_rotary_factor"] = 1.0; }) == "(no error)");
  CHECK_THAT(error_with([](json& c) {
               c["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 500.0}}}};
             }),
             Catch::Contains("\"rope_parameters.full_attention\"") && Catch::Contains("per layer type"));
  CHECK(error_with([](json& c) { c["rope_parameters"] = "default"; }) ==
        d + "/config.json: \"rope_parameters\" is \"default\", not an object");
  CHECK(error_with([](json& c) { c["rope_parameters"]["rope_theta"] = "500"; }) ==
        d + "/config.json: \"rope_parameters.rope_theta\" is \"500\", not a number");
  // The rest of what transformers 5 writes: per-layer attention kinds, the head size.
  CHECK(error_with([](json& c) { c["layer_types"] = {"full_attention", "full_attention"}; }) == "(no error)");
  CHECK_THAT(error_with([](json& c) {
               c["layer_types"] = {"full_attention", "sliding_attention"};
             }),
             Catch::Contains("\"layer_types\" = [\"full_attention\",\"sliding_attention\"] cannot be imported"));
  CHECK_THAT(error_with([](json& c) { c["layer_types"] = {"full_attention"}; }),
             Catch::Contains("\"layer_types\" has 1 entries but num_hidden_layers is 2"));
  CHECK_THAT(error_with([](json& c) { c["head_dim"] = 16; }), Catch::Contains("\"head_dim\" = 16 cannot be imported"));
}

TEST_CASE("hf tokenizer.json post_processors: templates adding no token are read, ones adding tokens are refused",
          "[hf]") {
  TempDir dir;
  const std::string d = tf5_directory(dir, "gpt2_tiny");
  const json original = read_json_file(d + "/tokenizer.json");
  const json add_bos = read_json_file(d + "/post_processor_add_bos.json");
  const std::string text = "It was the best of times, Café 東京 😀 <|endoftext|> 2024!\n";
  const std::vector<int32_t> want = train::read_hf_tokenizer(hf_fixture("gpt2_tiny"))->encode(text);
  // "(no error)" when the tokenizer is read and gives the ids of the 4.36 files; else the error.
  const auto with_post_processor = [&](const json& p) {
    json j = original;
    j["post_processor"] = p;
    write_text(d + "/tokenizer.json", j.dump());
    std::vector<int32_t> ids;
    const std::string error = error_of([&] { ids = train::read_hf_tokenizer(d)->encode(text); });
    return error != "(no error)" ? error : ids == want ? error : std::string("other ids");
  };
  // transformers 5's GPT-2 template ($A; pair $A $B), ByteLevel, and a Sequence of both.
  CHECK(with_post_processor(original["post_processor"]) == "(no error)");
  CHECK(with_post_processor({{"type", "ByteLevel"}, {"trim_offsets", true}}) == "(no error)");
  CHECK(with_post_processor({{"type", "Sequence"},
                             {"processors", {{{"type", "ByteLevel"}}, original["post_processor"]}}}) == "(no error)");
  // The template transformers 5 writes for add_bos_token=True adds <|endoftext|>: refused, naming it.
  REQUIRE(add_bos["type"] == "TemplateProcessing");
  CHECK_THAT(with_post_processor(add_bos),
             Catch::StartsWith(d + "/tokenizer.json: ") &&
                 Catch::EndsWith("post_processor adds the special token \"<|endoftext|>\", which qkv's encode would "
                                 "not add"));
  CHECK_THAT(with_post_processor({{"type", "Sequence"}, {"processors", {{{"type", "ByteLevel"}}, add_bos}}}),
             Catch::Contains("adds the special token \"<|endoftext|>\""));
  json pair_only = original["post_processor"];
  pair_only["pair"].push_back({{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 1}}}});
  CHECK_THAT(with_post_processor(pair_only), Catch::Contains("adds the special token \"[SEP]\""));
  json twice = original["post_processor"];
  twice["single"].push_back(twice["single"][0]);
  CHECK_THAT(with_post_processor(twice), Catch::Contains("post_processor.single holds 2 sequence items"));
  CHECK_THAT(with_post_processor({{"type", "RobertaProcessing"}}),
             Catch::Contains("post_processor.type is \"RobertaProcessing\", which adds tokens"));
  // transformers adds BOS / EOS around every encoding when tokenizer_config.json asks for it.
  for (const char* key : {"add_bos_token", "add_eos_token"}) {
    const std::string v4 = dir.file(std::string("v4_") + key);
    std::filesystem::copy(hf_fixture("gpt2_tiny"), v4, std::filesystem::copy_options::recursive);
    edit_json(v4 + "/tokenizer_config.json", [&](json& c) { c[key] = true; });
    CHECK(error_of([&] { train::read_hf_tokenizer(v4); }) ==
          v4 + "/tokenizer_config.json: \"" + key +
              "\" = true cannot be imported: transformers adds that token to every encoding, qkv's encode does not");
    edit_json(v4 + "/tokenizer_config.json", [&](json& c) { c[key] = false; });
    CHECK(train::read_hf_tokenizer(v4)->encode(text) == want);
  }
  // ignore_merges takes a whole word from the vocabulary, skipping the merges qkv applies.
  json j = original;
  j["model"]["ignore_merges"] = true;
  write_text(d + "/tokenizer.json", j.dump());
  CHECK_THAT(error_of([&] { train::read_hf_tokenizer(d); }), Catch::Contains("model.ignore_merges = true"));
}

TEST_CASE("hf export of a byte model writes GPT-2 files that give the bytes as ids, read back as bytes", "[hf]") {
  TempDir dir;
  for (const std::string family : {"gpt2", "llama"}) {
    Config cfg = tiny_config(family);
    cfg.data.tokenizer = TokenizerKind::byte;
    validate(cfg, "test");
    cfg = cfg.resolved();
    ByteTokenizer tok;
    auto model = train::build_model(cfg, tok.vocab_size());
    model->init_weights(5);
    const std::string ckpt = dir.file(family + ".h5"), out = dir.file(family + "_hf");
    train::save_checkpoint(ckpt, cfg, *model, nullptr, train::TrainState{}, tok);
    CHECK(train::export_hf(ckpt, out).tokenizer == "hf");
    CHECK_FALSE(std::filesystem::exists(out + "/qkv_tokenizer.json"));
    CHECK(read_json_file(out + "/tokenizer.json")["model"]["vocab"] == read_json_file(out + "/vocab.json"));
    const json vocab = read_json_file(out + "/vocab.json");
    REQUIRE(vocab.size() == 256);
    CHECK(vocab["A"] == 65);
    CHECK(vocab["\xc4\xa0"] == 32);  // GPT-2's alphabet moves the space to U+0120
    // No special token: with the keys absent, transformers' GPT2Tokenizer would add "<|endoftext|>"
    // as id 256, and that text would no longer be its bytes.
    const json tc = read_json_file(out + "/tokenizer_config.json");
    for (const char* k : {"bos_token", "eos_token", "unk_token", "pad_token"}) CHECK(tc.at(k).is_null());
    // Read back: GPT-2 BPE of exactly the bytes is the byte tokenizer.
    const auto back = train::read_hf_tokenizer(out);
    CHECK(std::string(back->kind()) == "byte");
    const std::string text = "Café <|endoftext|> 😀\n\t";
    CHECK(back->encode(text) == tok.encode(text));
    train::import_hf(out, dir.file(family + "_back.h5"));
    CHECK(train::read_checkpoint_meta(dir.file(family + "_back.h5")).tokenizer->serialize() == tok.serialize());
  }
  // A GPT-2 BPE with a single merge is no byte tokenizer.
  const std::string d = dir.file("merged");
  std::filesystem::create_directories(d);
  json vocab = read_json_file(dir.file("gpt2_hf") + "/vocab.json");
  vocab["ab"] = 256;
  write_text(d + "/vocab.json", vocab.dump());
  write_text(d + "/merges.txt", "#version: 0.2\na b\n");
  CHECK(std::string(train::read_hf_tokenizer(d)->kind()) == "gpt2_bpe");
}
