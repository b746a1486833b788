#include "train/session.h"

#include <algorithm>

#include <omp.h>

#include "data/h5.h"
#include "tensor/philox.h"
#include "train/config_schema.h"
#include "train/model_factory.h"

namespace qkv::train {

RunData load_run_data(const Config& cfg) {
  RunData d;
  if (cfg.data.random_tokens) {
    const int64_t V = cfg.model.vocab_size;
    QKV_CHECK(V > 0, "data.random_tokens needs model.vocab_size > 0");
    // Enough tokens for any window; values are a pure function of (seed, index).
    const int64_t n = std::max<int64_t>(1 << 20, 4 * (cfg.model.block_size + 1));
    auto make = [&](uint32_t stream, const char* name) {
      auto s = std::make_shared<TokenSplit>();
      s->name = name;
      s->tokens.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; i += 4) {
        const Philox4 r =
            philox4x32_10(static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32), stream, 0,
                          static_cast<uint32_t>(cfg.train.seed), static_cast<uint32_t>(cfg.train.seed >> 32));
        for (int64_t k = 0; k < 4 && i + k < n; ++k) s->tokens[i + k] = static_cast<int32_t>(r.v[k] % V);
      }
      s->doc_offsets = {0, n};
      return std::shared_ptr<const TokenSplit>(s);
    };
    // A stand-in tokenizer with exactly V symbols (code points from U+0100, in order), so
    // checkpoints of random-token runs carry a tokenizer that matches the model's vocabulary.
    std::vector<std::string> symbols;
    for (int64_t i = 0; i < V; ++i) {
      const uint32_t cp = 0x100u + static_cast<uint32_t>(i);
      std::string u;
      if (cp < 0x800) {
        u += static_cast<char>(0xC0 | (cp >> 6));
        u += static_cast<char>(0x80 | (cp & 0x3F));
      } else {
        u += static_cast<char>(0xE0 | (cp >> 12));
        u += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        u += static_cast<char>(0x80 | (cp & 0x3F));
      }
      symbols.push_back(u);
    }
    QKV_CHECK(V <= 0xD800 - 0x100, "data.random_tokens supports model.vocab_size up to ", 0xD800 - 0x100);
    d.tokenizer = std::make_shared<CharTokenizer>(std::move(symbols));
    d.train = make(0x7a11u, "random:train");
    d.val = make(0x7a12u, "random:val");
    d.vocab_size = V;
    return d;
  }
  QKV_CHECK(!cfg.data.path.empty(), "data.path is empty (set it in the config or with --set data.path=FILE)");
  PrepareOptions p;
  p.tokenizer = cfg.data.tokenizer;
  p.bpe_vocab_size = static_cast<int32_t>(cfg.data.bpe_vocab_size);
  p.separator = cfg.data.separator;
  p.val_fraction = cfg.data.val_fraction;
  p.split_seed = static_cast<uint64_t>(cfg.train.seed);
  Dataset ds = load_or_prepare(cfg.data.path, p);
  d.tokenizer = ds.tokenizer;
  d.train = ds.train;
  d.val = ds.val;
  d.vocab_size = d.tokenizer->vocab_size();
  return d;
}

CorpusFingerprint corpus_fingerprint(const RunData& data) {
  CorpusFingerprint fp;
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64 offset basis (h5::fnv1a64's default)
  for (const auto* split : {data.train.get(), data.val.get()}) {
    if (!split) continue;
    h = h5::fnv1a64(split->tokens.data(), split->tokens.size() * sizeof(int32_t), h);
    fp.tokens += split->size();
  }
  fp.fnv1a64 = h;
  return fp;
}

void check_resumable(const Config& now, const nn::ModelConfig& model, const Config& then, int64_t vocab,
                     const std::string& ckpt) {
  auto refuse = [&](const ConfigDifference& d) {
    fail(ckpt, ": ", d.key, " is ", d.a, " in the run being resumed but ", d.b,
         " now (it must not change across a resume)");
  };
  Config described = then;  // a size left to the tokenizer is this run's (the tokenizers are compared next)
  if (described.model.vocab_size == 0) described.model.vocab_size = vocab;
  if (const auto d = model_difference(model_config(described, described.model.vocab_size), model)) refuse(*d);
  if (const auto d =
          first_difference(then, now, {"data.tokenizer", "data.batching", "data.val_fraction", "train.seed"}))
    refuse(*d);
  // train.seq_len as used (0 means model.block_size): a resumed run must see the same rows.
  const int64_t a = then.train.resolved_seq_len(then.model.block_size);
  const int64_t b = now.train.resolved_seq_len(now.model.block_size);
  if (a != b) refuse({"train.seq_len", std::to_string(a), std::to_string(b)});
}

void apply_thread_setting(const Config& cfg) {
  // Threads beyond the cores only queue: every OpenMP barrier then waits for threads that are not
  // running (each also holds a stack and a BLAS buffer). 4 x the processors leaves room for a
  // machine whose processor count understates it (SMT off, a CPU quota) and refuses the rest.
  const int64_t procs = std::max(1, omp_get_num_procs());
  QKV_CHECK(cfg.train.threads <= 4 * procs, "train.threads = ", cfg.train.threads, " is more than 4 x the ", procs,
            " processors of this machine (oversubscribed threads wait at every barrier for threads that are not "
            "running): use 0 for one per processor, or at most ",
            4 * procs);
  if (cfg.train.threads > 0) omp_set_num_threads(static_cast<int>(cfg.train.threads));
}

}  // namespace qkv::train
