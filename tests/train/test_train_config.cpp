// Config: parsing, strict errors, --set overrides, validation, resolved family defaults, and
// the TOML round trip stored in checkpoints.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "distributed/data_parallel.h"
#include "tensor/error.h"
#include "train/config.h"
#include "train/config_schema.h"
#include "train/model_factory.h"
#include "build_dir.h"

using namespace qkv;
using Catch::Contains;

namespace {
Config parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_config_text(text, "configs/x.toml", overrides);
}
}  // namespace

TEST_CASE("an empty config gives the documented defaults", "[train][config]") {
  Config c = parse("");
  CHECK(c.model.family == nn::Family::gpt2);
  CHECK(c.model.n_layer == 4);
  CHECK(c.model.n_head == 4);
  CHECK(c.model.n_embd == 128);
  CHECK(c.model.block_size == 64);
  CHECK(c.model.norm_eps == 1e-5);
  CHECK(c.model.rope_theta == 10000.0);
  CHECK(c.data.tokenizer == TokenizerKind::character);
  CHECK(c.data.batching == BatchMode::random_windows);
  CHECK(c.train.batch_size == 12);
  CHECK(c.train.lr == 1e-3);
  CHECK(c.train.min_lr == 1e-4);
  CHECK(c.train.beta2 == 0.95);
  CHECK(c.train.keep_last == 3);
  CHECK(c.train.grad_clip == 1.0);
  CHECK(c.train.out_dir == "runs/default");
  CHECK(c.sample.max_new_tokens == 200);
  CHECK(c.sample.top_p == 1.0);
}

TEST_CASE("family presets resolve position, norm, activation, bias, tie and ffn size", "[train][config]") {
  Config g = parse("[model]\nn_embd = 128\n");
  CHECK(g.model.resolved_position() == nn::Position::learned);
  CHECK(g.model.resolved_norm() == nn::NormKind::layernorm);
  CHECK(g.model.resolved_activation() == nn::Activation::gelu_tanh);
  CHECK(g.model.resolved_bias());
  CHECK(g.model.resolved_tie_embeddings());
  CHECK(g.model.resolved_n_kv_head() == 4);
  CHECK(g.model.resolved_ffn_hidden() == 512);  // 4C

  Config l = parse("[model]\nfamily = \"llama\"\nn_head = 8\nn_kv_head = 2\nn_embd = 128\n");
  CHECK(l.model.resolved_position() == nn::Position::rope);
  CHECK(l.model.resolved_norm() == nn::NormKind::rmsnorm);
  CHECK(l.model.resolved_activation() == nn::Activation::swiglu);
  CHECK_FALSE(l.model.resolved_bias());
  CHECK_FALSE(l.model.resolved_tie_embeddings());
  CHECK(l.model.resolved_n_kv_head() == 2);
  CHECK(l.model.head_dim() == 16);
  // int(2*512/3) = 341, rounded up to a multiple of 64 -> 384
  CHECK(l.model.resolved_ffn_hidden() == 384);
  // C = 384: int(2*1536/3) = 1024 is already a multiple of 64; multiple_of 256 -> 1024 too
  l.model.n_embd = 384;
  CHECK(l.model.resolved_ffn_hidden() == 1024);
  l.model.n_embd = 96;            // int(2*384/3) = 256 -> 256
  l.model.ffn_multiple_of = 100;  // -> 300
  CHECK(l.model.resolved_ffn_hidden() == 300);

  // explicit switches win over the preset
  Config s = parse("[model]\nfamily = \"llama\"\nposition = \"alibi\"\nbias = true\nffn_hidden = 200\n");
  CHECK(s.model.resolved_position() == nn::Position::alibi);
  CHECK(s.model.resolved_bias());
  CHECK(s.model.resolved_ffn_hidden() == 200);
}

TEST_CASE("a full config file sets every section", "[train][config]") {
  const char* text = R"(
[model]
family = "llama"
n_layer = 2
n_head = 4
n_kv_head = 1
n_embd = 64
block_size = 32
vocab_size = 300
dropout = 0.2
rope_theta = 500000
tie_embeddings = true
window = 16
attn_kernel = "reference"

[data]
path = "data/x.txt"
tokenizer = "bpe"
bpe_vocab_size = 300
separator = "percent_line"
batching = "padded_docs"
padding_side = "left"

[train]
device = "cuda"
dtype = "bf16"
lr = 3e-4
warmup_steps = 10
lr_schedule = "constant"
seed = 7
recompute = true

[sample]
temperature = 0.8
top_k = 40
top_p = 0.9
prompt = "ROMEO:"
)";
  Config c = parse(text);
  CHECK(c.model.family == nn::Family::llama);
  CHECK(c.model.n_kv_head == 1);
  CHECK(c.model.vocab_size == 300);
  CHECK(c.model.dropout == 0.2);
  CHECK(c.model.rope_theta == 500000.0);  // an integer is accepted where a number is expected
  CHECK(c.model.tie_embeddings == true);
  CHECK(c.model.window == 16);
  CHECK(c.model.attn_kernel == attn::Kernel::reference);
  CHECK(c.data.tokenizer == TokenizerKind::bpe);
  CHECK(c.data.padding_side == Padding::left);
  CHECK(c.train.device == Device::cuda);
  CHECK(c.train.lr == 3e-4);
  CHECK(c.train.lr_schedule == train::LrScheduleKind::constant);
  CHECK(c.train.recompute);
  CHECK(c.sample.top_k == 40);
  CHECK(c.sample.prompt == "ROMEO:");
}

TEST_CASE("unknown sections and keys are errors naming the file and the key", "[train][config]") {
  CHECK_THROWS_WITH(parse("[model]\nn_layers = 4\n"),
                    Contains("configs/x.toml: unknown key model.n_layers") && Contains("did you mean model.n_layer?"));
  CHECK_THROWS_WITH(parse("[optim]\nlr = 1\n"), Contains("configs/x.toml: unknown section [optim]"));
  CHECK_THROWS_WITH(parse("lr = 1\n"), Contains("configs/x.toml: unknown section [lr]"));
  CHECK_THROWS_WITH(parse("[train.sub]\nx = 1\n"), Contains("unknown key train.sub"));
  CHECK_THROWS_AS(parse("[model]\nn_layers = 4\n"), Error);
}

TEST_CASE("values of the wrong type are errors naming the key and both types", "[train][config]") {
  CHECK_THROWS_WITH(parse("[model]\nn_head = \"4\"\n"),
                    Contains("configs/x.toml: model.n_head must be an integer, got string"));
  CHECK_THROWS_WITH(parse("[model]\nn_layer = 4.0\n"), Contains("model.n_layer must be an integer, got float"));
  CHECK_THROWS_WITH(parse("[train]\nlr = \"fast\"\n"), Contains("train.lr must be a number, got string"));
  CHECK_THROWS_WITH(parse("[train]\nrecompute = 1\n"), Contains("train.recompute must be a boolean, got integer"));
  CHECK_THROWS_WITH(parse("[model]\nfamily = [\"gpt2\"]\n"), Contains("model.family must be a string, got array"));
  CHECK_THROWS_WITH(parse("model = 3\n"), Contains("model must be a table"));
}

TEST_CASE("TOML syntax errors give the file, line and column", "[train][config]") {
  CHECK_THROWS_WITH(parse("[model]\nn_layer = = 4\n"), Contains("configs/x.toml:2:") && Contains("syntax error"));
}

TEST_CASE("overrides given by --set read the value as TOML, bare words as strings", "[train][config]") {
  Config c = parse("[train]\nlr = 1e-3\n",
                   {"train.lr=3e-4", "model.family=\"llama\"", "train.max_steps = 50", "model.bias=false",
                    "data.path=runs/my data.txt", "sample.prompt=42", "model.dropout=0"});
  CHECK(c.train.lr == 3e-4);
  CHECK(c.model.family == nn::Family::llama);
  CHECK(c.train.max_steps == 50);
  CHECK(c.model.bias == false);
  CHECK(c.data.path == "runs/my data.txt");
  CHECK(c.sample.prompt == "42");  // a string key keeps the text as written
  CHECK(c.model.dropout == 0.0);

  Config b = parse("", {"model.family=llama"});
  CHECK(b.model.family == nn::Family::llama);

  Config later_wins = parse("", {"train.seed=1", "train.seed=2"});
  CHECK(later_wins.train.seed == 2);

  Config q = parse("", {"sample.prompt=\"a \\\"quoted\\\" line\""});
  CHECK(q.sample.prompt == "a \"quoted\" line");
}

TEST_CASE("bad --set overrides name the assignment and the key", "[train][config]") {
  CHECK_THROWS_WITH(parse("", {"model.n_layers=3"}),
                    Contains("--set model.n_layers=3: unknown key model.n_layers (did you mean model.n_layer?)"));
  CHECK_THROWS_WITH(parse("", {"modle.n_layer=3"}), Contains("unknown section [modle]"));
  CHECK_THROWS_WITH(parse("", {"train.lr"}), Contains("expected section.key=value"));
  CHECK_THROWS_WITH(parse("", {"lr=3"}), Contains("expected a dotted key"));
  CHECK_THROWS_WITH(parse("", {"model.n_head=four"}), Contains("model.n_head must be an integer, got string"));
  CHECK_THROWS_WITH(parse("", {"train.lr=1e-3x"}), Contains("train.lr must be a number, got string"));
  // an override that breaks a consistency rule is caught by validation afterwards
  CHECK_THROWS_WITH(parse("", {"model.n_head=3"}),
                    Contains("model.n_embd (128) must be divisible by model.n_head (3)"));
}

TEST_CASE("validation rejects inconsistent or out-of-range settings", "[train][config]") {
  CHECK_THROWS_WITH(parse("[model]\nn_embd = 100\nn_head = 3\n"),
                    Contains("configs/x.toml: model.n_embd (100) must be divisible by model.n_head (3)"));
  CHECK_THROWS_WITH(parse("[model]\nn_head = 4\nn_kv_head = 3\n"),
                    Contains("model.n_head (4) must be divisible by model.n_kv_head (3)"));
  CHECK_THROWS_WITH(parse("[model]\nn_head = 4\nn_kv_head = 8\n"),
                    Contains("must be divisible by model.n_kv_head (8)"));
  CHECK_THROWS_WITH(parse("[model]\nn_layer = 0\n"), Contains("model.n_layer must be an integer in [1, 1024], got 0"));
  CHECK_THROWS_WITH(parse("[model]\nblock_size = -5\n"),
                    Contains("model.block_size must be an integer in [1, 1048576], got -5"));
  CHECK_THROWS_WITH(parse("[model]\ndropout = 1.0\n"), Contains("model.dropout must be a finite number in [0, 1)"));
  CHECK_THROWS_WITH(parse("[model]\nattn_dropout = -0.1\n"),
                    Contains("model.attn_dropout must be a finite number in [0, 1)"));
  CHECK_THROWS_WITH(parse("[model]\nfamily = \"gpt3\"\n"),
                    Contains("model.family must be one of \"gpt2\", \"llama\"; got \"gpt3\""));
  CHECK_THROWS_WITH(parse("[model]\nposition = \"relative\"\n"), Contains("model.position must be one of"));
  CHECK_THROWS_WITH(parse("[model]\nnorm_eps = 0\n"), Contains("model.norm_eps must be a finite number in (0, 1]"));
  CHECK_THROWS_WITH(parse("[model]\nfamily = \"llama\"\nn_embd = 96\nn_head = 32\n"),
                    Contains("rotary positions need an even head size"));
  CHECK_THROWS_WITH(parse("[data]\ntokenizer = \"word\"\n"), Contains("data.tokenizer must be one of"));
  CHECK_THROWS_WITH(parse("[data]\nval_fraction = 1.0\n"),
                    Contains("data.val_fraction must be a finite number in [0, 1)"));
  CHECK_THROWS_WITH(parse("[data]\nbpe_vocab_size = 100\n"),
                    Contains("data.bpe_vocab_size must be an integer in [256, 1048576]"));
  CHECK_THROWS_WITH(parse("[data]\ntokenizer = \"byte\"\n[model]\nvocab_size = 65\n"),
                    Contains("smaller than the byte tokenizer's 256"));
  CHECK_THROWS_WITH(parse("[data]\nrandom_tokens = true\n"), Contains("data.random_tokens needs model.vocab_size > 0"));
  CHECK_THROWS_WITH(parse("[train]\nlr = nan\n"), Contains("train.lr must be a finite number in [0, 10]"));
  CHECK_THROWS_WITH(parse("[train]\nlr = inf\n"), Contains("train.lr must be a finite number in [0, 10]"));
  CHECK_THROWS_WITH(parse("[train]\nbatch_size = 0\n"),
                    Contains("train.batch_size must be an integer in [1, 1048576]"));
  CHECK_THROWS_WITH(parse("[train]\nbeta2 = 1.0\n"), Contains("train.beta2 must be a finite number in [0, 1)"));
  CHECK_THROWS_WITH(parse("[train]\ndevice = \"tpu\"\n"), Contains("train.device must be one of \"cpu\", \"cuda\""));
  CHECK_THROWS_WITH(parse("[train]\nlr_schedule = \"linear\"\n"), Contains("train.lr_schedule must be one of"));
  CHECK_THROWS_WITH(parse("[train]\nkeep_last = 0\n"), Contains("train.keep_last must be an integer in [1, 1048576]"));
  CHECK_THROWS_WITH(parse("[train]\nout_dir = \"\"\n"), Contains("train.out_dir must not be empty"));
  CHECK_THROWS_WITH(parse("[sample]\ntop_p = 0\n"), Contains("sample.top_p must be a finite number in (0, 1]"));
  CHECK_THROWS_WITH(parse("[sample]\ntemperature = -1\n"),
                    Contains("sample.temperature must be a finite number in [0, 10000]"));
  // the boundaries that are allowed
  CHECK_NOTHROW(parse("[model]\nn_head = 4\nn_kv_head = 1\ndropout = 0.0\n[sample]\ntop_p = 1.0\ntemperature = 0\n"));
}

TEST_CASE("to_toml writes the resolved config and parses back to the same values", "[train][config]") {
  Config c = parse("[model]\nfamily = \"llama\"\nn_head = 8\nn_embd = 64\n",
                   {"train.lr=3e-4", "model.norm_eps=1e-6", "train.weight_decay=0.1", "sample.temperature=0.7",
                    "sample.prompt=\"tab\\there \\\"q\\\" back\\\\slash\\nnext line \\u00e9\"",
                    "data.val_fraction=0.05", "train.min_lr=6.0000000000000002e-05"});
  const std::string text = to_toml(c);
  INFO(text);
  CHECK_THAT(text, Contains("[model]\nfamily = \"llama\"\n"));
  CHECK_THAT(text, Contains("position = \"rope\"\n"));  // resolved, not ""
  CHECK_THAT(text, Contains("bias = false\n"));
  CHECK_THAT(text, Contains("n_kv_head = 8\n"));         // 0 resolved to n_head
  CHECK_THAT(text, Contains("ffn_hidden = 192\n"));      // int(2*256/3) = 170 -> 192
  CHECK_THAT(text, Contains("lr = 0.0003\n"));           // shortest round-trip form
  CHECK_THAT(text, Contains("rope_theta = 10000.0\n"));  // a float stays a float
  Config back = parse_config_text(text, "roundtrip");
  CHECK(back == c.resolved());
  CHECK(back.sample.prompt == "tab\there \"q\" back\\slash\nnext line \xc3\xa9");
  CHECK(back.train.min_lr == 6.0000000000000002e-05);
  CHECK(to_toml(back) == text);    // idempotent
  CHECK_FALSE(c == c.resolved());  // the unresolved config really had family defaults left open
}

TEST_CASE("parse_config reads a file and names missing files", "[train][config]") {
  const std::string path = std::string(QKV_BINARY_DIR) + "/test_train_config.toml";
  {
    std::ofstream f(path);
    f << "[model]\nn_layer = 6\n[train]\nmax_steps = 7\n";
  }
  Config c = parse_config(path, {"train.max_steps=9"});
  CHECK(c.model.n_layer == 6);
  CHECK(c.train.max_steps == 9);
  std::remove(path.c_str());
  CHECK_THROWS_WITH(parse_config(path), Contains(path + ": cannot open config file"));
  {
    std::ofstream f(path);
    f << "[model]\nn_layer = \"six\"\n";
  }
  CHECK_THROWS_WITH(parse_config(path), Contains(path + ": model.n_layer must be an integer, got string"));
  std::remove(path.c_str());
}

TEST_CASE("every key pinned by the design is a config key", "[train][config]") {
  const std::vector<std::string> keys = config_keys();
  for (const char* k :
       {"model.family",     "model.n_layer",    "model.n_head",        "model.n_kv_head",           "model.n_embd",
        "model.block_size", "model.vocab_size", "model.dropout",       "model.attn_dropout",        "data.path",
        "data.tokenizer",   "train.device",     "train.batch_size",    "train.max_steps",           "train.lr",
        "train.seed",       "train.out_dir",    "train.eval_interval", "train.checkpoint_interval", "train.keep_last",
        "model.norm_eps",   "model.rope_theta", "model.ffn_hidden"}) {
    INFO(k);
    CHECK(std::find(keys.begin(), keys.end(), k) != keys.end());
  }
  // and each key can be set through --set by its own name (the table has no typos)
  // and each key can be set through --set by its own name (the table has no typos): an array
  // is taken verbatim by string keys and refused, naming the key, by all others
  for (const std::string& k : keys) {
    INFO(k);
    Config c;
    try {
      apply_override(c, k + "=[1, 2]");
      CHECK(to_toml(c).find(k.substr(k.find('.') + 1) + " = \"[1, 2]\"") != std::string::npos);
    } catch (const Error& e) { CHECK_THAT(e.what(), Contains(k + " must be")); }
  }
}

TEST_CASE("train.zero is refused at load above the stage DataParallel implements, naming the key", "[train][config]") {
  // The config used to accept 0..3 while DataParallel refused 2 and 3 only after loading the data.
  CHECK(parse("[train]\nzero = 1\n").train.zero == 1);
  const std::string not_implemented =
      " (ZeRO stages 2 and 3, which shard gradients and parameters, are not implemented)";
  for (const char* stage : {"2", "3"})
    CHECK_THROWS_MATCHES(parse(std::string("[train]\nzero = ") + stage + "\n"), Error,
                         Catch::Message(std::string("configs/x.toml: train.zero must be an integer in [0, 1], got ") +
                                        stage + not_implemented));
  CHECK_THROWS_MATCHES(parse("[train]\nzero = -1\n"), Error,
                       Catch::Message("configs/x.toml: train.zero must be an integer in [0, 1], got -1"));
  CHECK_THROWS_WITH(parse("", {"train.zero=2"}),
                    Contains("train.zero must be an integer in [0, 1], got 2" + not_implemented));
}

TEST_CASE("data-parallel and tensor-core settings are config keys with ranges, recorded by to_toml",
          "[train][config]") {
  const Config d = parse("");
  CHECK(d.train.dp_bucket_kb == 4096);  // 4 MiB, dist::kDefaultBucketBytes
  CHECK(d.train.dp_bucket_kb * 1024 == dist::kDefaultBucketBytes);
  CHECK(d.train.dp_overlap);
  CHECK(d.train.cuda_mma);
  const Config c = parse("[train]\ndp_bucket_kb = 16\ndp_overlap = false\ndevice = \"cuda\"\ndtype = \"bf16\"\n",
                         {"train.cuda_mma=false"});
  CHECK(c.train.dp_bucket_kb == 16);
  CHECK_FALSE(c.train.dp_overlap);
  CHECK_FALSE(c.train.cuda_mma);
  // The checkpoint's config text records them, and reads back.
  const std::string text = to_toml(c);
  CHECK_THAT(text, Contains("\ndp_bucket_kb = 16\ndp_overlap = false\ncuda_mma = false\n"));
  CHECK(parse_config_text(text, "stored") == c.resolved());
  // Ranges and types, naming the key.
  CHECK_THROWS_WITH(parse("[train]\ndp_bucket_kb = 0\n"),
                    Contains("configs/x.toml: train.dp_bucket_kb must be an integer in [1, 1048576], got 0"));
  CHECK_THROWS_WITH(parse("", {"train.dp_overlap=0"}), Contains("train.dp_overlap must be a boolean, got integer"));
  // train.cuda_mma = false only where the tensor-core kernels could run.
  for (const char* where : {"", "dtype = \"bf16\"\n", "device = \"cuda\"\n"}) {
    INFO(where);
    CHECK_THROWS_WITH(parse(std::string("[train]\ncuda_mma = false\n") + where),
                      Contains("configs/x.toml: train.cuda_mma = false is only used with train.device = \"cuda\" and "
                               "train.dtype = \"bf16\""));
  }
}

TEST_CASE("every spelling the validator accepts maps to its enum, and no other", "[train][config]") {
  for (const auto& c : kPositions) {
    const Config cfg = parse("[model]\nposition = \"" + std::string(c.name) + "\"\nn_embd = 64\n").resolved();
    CHECK(train::model_config(cfg, 65).position == c.value);
  }
  for (const auto& c : kActivations)
    CHECK(train::model_config(parse("[model]\nactivation = \"" + std::string(c.name) + "\"\n").resolved(), 65)
              .activation == c.value);
  for (const auto& c : kNorms)
    CHECK(train::model_config(parse("[model]\nnorm = \"" + std::string(c.name) + "\"\n").resolved(), 65).norm ==
          c.value);
  for (const auto& c : kFamilies)
    CHECK(train::model_config(parse("[model]\nfamily = \"" + std::string(c.name) + "\"\n").resolved(), 65).family ==
          c.value);
  for (const auto& c : kAttnKernels)
    CHECK(train::model_config(parse("[model]\nattn_kernel = \"" + std::string(c.name) + "\"\n").resolved(), 65)
              .attn_kernel == c.value);
  for (const auto& c : kBatchModes)
    CHECK(parse("[data]\nbatching = \"" + std::string(c.name) + "\"\n").data.batching == c.value);
  // A spelling outside the table: the same message from the validator and from choose().
  CHECK_THROWS_WITH(parse("[data]\nbatching = \"packed\"\n"),
                    Contains("configs/x.toml: data.batching must be one of \"random_windows\", \"padded_docs\", "
                             "\"packed_docs\"; got \"packed\""));
  CHECK_THROWS_WITH(choose(kBatchModes, "packed", "data.batching"),
                    Contains("data.batching must be one of \"random_windows\", \"padded_docs\", \"packed_docs\"; got "
                             "\"packed\""));
  // Read into the enum at load: a spelling outside the table never reaches the model.
  CHECK_THROWS_WITH(parse("", {"model.position=rotary"}),
                    "--set model.position=rotary: model.position must be one of \"learned\", \"rope\", "
                    "\"sinusoidal\", \"alibi\", \"none\" (or \"\" for the family default); got \"rotary\"");
}

TEST_CASE("first_difference names the first differing key of the selection, with both values", "[train][config]") {
  const Config a = parse("");
  CHECK_FALSE(first_difference(a, a, {"model.", "train.seed"}));
  Config b = a;
  b.model.n_head = 8;
  b.model.dropout = 0.25;
  b.train.lr = 0.5;  // not selected below
  const auto d = first_difference(a, b, {"model.", "train.seed"});
  REQUIRE(d);
  CHECK(d->key == "model.n_head");  // declaration order: n_head before dropout
  CHECK(d->a == "4");
  CHECK(d->b == "8");
  b.model.n_head = a.model.n_head;
  const auto e = first_difference(a, b, {"model.dropout"});
  REQUIRE(e);
  CHECK(e->b == "0.25");
  CHECK_FALSE(first_difference(a, b, {"model.n_head", "data."}));
  const auto f = first_difference(a, b, {"train."});
  REQUIRE(f);
  CHECK(f->key == "train.lr");
  b.model.bias = true;  // unset vs set differs as stored; resolved, gpt2's default is true
  CHECK(first_difference(a, b, {"model.bias"}));
  CHECK_FALSE(first_difference(a.resolved(), b.resolved(), {"model.bias"}));
}

TEST_CASE("model rules are written once: the config reports nn::ModelConfig::validate's own message",
          "[train][config]") {
  // The config's validator and ModelConfig::validate used to keep two copies of these rules and
  // disagreed: "must be > 0" against "must be positive", "divisible by" against "a multiple of",
  // and an odd n_embd with sinusoidal positions or norm_eps = 0 was refused by one, built by the other.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"model.n_layer=0", "model.n_layer must be an integer in [1, 1024], got 0"},
      {"model.n_head=3", "model.n_embd (128) must be divisible by model.n_head (3)"},
      {"model.n_kv_head=3", "model.n_head (4) must be divisible by model.n_kv_head (3)"},
      {"model.block_size=-5", "model.block_size must be an integer in [1, 1048576], got -5"},
      {"model.dropout=1.0", "model.dropout must be a finite number in [0, 1), got 1"},
      {"model.norm_eps=0", "model.norm_eps must be a finite number in (0, 1], got 0"},
      {"model.window=-1", "model.window must be an integer in [0, 1048576], got -1"},
      {"model.init_std=-0.5", "model.init_std must be a finite number in [0, 1], got -0.5"},
  };
  for (const auto& [assignment, message] : bad) {
    CAPTURE(assignment);
    Config raw;
    apply_override(raw, assignment);  // no validation: what nn sees
    CHECK_THROWS_WITH(train::model_config(raw, 65), message);
    CHECK_THROWS_WITH(parse("", {assignment}), "configs/x.toml: " + message);
  }
  nn::ModelConfig m;
  m.position = nn::Position::sinusoidal;
  m.n_embd = 36;
  m.n_head = m.n_kv_head = 4;
  CHECK_NOTHROW(m.validate());
  m.n_embd = 33;  // 11 per head: fine for the heads, but the sinusoid pairs sin/cos over n_embd
  m.n_head = m.n_kv_head = 3;
  CHECK_THROWS_WITH(m.validate(), "sinusoidal positions need an even model.n_embd, got 33");
  CHECK_THROWS_WITH(parse("[model]\nposition = \"sinusoidal\"\nn_embd = 33\nn_head = 3\n"),
                    "configs/x.toml: sinusoidal positions need an even model.n_embd, got 33");
}

TEST_CASE("the batching modes and padding sides have one table: config, batcher and checkpoints agree",
          "[train][config][data]") {
  // Spelt out three times before (config_schema.h, parse_batch_mode, the checkpoint's /data check).
  REQUIRE(kBatchModes.size() == 3);
  for (const auto& c : kBatchModes) {
    CHECK(parse_batch_mode(c.name) == c.value);
    CHECK(batch_mode_name(c.value) == c.name);
    CHECK(choose(kBatchModes, c.name, "data.batching") == c.value);
    CHECK(parse("", {"data.batching=" + std::string(c.name)}).data.batching == c.value);
  }
  for (const auto& c : kPaddingSides) {
    CHECK(parse_padding(c.name) == c.value);
    CHECK(parse("", {"data.padding_side=" + std::string(c.name)}).data.padding_side == c.value);
  }
  CHECK_THROWS_WITH(parse_batch_mode("packed"),
                    "[batcher] unknown batch mode 'packed' (expected random_windows, padded_docs or packed_docs)");
  CHECK_THROWS_WITH(parse_padding("up"), "[batcher] unknown padding 'up' (expected right or left)");
  CHECK_THROWS_WITH(parse("", {"data.batching=packed"}), Contains("data.batching must be one of"));
  // Read into the enum at load: a wrong spelling or type is refused there, naming where it came
  // from; the text written back (the checkpoint's config) is the spelling, as before.
  CHECK_THROWS_WITH(parse("", {"data.padding_side=up"}),
                    "--set data.padding_side=up: data.padding_side must be one of \"right\", \"left\"; got \"up\"");
  CHECK_THROWS_WITH(parse("[data]\nbatching = 2\n"), "configs/x.toml: data.batching must be a string, got integer");
  const Config p = parse("[data]\nbatching = \"packed_docs\"\npadding_side = \"left\"\n");
  const std::string text = to_toml(p);
  CHECK(text.find("\nbatching = \"packed_docs\"\npadding_side = \"left\"\n") != std::string::npos);
  CHECK(parse_config_text(text, "round trip") == p.resolved());
  Config q = p;
  q.data.padding_side = Padding::right;
  const auto d = first_difference(p, q, {"data."});
  REQUIRE(d);
  CHECK(d->key == "data.padding_side");
  CHECK(d->a == "\"left\"");
  CHECK(d->b == "\"right\"");
}

TEST_CASE("model_difference names the first differing model key with both values as to_toml writes them",
          "[train][config]") {
  const Config cfg = parse("[model]\nfamily = \"llama\"\n").resolved();
  const nn::ModelConfig a = train::model_config(cfg, 65);
  CHECK_FALSE(train::model_difference(a, a));
  nn::ModelConfig b = a;
  b.recompute = !a.recompute;  // train.recompute: how backward runs, not which model
  CHECK_FALSE(train::model_difference(a, b));
  b.position = nn::Position::alibi;
  b.dropout = 0.25;
  auto d = train::model_difference(a, b);
  REQUIRE(d);
  CHECK(d->key == "model.dropout");  // declaration order: dropout before position
  CHECK(d->a == "0.0");
  CHECK(d->b == "0.25");
  b.dropout = a.dropout;
  d = train::model_difference(a, b);
  REQUIRE(d);
  CHECK(d->key == "model.position");
  CHECK(d->a == "\"rope\"");
  CHECK(d->b == "\"alibi\"");
  // The text is the one the checkpoint's config holds for the same value.
  CHECK(to_toml(cfg).find("position = " + d->a + "\n") != std::string::npos);
  b = a;
  b.family = nn::Family::gpt2;
  d = train::model_difference(a, b);
  REQUIRE(d);
  CHECK(d->key == "model.family");
  CHECK(d->b == "\"gpt2\"");
}

TEST_CASE("docs/config.md's key reference is `qkv keys`, one row per key", "[train][config]") {
  std::ifstream in(std::string(QKV_SOURCE_DIR) + "/docs/config.md");
  REQUIRE(in);
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string reference = config_reference();
  // A key added, renamed or re-ranged without regenerating the doc fails here:
  //   (sed -n '1,/qkv keys: begin/p' docs/config.md; build/qkv keys; echo '<!-- qkv keys: end -->')
  CHECK(doc.find("<!-- qkv keys: begin -->\n" + reference + "<!-- qkv keys: end -->\n") != std::string::npos);
  for (const std::string& key : config_keys()) {
    INFO(key);
    const std::string row = "| `" + key + "` |";
    const size_t at = reference.find(row);
    REQUIRE(at != std::string::npos);
    CHECK(reference.find(row, at + 1) == std::string::npos);
  }
  CHECK(reference.find("| `model.n_layer` | integer | `4` | an integer in [1, 1024] |") != std::string::npos);
  CHECK(reference.find("| `model.pattern_seed` | integer | `0` | an integer in [0, 9223372036854775807] | seed of "
                       "the random blocks; only under model.attention_pattern = bigbird |") != std::string::npos);
  CHECK(reference.find("| `model.position` | learned \\| rope \\| sinusoidal \\| alibi \\| none | the family's |") !=
        std::string::npos);
}

TEST_CASE("a key of one attention pattern set under another is refused by name", "[train][config]") {
  struct Case {
    std::vector<std::string> sets;
    const char* message;
  };
  const Case cases[] = {
      {{"model.attention_pattern=window", "model.pattern_stride=3"},
       "model.pattern_stride = 3 is only used by model.attention_pattern = strided, not window"},
      {{"model.attention_pattern=block_sparse", "model.pattern_local=2"},
       "model.pattern_local = 2 is only used by model.attention_pattern = window, strided, global or bigbird, not "
       "block_sparse"},
      {{"model.attention_pattern=strided", "model.pattern_global_tokens=0,3"},
       "model.pattern_global_tokens = \"0,3\" is only used by model.attention_pattern = global or bigbird, not "
       "strided"},
      {{"model.pattern_layout=fixed"},
       "model.pattern_layout = \"fixed\" is only used by model.attention_pattern = block_sparse, not full"},
      {{"model.attention_pattern=window", "model.pattern_block_size=4"},
       "model.pattern_block_size = 4 is only used by model.attention_pattern = bigbird or block_sparse, not window"},
      {{"model.attention_pattern=linear", "model.pattern_global=2"},
       "model.pattern_global = 2 is only used by model.attention_pattern = global or bigbird, not linear"},
  };
  for (const Case& c : cases) {
    INFO(c.message);
    CHECK_THROWS_WITH(parse_config_text("", "cfg", c.sets), Catch::Contains(c.message));
  }
  // The same keys at their defaults, or under their own pattern, are accepted.
  CHECK_NOTHROW(parse_config_text("", "cfg", {"model.attention_pattern=window", "model.pattern_stride=0"}));
  CHECK_NOTHROW(parse_config_text("", "cfg",
                                  {"model.attention_pattern=bigbird", "model.pattern_block_size=4",
                                   "model.pattern_global_tokens=0,3", "model.pattern_local=4"}));
}

TEST_CASE("attention_defaults puts every attention key back to plain full attention", "[train][config]") {
  const Config bigbird = parse_config_text(
      "", "cfg",
      {"model.attention_pattern=bigbird", "model.pattern_block_size=4", "model.pattern_global_tokens=0,3",
       "model.pattern_local=4", "model.pattern_random_blocks=1", "model.pattern_seed=9", "model.window=8"});
  std::vector<std::string> sets = attention_defaults();
  Config reset = bigbird;
  for (const std::string& s : sets) apply_override(reset, s);
  CHECK(reset.model == Config{}.model);
  const Config linear = parse_config_text("", "cfg", {"model.attention_pattern=linear", "model.linear_chunk=7"});
  reset = linear;
  for (const std::string& s : sets) apply_override(reset, s);
  CHECK(reset.model == Config{}.model);
}
