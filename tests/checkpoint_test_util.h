// Shared by the checkpoint tests (test_train_checkpoint*.cpp): a temporary directory, tiny
// gpt2/llama runs with non-trivial weights and AdamW moments, byte-level file helpers.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "tensor/error.h"
#include "train/checkpoint.h"
#include "train/model_factory.h"

namespace qkv::ckpt_test {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path =
        fs::temp_directory_path() / ("qkv_ckpt_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
};

inline const char* kCorpus = "It was the best of times, it was the worst of times; 0123456789!\nZq";

// 2 layers, 4 heads, C = 32, T = 16; llama with 2 kv heads (GQA 2:1), so hd = 8.
inline Config tiny_config(const std::string& family, int64_t n_embd = 32, int64_t n_layer = 2) {
  Config cfg;
  apply_override(cfg, "model.family=" + family);
  cfg.model.n_layer = n_layer;
  cfg.model.n_head = 4;
  cfg.model.n_kv_head = family == "llama" ? 2 : 0;
  cfg.model.n_embd = n_embd;
  cfg.model.block_size = 16;
  cfg.data.tokenizer = TokenizerKind::character;
  cfg.train.seed = 4242;
  cfg.train.lr = 3e-3;
  validate(cfg, "test");
  return cfg.resolved();
}

// Deterministic values in [-1, 1) (independent of the tensor RNG).
inline void fill_lcg(Tensor t, uint64_t seed) {
  float* p = t.data<float>();
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = static_cast<float>(static_cast<double>(s >> 11) / static_cast<double>(1ull << 53) * 2.0 - 1.0);
  }
}

inline std::unique_ptr<train::AdamW> make_optimizer(const nn::DecoderModel& model, const Config& cfg) {
  std::vector<train::OptimParam> params;
  for (const auto& p : model.named_parameters()) params.push_back({p.name, p.tensor, p.decay});
  return std::make_unique<train::AdamW>(std::move(params), train::AdamWOptions::from(cfg.train));
}

// Two AdamW steps with made-up gradients, so weights and both moments are non-trivial.
inline void take_steps(train::AdamW& opt, uint64_t seed) {
  for (uint64_t k = 0; k < 2; ++k) {
    uint64_t i = 0;
    for (const train::OptimParam& p : opt.params()) {
      Tensor g = Tensor::empty(p.param.shape(), DType::f32);
      fill_lcg(g, seed * 100000 + k * 1000 + i++);
      Tensor handle = p.param;  // a handle copy shares the autograd slot
      handle.set_grad(g);
    }
    opt.step(1e-2);
  }
}

struct Run {
  Config cfg;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<nn::DecoderModel> model;
  std::unique_ptr<train::AdamW> opt;
  train::TrainState state;
};

inline Run make_run(const std::string& family, int64_t n_embd = 32, int64_t n_layer = 2, uint64_t seed = 7) {
  Run r;
  r.cfg = tiny_config(family, n_embd, n_layer);
  r.tok = CharTokenizer::train(kCorpus);
  r.model = train::build_model(r.cfg, r.tok->vocab_size());
  r.model->init_weights(seed);
  r.opt = make_optimizer(*r.model, r.cfg);
  take_steps(*r.opt, seed + 4);
  r.state.step = 2;
  r.state.tokens_seen = 12345;
  r.state.seed = 0xfeedfacecafeull;
  r.state.data = BatcherState{r.state.seed, 2, 1, 3, 5};
  r.state.batch_mode = BatchMode::packed_docs;
  r.state.best_val_loss = 2.5;
  r.state.bad_steps_in_a_row = 1;
  r.state.skipped_steps = 4;
  return r;
}

inline void save(const Run& r, const std::string& path) {
  train::save_checkpoint(path, r.cfg, *r.model, r.opt.get(), r.state, *r.tok);
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.shape() == cb.shape() && ca.dtype() == cb.dtype() &&
         std::memcmp(ca.raw_data(), cb.raw_data(), ca.numel() * ca.element_size()) == 0;
}

// Copies of the model's weights, to tell whether a failed load touched them.
inline std::vector<Tensor> snapshot(const nn::DecoderModel& m) {
  std::vector<Tensor> out;
  for (const auto& p : m.named_parameters()) out.push_back(p.tensor.clone());
  return out;
}
inline bool same_weights(const nn::DecoderModel& m, const std::vector<Tensor>& snap) {
  const auto params = m.named_parameters();
  if (params.size() != snap.size()) return false;
  for (size_t i = 0; i < params.size(); ++i)
    if (!bitwise_equal(params[i].tensor, snap[i])) return false;
  return true;
}

// Everything a resume loads, into a fresh model and optimizer built from the file's own config.
inline void load_everything(const std::string& path) {
  const train::CheckpointMeta meta = train::read_checkpoint_meta(path);
  auto model = train::build_model(meta.config, meta.tokenizer->vocab_size());
  train::load_model_weights(path, *model);
  auto opt = make_optimizer(*model, meta.config);
  train::load_optimizer_state(path, *opt);
}

// The qkv::Error message `f` throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) { return e.what(); }
  return "(no error)";
}

inline std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}
inline void write_bytes(const std::string& path, const std::vector<char>& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(b.data(), static_cast<std::streamsize>(b.size()));
}
// Offset of the first occurrence of `needle` in `hay`, or -1.
inline int64_t find_bytes(const std::vector<char>& hay, const void* needle, size_t n) {
  const char* p = static_cast<const char*>(needle);
  const auto it = std::search(hay.begin(), hay.end(), p, p + n);
  return it == hay.end() ? -1 : static_cast<int64_t>(it - hay.begin());
}

// Runs a shell command; returns its exit status (or -1) and its stdout.
inline int run_command(const std::string& cmd, std::string& out) {
  out.clear();
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace qkv::ckpt_test
