// qkv sample --checkpoint CKPT [--prompt TEXT] [--max-new-tokens N] [--temperature T] [--top-k K]
//            [--top-p P] [--seed S] [--no-kv-cache] [--device cpu|cuda] [--json]
// --device: where the model runs; cpu by default, whatever device trained it.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>

#include "app/commands.h"
#include "app/inference.h"
#include "app/options.h"
#include "data/dataset.h"
#include "tensor/allocator.h"
#include "tensor/cuda/cuda_backend.h"
#include "train/bench.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/model_factory.h"
#include "train/sampler.h"
#include "train/session.h"

namespace qkv::app {

void add_sample_command(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("sample", "generate text from a checkpoint (KV cache by default)");
  static std::string ckpt, prompt;
  // Unset = the checkpoint config's [sample] value; every given value is checked (no sentinels).
  static std::optional<int64_t> max_new, top_k, seed;
  static std::optional<double> temperature, top_p;
  static bool no_cache = false, json = false;
  add_path_option(cmd, "--checkpoint", ckpt, "checkpoint file (.h5)")->required();
  cmd->add_option("--prompt", prompt, "text to continue (default: the config's sample.prompt, else a newline)");
  add_int_option(cmd, "--max-new-tokens", max_new, int_key_range("sample.max_new_tokens"),
                 "tokens to generate (default sample.max_new_tokens)");
  add_real_option(cmd, "--temperature", temperature, real_key_range("sample.temperature"),
                  "softmax temperature; 0 = greedy (default sample.temperature)");
  add_int_option(cmd, "--top-k", top_k, int_key_range("sample.top_k"), "keep the k most likely tokens; 0 = off");
  add_real_option(cmd, "--top-p", top_p, real_key_range("sample.top_p"), "nucleus sampling mass; 1 = off");
  add_int_option(cmd, "--seed", seed, int_key_range("sample.seed"), "sampling seed");
  cmd->add_flag("--no-kv-cache", no_cache, "recompute the whole context for every token");
  static std::string device = "cpu";
  cmd->add_option("--device", device, "cpu | cuda: where the model runs")->capture_default_str();
  static std::optional<Numerics> numerics;
  add_numerics_option(cmd, numerics);
  cmd->add_flag("--json", json,
                "print {\"prompt\", \"text\", \"tokens\"} as one JSON line at the end (bytes that are not "
                "valid UTF-8 appear as U+FFFD in the strings; \"tokens\" has the exact ids)");
  cmd->callback([&exit_code, cmd] {
    LoadedModel m = load_for_inference(ckpt, device, numerics);
    const SampleSettings& s = m.meta.config.sample;  // validated when the checkpoint's config was parsed
    train::SampleOptions o;
    o.max_new_tokens = max_new.value_or(s.max_new_tokens);
    o.temperature = temperature.value_or(s.temperature);
    o.top_k = top_k.value_or(s.top_k);
    o.top_p = top_p.value_or(s.top_p);
    o.seed = static_cast<uint64_t>(seed.value_or(s.seed));
    o.kv_cache = !no_cache;
    o.token_count = m.meta.tokenizer->vocab_size();  // rows past it (padding) have no text to print
    std::string text = cmd->count("--prompt") ? prompt : (s.prompt.empty() ? std::string("\n") : s.prompt);
    const std::vector<int32_t> ids = m.meta.tokenizer->encode(text);
    // Stream: print only complete UTF-8 characters as they form.
    std::string pending, all;
    std::FILE* out = json ? stderr : stdout;
    std::fputs(text.c_str(), out);
    const auto t0 = std::chrono::steady_clock::now();
    auto tokens = train::generate(*m.model, ids, o, [&](int32_t id) {
      m.meta.tokenizer->append_token(id, pending);
      const size_t n = utf8_complete_prefix(pending);
      std::fwrite(pending.data(), 1, n, out);
      std::fflush(out);
      all += pending.substr(0, n);
      pending.erase(0, n);
    });
    std::fwrite(pending.data(), 1, pending.size(), out);
    all += pending;
    std::fputc('\n', out);
    // print_json writes invalid UTF-8 in "prompt"/"text" as U+FFFD (a byte tokenizer can generate
    // any byte); "tokens" keeps the exact ids. tokens_per_s: generated tokens over the whole
    // generation (prefill included).
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (json)
      print_json({{"prompt", text},
                  {"text", all},
                  {"tokens", tokens},
                  {"tokens_per_s", secs > 0 ? static_cast<double>(tokens.size()) / secs : 0.0},
                  {"peak_rss_bytes", train::peak_rss_bytes()}});
    exit_code = 0;
  });
}

}  // namespace qkv::app
