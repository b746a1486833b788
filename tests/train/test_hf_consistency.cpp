// Exact or refused (train/hf_interop.h, train/checkpoint.h): an export writes a model Hugging Face
// computes the same way or refuses naming the setting; an import or a checkpoint load consumes
// every tensor it is given and refuses a file whose config and tensors disagree; a tokenizer must
// decode the ids the model can produce, and qkv's own BPE survives export and import.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint_test_util.h"
#include "data/h5.h"
#include "data/safetensors.h"
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

// A checkpoint of `cfg` (edited from the family's tiny config) with `tok` and non-trivial weights.
void save_model(const std::string& path, Config cfg, const Tokenizer& tok) {
  validate(cfg, "test");
  cfg = cfg.resolved();
  auto model = train::build_model(cfg, tok.vocab_size());
  model->init_weights(11);
  train::save_checkpoint(path, cfg, *model, nullptr, train::TrainState{}, tok);
}

double loss_of(const Loaded& l, const std::vector<int32_t>& ids) {
  return train::evaluate_windows(*l.model, ids, "test").mean();
}

// Text in kCorpus's characters (what the char tokenizers of these tests can encode), 8 windows long.
std::string char_text() {
  std::string s;
  for (int i = 0; i < 8; ++i) s += kCorpus;
  return s;
}

}  // namespace

TEST_CASE("hf export refuses sparse and linear attention patterns instead of writing plain attention", "[hf]") {
  const auto export_error = [](const std::string& family, const std::vector<std::string>& sets) {
    TempDir dir;
    Config cfg = tiny_config(family);
    for (const std::string& s : sets) apply_override(cfg, s);
    auto tok = CharTokenizer::train(kCorpus);
    save_model(dir.file("c.h5"), cfg, *tok);
    const std::string msg = error_of([&] { train::export_hf(dir.file("c.h5"), dir.file("out")); });
    CHECK_FALSE(std::filesystem::exists(dir.file("out")));
    return msg;
  };
  for (const std::string family : {"gpt2", "llama"}) {
    INFO(family);
    for (const std::string pattern : {"strided", "global", "bigbird", "block_sparse"})
      CHECK_THAT(export_error(family, {"model.attention_pattern=" + pattern}),
                 Catch::Contains("model.attention_pattern = " + pattern + " cannot be exported") &&
                     Catch::Contains("sparse pattern would be dropped"));
    CHECK_THAT(export_error(family, {"model.attention_pattern=linear"}),
               Catch::Contains("model.attention_pattern = linear cannot be exported"));
  }
  // GPT-2 has no sliding window in any spelling.
  CHECK_THAT(export_error("gpt2", {"model.window=4"}), Catch::Contains("model.window = 4 cannot be exported"));
  CHECK_THAT(export_error("gpt2", {"model.attention_pattern=window"}),
             Catch::Contains("model.attention_pattern = window cannot be exported"));
}

TEST_CASE("hf export of a llama model with a sliding window is a MistralForCausalLM that imports to the same loss",
          "[hf]") {
  TempDir dir;
  auto tok = CharTokenizer::train(kCorpus);
  const std::vector<int32_t> ids = tok->encode(char_text());
  Config cfg = tiny_config("llama");
  cfg.model.window = 4;
  save_model(dir.file("w.h5"), cfg, *tok);
  const train::HfExportResult r = train::export_hf(dir.file("w.h5"), dir.file("hf"));
  CHECK(r.architecture == "MistralForCausalLM");
  const json c = read_json_file(dir.file("hf/config.json"));
  CHECK(c["architectures"] == json{"MistralForCausalLM"});
  CHECK(c["model_type"] == "mistral");
  CHECK(c["sliding_window"] == 4);
  train::import_hf(dir.file("hf"), dir.file("back.h5"));
  const Loaded a = load(dir.file("w.h5")), b = load(dir.file("back.h5"));
  CHECK(b.model->config().window == 4);
  const double want = loss_of(a, ids);
  CHECK(loss_of(b, ids) == want);
  // The window matters for this text (T = 16 > 4): dropping it would change the loss.
  Config full = a.meta.config;
  full.model.window = 0;
  auto unwindowed = train::build_model(full.resolved(), tok->vocab_size());
  train::load_model_weights(dir.file("w.h5"), *unwindowed);
  CHECK(std::abs(train::evaluate_windows(*unwindowed, ids, "test").mean() - want) > 1e-4);

  // The "window" attention pattern of width l is the same mask: exported as sliding_window = l.
  Config pat = tiny_config("llama");
  apply_override(pat, "model.attention_pattern=window");
  pat.model.pattern_local = 4;
  save_model(dir.file("p.h5"), pat, *tok);
  train::export_hf(dir.file("p.h5"), dir.file("hfp"));
  CHECK(read_json_file(dir.file("hfp/config.json"))["sliding_window"] == 4);
  train::import_hf(dir.file("hfp"), dir.file("pback.h5"));
  const double pl = loss_of(load(dir.file("p.h5")), ids);
  CHECK(std::abs(loss_of(load(dir.file("pback.h5")), ids) - pl) <= 1e-6 * pl);
}

TEST_CASE("hf import takes a tied model's lm_head.weight only when it is the embedding bit for bit", "[hf]") {
  namespace fs = std::filesystem;
  TempDir dir;
  st::Reader src(hf_fixture("gpt2_tiny/model.safetensors"));
  REQUIRE(read_json_file(hf_fixture("gpt2_tiny/config.json")).value("tie_word_embeddings", true));
  std::vector<st::WriteTensor> ts;
  for (const auto& t : src.header().tensors) ts.push_back({t.name, t.dtype, t.shape, src.read_bytes(t)});
  const st::TensorInfo* wte = src.header().find("transformer.wte.weight");
  REQUIRE(wte);
  REQUIRE(wte->dtype == st::DType::F32);
  const auto with_head = [&](const std::string& name, const std::string& bytes) {
    const std::string d = dir.file(name);
    fs::copy(hf_fixture("gpt2_tiny"), d, fs::copy_options::recursive);
    auto more = ts;
    more.push_back({"lm_head.weight", wte->dtype, wte->shape, bytes});
    write_text(d + "/model.safetensors", st::serialize(more, {{"format", "pt"}}));
    return d;
  };
  // The same tensor saved twice (what transformers does for some models): accepted.
  CHECK_NOTHROW(train::import_hf(with_head("same", src.read_bytes(*wte)), dir.file("same.h5")));
  // One element off: the head is its own, and tying would drop it.
  std::string other = src.read_bytes(*wte);
  float v;
  std::memcpy(&v, other.data() + 4 * 5, 4);
  v += 0.25f;
  std::memcpy(other.data() + 4 * 5, &v, 4);
  CHECK_THAT(error_of([&] { train::import_hf(with_head("other", other), dir.file("other.h5")); }),
             Catch::Contains("\"lm_head.weight\" differs from the tied embedding") && Catch::Contains("at element 5") &&
                 Catch::Contains("tie_word_embeddings"));
  CHECK_FALSE(fs::exists(dir.file("other.h5")));
}

TEST_CASE("hf import refuses a tensor it would not consume, naming it", "[hf]") {
  namespace fs = std::filesystem;
  TempDir dir;
  st::Reader src(hf_fixture("gpt2_tiny/model.safetensors"));
  const int64_t n_layer = read_json_file(hf_fixture("gpt2_tiny/config.json"))["n_layer"];
  std::vector<st::WriteTensor> ts;
  for (const auto& t : src.header().tensors) ts.push_back({t.name, t.dtype, t.shape, src.read_bytes(t)});
  // A layer past config.json's n_layer (the tensors say one more layer than the config).
  const std::string extra = "transformer.h." + std::to_string(n_layer) + ".ln_1.weight";
  const st::TensorInfo* ln = src.header().find("transformer.h.0.ln_1.weight");
  REQUIRE(ln);
  ts.push_back({extra, ln->dtype, ln->shape, src.read_bytes(*ln)});
  const std::string d = dir.file("extra_layer");
  fs::copy(hf_fixture("gpt2_tiny"), d, fs::copy_options::recursive);
  write_text(d + "/model.safetensors", st::serialize(ts, {{"format", "pt"}}));
  CHECK_THAT(error_of([&] { train::import_hf(d, dir.file("o.h5")); }),
             Catch::Contains("\"" + extra + "\" is not a parameter"));
  CHECK_FALSE(fs::exists(dir.file("o.h5")));
}

TEST_CASE("hf import refuses --tokenizer byte for a model whose rows it cannot decode", "[hf]") {
  TempDir dir;
  const int64_t rows = read_json_file(hf_fixture("gpt2_tiny/config.json"))["vocab_size"];
  REQUIRE(rows > 256);
  train::HfImportOptions o;
  o.tokenizer = "byte";
  CHECK_THAT(
      error_of([&] { train::import_hf(hf_fixture("gpt2_tiny"), dir.file("b.h5"), o); }),
      Catch::Contains("--tokenizer byte decodes 256 ids but config.json's vocab_size is " + std::to_string(rows)));
  CHECK_FALSE(std::filesystem::exists(dir.file("b.h5")));
  // The llama fixture has 300 rows over byte ids, and transformers' own greedy continuation of it
  // draws id 272, which no byte tokenizer can print: the command-line claim is refused there too.
  const json e = read_json_file(hf_fixture("llama_gqa_tiny.expected.json"));
  const auto greedy = e["greedy"].get<std::vector<int32_t>>();
  CHECK(*std::max_element(greedy.begin(), greedy.end()) >= 256);
  CHECK_THAT(error_of([&] { train::import_hf(hf_fixture("llama_gqa_tiny"), dir.file("l.h5"), o); }),
             Catch::Contains("--tokenizer byte decodes 256 ids but config.json's vocab_size is 300"));
}

TEST_CASE("sample never draws an id the tokenizer has no text for (a padded vocabulary)", "[hf]") {
  // A byte tokenizer on 300 rows whose head makes every padding row the most likely.
  Config cfg = tiny_config("gpt2");
  cfg.model.vocab_size = 300;
  cfg.data.tokenizer = TokenizerKind::byte;
  validate(cfg, "test");
  auto model = train::build_model(cfg.resolved(), 256);
  model->init_weights(5);
  // The final norm outputs all ones (weight 0, bias 1), so an id's logit is the sum of its row of
  // the tied head: 50 C for the padding rows, about 0 for the rest.
  for (const auto& p : model->named_parameters()) {
    float* w = p.tensor.data<float>();
    if (p.name == "transformer.ln_f.weight") std::fill(w, w + p.tensor.numel(), 0.0f);
    if (p.name == "transformer.ln_f.bias") std::fill(w, w + p.tensor.numel(), 1.0f);
    if (p.name == "transformer.wte.weight") {
      const int64_t C = p.tensor.shape()[1];
      std::fill(w + 256 * C, w + 300 * C, 50.0f);
    }
  }
  model->eval();
  train::SampleOptions o;
  o.max_new_tokens = 8;
  o.temperature = 0;
  const std::vector<int32_t> prompt = {65, 66};
  // Without the limit the greedy draw is a padding row: the limit is what keeps it out.
  const auto unrestricted = train::generate(*model, prompt, o);
  CHECK(unrestricted.front() >= 256);
  o.token_count = 256;
  for (double temperature : {0.0, 1.0}) {
    o.temperature = temperature;
    for (int32_t id : train::generate(*model, prompt, o)) CHECK(id < 256);
  }
  o.token_count = 301;
  CHECK_THAT(error_of([&] { train::generate(*model, prompt, o); }), Catch::Contains("301 tokens must be at most"));
}

TEST_CASE("a model with qkv's own BPE exports and imports to the same token ids and loss", "[hf]") {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 6; ++i) text += std::string(kCorpus) + " It was the age of wisdom, the age of foolishness.\n";
  auto tok = BpeTokenizer::train(text, 300);
  REQUIRE(tok->vocab_size() > 256);
  Config cfg = tiny_config("gpt2");
  cfg.data.tokenizer = TokenizerKind::bpe;
  cfg.data.bpe_vocab_size = 300;
  save_model(dir.file("bpe.h5"), cfg, *tok);
  const train::HfExportResult r = train::export_hf(dir.file("bpe.h5"), dir.file("hf"));
  CHECK(r.tokenizer == "mapping");
  const train::HfImportResult back = train::import_hf(dir.file("hf"), dir.file("back.h5"));
  CHECK(back.tokenizer == "bpe");
  const Loaded a = load(dir.file("bpe.h5")), b = load(dir.file("back.h5"));
  const std::vector<int32_t> ids = a.meta.tokenizer->encode(text);
  CHECK(b.meta.tokenizer->encode(text) == ids);
  CHECK(b.meta.tokenizer->serialize() == a.meta.tokenizer->serialize());
  CHECK(loss_of(b, ids) == loss_of(a, ids));
}

TEST_CASE("loading a checkpoint whose config and tensors disagree is refused naming the setting", "[hf]") {
  TempDir dir;
  Run run = make_run("gpt2");  // 2 layers
  const std::string path = dir.file("two.h5");
  save(run, path);
  // Rewrite the stored config to say 3 layers; the tensors stay those of 2.
  Config three = run.cfg;
  three.model.n_layer = 3;
  {
    h5::File f = h5::File::open(path, /*writable=*/true);
    const std::string toml = to_toml(three);
    f.set_attr("/", "config", toml);
    f.set_attr("/", "config_fnv1a64", static_cast<int64_t>(h5::fnv1a64(toml.data(), toml.size())));
  }
  REQUIRE(train::read_checkpoint_meta(path).config.model.n_layer == 3);
  // What --init-from does with a 2-layer run config: the tensors fit the run's model, the file's
  // own config does not.
  auto model = train::build_model(run.cfg, run.tok->vocab_size());
  CHECK_THAT(error_of([&] { train::load_model_weights(path, *model); }),
             Catch::Contains("its config says model.n_layer = 3 but /model holds the tensors of 2"));
  // Through the CLI as well.
  const std::string qkv = std::string(QKV_BINARY_DIR) + "/qkv";
  if (!std::filesystem::exists(qkv)) return;
  write_text(dir.file("corpus.txt"), char_text());
  write_text(
      dir.file("ft.toml"),
      "[model]\nfamily = \"gpt2\"\nn_layer = 2\nn_head = 4\nn_embd = 32\nblock_size = 16\n[data]\npath = \"" +
          dir.file("corpus.txt") +
          "\"\ntokenizer = \"char\"\n[train]\nbatch_size = 2\nmax_steps = 1\neval_interval = 1000\nout_dir = \"" +
          dir.file("run") + "\"\n");
  std::string out;
  CHECK(run_command(qkv + " train --config " + dir.file("ft.toml") + " --init-from " + path + " 2>&1", out) == 2);
  CHECK_THAT(out, Catch::Contains("model.n_layer is 3 there but 2 in this run's config"));
}
