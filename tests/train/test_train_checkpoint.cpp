// Checkpoints, the good path: bitwise round trips (weights, AdamW moments, run state,
// tokenizer, config) for a tied GPT-2 and an untied GQA Llama, and the Hugging Face names,
// shapes and layouts, checked both through our HDF5 layer and through h5py.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>

#include "checkpoint_test_util.h"
#include "data/h5.h"

using namespace qkv;
using namespace qkv::train;
using namespace qkv::ckpt_test;

TEST_CASE("checkpoint round trip restores weights, moments, run state, tokenizer and config bitwise",
          "[checkpoint][exact]") {
  const std::string family = GENERATE(as<std::string>{}, "gpt2", "llama");
  INFO("family " << family);
  TempDir dir;
  const std::string path = dir.file("ckpt_2.h5");
  Run r = make_run(family);
  if (family == "llama") r.state.best_val_loss = INFINITY;  // "no eval yet" must survive too
  save(r, path);
  CHECK(fs::exists(path));
  CHECK_FALSE(fs::exists(path + ".tmp"));

  const CheckpointMeta meta = read_checkpoint_meta(path);
  CHECK(meta.format_version == kCheckpointFormatVersion);
  CHECK(meta.config == r.cfg.resolved());
  CHECK(meta.has_optimizer);
  CHECK(meta.state.step == r.state.step);
  CHECK(meta.state.tokens_seen == r.state.tokens_seen);
  CHECK(meta.state.seed == r.state.seed);
  CHECK(meta.state.data == r.state.data);
  CHECK(meta.state.batch_mode == r.state.batch_mode);
  if (std::isinf(r.state.best_val_loss)) CHECK(std::isinf(meta.state.best_val_loss));
  else CHECK(meta.state.best_val_loss == r.state.best_val_loss);
  CHECK(meta.state.bad_steps_in_a_row == r.state.bad_steps_in_a_row);
  CHECK(meta.state.skipped_steps == r.state.skipped_steps);
  REQUIRE(meta.tokenizer);
  CHECK(std::string(meta.tokenizer->kind()) == "char");
  CHECK(meta.tokenizer->serialize() == r.tok->serialize());
  CHECK(meta.tokenizer->decode(meta.tokenizer->encode(kCorpus)) == kCorpus);

  // A fresh model (other init) and a fresh optimizer, from the stored config alone.
  auto model = build_model(meta.config, meta.tokenizer->vocab_size());
  model->init_weights(999);
  const auto want = r.model->named_parameters();
  const auto before = model->named_parameters();
  REQUIRE(want.size() == before.size());
  CHECK_FALSE(bitwise_equal(before[0].tensor, want[0].tensor));
  load_model_weights(path, *model);
  const auto got = model->named_parameters();
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(want[i].name);
    CHECK(got[i].name == want[i].name);
    CHECK(bitwise_equal(got[i].tensor, want[i].tensor));
  }
  auto opt = make_optimizer(*model, meta.config);
  load_optimizer_state(path, *opt);
  CHECK(opt->step_count() == r.opt->step_count());
  CHECK(opt->step_count() == 2);
  for (const OptimParam& p : r.opt->params()) {
    INFO(p.name);
    CHECK(bitwise_equal(opt->state(p.name).exp_avg, r.opt->state(p.name).exp_avg));
    CHECK(bitwise_equal(opt->state(p.name).exp_avg_sq, r.opt->state(p.name).exp_avg_sq));
  }
  // The moments really were non-zero (else equality above would be trivial).
  CHECK(r.opt->states()[0].exp_avg_sq.to_vector()[0] > 0);

  // Saving the loaded run again gives the same bytes: nothing is lost or reordered.
  Run again{meta.config, tokenizer_from_json(meta.tokenizer->serialize()), std::move(model), std::move(opt),
            meta.state};
  save(again, dir.file("again.h5"));
  CHECK(read_bytes(path) == read_bytes(dir.file("again.h5")));
}

TEST_CASE("checkpoint stores gpt2 Conv1D weights transposed [in, out] and llama weights as [out, in]", "[checkpoint]") {
  TempDir dir;
  Run g = make_run("gpt2"), l = make_run("llama");
  save(g, dir.file("g.h5"));
  save(l, dir.file("l.h5"));
  const int64_t C = 32, V = g.tok->vocab_size();
  const h5::File fg = h5::File::open(dir.file("g.h5")), fl = h5::File::open(dir.file("l.h5"));

  std::map<std::string, Tensor> gp, lp;
  for (const auto& p : g.model->named_parameters()) gp[p.name] = p.tensor;
  for (const auto& p : l.model->named_parameters()) lp[p.name] = p.tensor;

  // Conv1D: stored[i][j] == ours[j][i], for weights and for both moments.
  for (const std::string name : {"transformer.h.0.attn.c_attn.weight", "transformer.h.1.attn.c_proj.weight",
                                 "transformer.h.0.mlp.c_fc.weight", "transformer.h.1.mlp.c_proj.weight"}) {
    INFO(name);
    const Tensor ours = gp.at(name);
    const int64_t out = ours.shape()[0], in = ours.shape()[1];
    const std::vector<float> w = fg.read_shaped<float>("model/" + name, {in, out});
    const std::vector<float> m = fg.read_shaped<float>("optimizer/" + name + "/exp_avg", {in, out});
    const std::vector<double> ow = ours.to_vector(), om = g.opt->state(name).exp_avg.to_vector();
    int64_t mismatches = 0;
    for (int64_t i = 0; i < in; ++i)
      for (int64_t j = 0; j < out; ++j) {
        mismatches += w[i * out + j] != static_cast<float>(ow[j * in + i]);
        mismatches += m[i * out + j] != static_cast<float>(om[j * in + i]);
      }
    CHECK(mismatches == 0);
  }
  CHECK(fg.info("model/transformer.h.0.attn.c_attn.weight").shape == Shape{C, 3 * C});
  CHECK(fg.info("model/transformer.h.0.mlp.c_fc.weight").shape == Shape{C, 4 * C});
  CHECK(fg.info("model/transformer.wte.weight").shape == Shape{V, C});
  CHECK_FALSE(fg.has("model/lm_head.weight"));  // tied

  // Llama: as is, GQA k/v projections [Hkv*hd, C] = [16, 32], untied head present.
  CHECK(fl.info("model/model.layers.0.self_attn.k_proj.weight").shape == Shape{16, C});
  CHECK(fl.info("model/model.layers.0.self_attn.q_proj.weight").shape == Shape{C, C});
  CHECK(fl.info("model/lm_head.weight").shape == Shape{V, C});
  CHECK(fl.info("optimizer/model.layers.0.self_attn.k_proj.weight/exp_avg").shape == Shape{16, C});

  const std::vector<float> k = fl.read<float>("model/model.layers.0.self_attn.k_proj.weight");
  const std::vector<double> ok = lp.at("model.layers.0.self_attn.k_proj.weight").to_vector();
  REQUIRE(k.size() == ok.size());
  for (size_t i = 0; i < k.size(); ++i) REQUIRE(k[i] == static_cast<float>(ok[i]));

  // list_model_tensors: every parameter, in model order, with its stored shape.
  for (const Run* r : {&g, &l}) {
    const std::string path = dir.file(r == &g ? "g.h5" : "l.h5");
    const std::vector<StoredTensor> listed = list_model_tensors(path);
    const auto params = r->model->named_parameters();
    REQUIRE(listed.size() == params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string& name = params[i].name;
      const bool conv1d = name.find("transformer.") == 0 && params[i].tensor.dim() == 2 &&
                          (name.find(".c_attn.") != std::string::npos || name.find(".c_proj.") != std::string::npos ||
                           name.find(".c_fc.") != std::string::npos);
      Shape want = params[i].tensor.shape();
      if (conv1d) std::swap(want[0], want[1]);
      CHECK(listed[i].name == name);
      CHECK(listed[i].shape == want);
    }
  }
}

namespace {

bool have_h5py() {
  if (::access("/usr/bin/python3", X_OK) != 0) return false;
  std::string out;
  return run_command("/usr/bin/python3 -c 'import h5py' 2>/dev/null", out) == 0;
}

// What h5py sees, one "key<TAB>value" line each (keys: attr:<name>, ds:<model name>, ...).
const char* kH5pyScript = R"PY(import sys, h5py
f = h5py.File(sys.argv[1], "r")
for k in ("format", "format_version", "step", "tokens_seen"):
    print("attr:%s\t%s" % (k, f.attrs[k]))
print("config_has_model\t%s" % ("[model]" in f.attrs["config"]))
def show(name, obj):
    if isinstance(obj, h5py.Dataset) and name.startswith("model/"):
        print("ds:%s\t%s %s" % (name[6:], "x".join(str(d) for d in obj.shape), obj.dtype))
f.visititems(show)
gpt2 = "model/transformer.wte.weight" in f
w = f["model/transformer.h.0.attn.c_attn.weight" if gpt2 else "model/model.layers.0.self_attn.k_proj.weight"]
print("elem12\t%s" % float(w[1, 2]).hex())
print("tokenizer\t%s %s" % (f["tokenizer"].attrs["kind"], f["tokenizer/json"][()].decode()[:1]))
print("data\t%s %s" % (",".join(str(int(x)) for x in f["data/state"][()]), f["data"].attrs["mode"]))
print("opt\t%s" % ("x".join(str(d) for d in f["optimizer/" + w.name[7:] + "/exp_avg_sq"].shape)))
)PY";

std::map<std::string, std::string> read_with_h5py(const std::string& script, const std::string& path) {
  std::string out;
  const int rc = run_command("/usr/bin/python3 " + script + " " + path + " 2>&1", out);
  INFO(out);
  REQUIRE(rc == 0);
  std::map<std::string, std::string> m;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    const size_t tab = line.find('\t');
    if (tab != std::string::npos) m[line.substr(0, tab)] = line.substr(tab + 1);
  }
  return m;
}

}  // namespace

TEST_CASE("checkpoint is readable by h5py with Hugging Face names, shapes and root attributes", "[checkpoint]") {
  if (!have_h5py()) {
    WARN("/usr/bin/python3 with h5py is missing: h5py readability not checked");
    return;
  }
  TempDir dir;
  Run g = make_run("gpt2"), l = make_run("llama");
  save(g, dir.file("g.h5"));
  save(l, dir.file("l.h5"));
  const std::string script = dir.file("read.py");
  std::ofstream(script) << kH5pyScript;
  const std::string V = std::to_string(g.tok->vocab_size());

  const auto mg = read_with_h5py(script, dir.file("g.h5"));
  CHECK(mg.at("attr:format") == "qkv-checkpoint");
  CHECK(mg.at("attr:format_version") == "1");
  CHECK(mg.at("attr:step") == "2");
  CHECK(mg.at("attr:tokens_seen") == "12345");
  CHECK(mg.at("config_has_model") == "True");
  CHECK(mg.at("ds:transformer.wte.weight") == V + "x32 float32");
  CHECK(mg.at("ds:transformer.wpe.weight") == "16x32 float32");
  CHECK(mg.at("ds:transformer.h.0.ln_1.weight") == "32 float32");
  CHECK(mg.at("ds:transformer.h.0.ln_1.bias") == "32 float32");
  CHECK(mg.at("ds:transformer.h.0.attn.c_attn.weight") == "32x96 float32");  // [C, 3C]
  CHECK(mg.at("ds:transformer.h.0.attn.c_attn.bias") == "96 float32");
  CHECK(mg.at("ds:transformer.h.0.attn.c_proj.weight") == "32x32 float32");
  CHECK(mg.at("ds:transformer.h.1.ln_2.weight") == "32 float32");
  CHECK(mg.at("ds:transformer.h.1.mlp.c_fc.weight") == "32x128 float32");    // [C, 4C]
  CHECK(mg.at("ds:transformer.h.1.mlp.c_proj.weight") == "128x32 float32");  // [4C, C]
  CHECK(mg.at("ds:transformer.ln_f.weight") == "32 float32");
  CHECK(mg.count("ds:lm_head.weight") == 0);  // tied to wte, as GPT2LMHeadModel's state dict omits it
  size_t n_ds = 0;
  for (const auto& kv : mg) n_ds += kv.first.rfind("ds:", 0) == 0;
  CHECK(n_ds == g.model->named_parameters().size());
  // Bit for bit through numpy: stored c_attn [1][2] is our [out=2][in=1].
  const Tensor c_attn = g.model->named_parameters()[4].tensor;
  REQUIRE(g.model->named_parameters()[4].name == "transformer.h.0.attn.c_attn.weight");
  CHECK(std::strtod(mg.at("elem12").c_str(), nullptr) == static_cast<double>(c_attn.data<float>()[2 * 32 + 1]));
  CHECK(mg.at("tokenizer") == "char {");
  CHECK(mg.at("data") == std::to_string(0xfeedfacecafeull) + ",2,1,3,5 packed_docs");
  CHECK(mg.at("opt") == "32x96");

  const auto ml = read_with_h5py(script, dir.file("l.h5"));
  CHECK(ml.at("attr:format") == "qkv-checkpoint");
  CHECK(ml.at("ds:model.embed_tokens.weight") == V + "x32 float32");
  CHECK(ml.at("ds:model.layers.0.self_attn.q_proj.weight") == "32x32 float32");
  CHECK(ml.at("ds:model.layers.0.self_attn.k_proj.weight") == "16x32 float32");  // [Hkv*hd, C]
  CHECK(ml.at("ds:model.layers.0.self_attn.v_proj.weight") == "16x32 float32");
  CHECK(ml.at("ds:model.layers.0.self_attn.o_proj.weight") == "32x32 float32");
  CHECK(ml.at("ds:model.layers.1.mlp.gate_proj.weight") == "128x32 float32");
  CHECK(ml.at("ds:model.layers.1.mlp.up_proj.weight") == "128x32 float32");
  CHECK(ml.at("ds:model.layers.1.mlp.down_proj.weight") == "32x128 float32");
  CHECK(ml.at("ds:model.layers.0.input_layernorm.weight") == "32 float32");
  CHECK(ml.at("ds:model.layers.0.post_attention_layernorm.weight") == "32 float32");
  CHECK(ml.at("ds:model.norm.weight") == "32 float32");
  CHECK(ml.at("ds:lm_head.weight") == V + "x32 float32");
  CHECK(ml.count("ds:model.layers.0.input_layernorm.bias") == 0);
  CHECK(ml.count("ds:model.embed_positions.weight") == 0);  // RoPE: no learned positions
  std::map<std::string, Tensor> lp;
  for (const auto& p : l.model->named_parameters()) lp[p.name] = p.tensor;
  CHECK(std::strtod(ml.at("elem12").c_str(), nullptr) ==
        static_cast<double>(lp.at("model.layers.0.self_attn.k_proj.weight").data<float>()[1 * 32 + 2]));
  CHECK(ml.at("opt") == "16x32");
}
