// qkv sample --checkpoint CKPT [--prompt TEXT] [--max-new-tokens N] [--temperature T] [--top-k K]
//            [--top-p P] [--seed S] [--no-kv-cache] [--device cpu|cuda] [--logprobs] [--json]
//            [--prompts FILE [--batch-size B]]
// --device: where the model runs; cpu by default, whatever device trained it.
// --prompts: many prompts, one JSON line each (a string, or {"prompt": "..."}), generated with
// continuous batching (train::generate_batch); one JSON line per prompt in prompt order.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>

#include "app/commands.h"
#include "train/inference.h"
#include "app/options.h"
#include "train/config_schema.h"
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

namespace {

// The prompts of a --prompts file: each non-blank line a JSON string or an object with a string
// "prompt"; a line that is neither is refused naming the file and line.
std::vector<std::string> read_prompt_lines(const std::string& path) {
  const std::string text = read_text_file(path);
  std::vector<std::string> prompts;
  size_t pos = 0;
  for (int64_t line_no = 1; pos < text.size(); ++line_no) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_string()) {
      prompts.push_back(j.get<std::string>());
    } else if (j.is_object() && j.contains("prompt") && j["prompt"].is_string()) {
      prompts.push_back(j["prompt"].get<std::string>());
    } else {
      fail(path, ":", line_no, ": each line must be a JSON string or an object {\"prompt\": \"...\"}",
           j.is_discarded() ? " (this line is not valid JSON)" : "");
    }
  }
  QKV_CHECK(!prompts.empty(), path, ": no prompts (one JSON line per prompt)");
  return prompts;
}

// The text of generated ids (bytes that are not valid UTF-8 are kept; print_json shows them as U+FFFD).
std::string decode_ids(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) tok.append_token(id, s);
  return s;
}

}  // namespace

void add_sample_command(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("sample", "generate text from a checkpoint (KV cache by default)");
  static std::string ckpt, prompt;
  // Unset = the checkpoint config's [sample] value; every given value is checked (no sentinels).
  static std::optional<int64_t> max_new, top_k, seed;
  static std::optional<double> temperature, top_p;
  static bool no_cache = false, json = false, logprobs = false;
  static std::string prompts_path;
  static int64_t batch_size = 8;
  add_path_option(cmd, "--checkpoint", ckpt, "checkpoint file (.h5)")->required();
  add_text_option(cmd, "--prompt", prompt, false,
                  "text to continue (default: the config's sample.prompt, else a newline)");
  add_int_option(cmd, "--max-new-tokens", max_new, int_key_range("sample.max_new_tokens"),
                 "tokens to generate (default sample.max_new_tokens)");
  add_real_option(cmd, "--temperature", temperature, real_key_range("sample.temperature"),
                  "softmax temperature; 0 = greedy (default sample.temperature)");
  add_int_option(cmd, "--top-k", top_k, int_key_range("sample.top_k"), "keep the k most likely tokens; 0 = off");
  add_real_option(cmd, "--top-p", top_p, real_key_range("sample.top_p"), "nucleus sampling mass; 1 = off");
  add_int_option(cmd, "--seed", seed, int_key_range("sample.seed"), "sampling seed");
  cmd->add_flag("--no-kv-cache", no_cache, "recompute the whole context for every token");
  static std::string device = "cpu";
  add_choice_option(cmd, "--device", device, choice_names(kDevices), "where the model runs");
  static std::optional<Numerics> numerics;
  add_numerics_option(cmd, numerics);
  cmd->add_flag("--json", json,
                "print {\"prompt\", \"text\", \"tokens\"} as one JSON line at the end (bytes that are not "
                "valid UTF-8 appear as U+FFFD in the strings; \"tokens\" has the exact ids)");
  cmd->add_flag("--logprobs", logprobs,
                "with --json: add \"logprobs\", log p(token | context) of each generated token under the model's "
                "raw logits (temperature 1)");
  add_path_option(cmd, "--prompts", prompts_path,
                  "JSON lines file of prompts (each a string or {\"prompt\": ...}): generate for all with "
                  "continuous batching, one JSON line per prompt in order");
  add_int_option(cmd, "--batch-size", batch_size, {1, 4096}, "--prompts: rows decoded together");
  cmd->callback([&exit_code, cmd] {
    QKV_CHECK(!cmd->count("--prompts") || !cmd->count("--prompt"), "[sample] give --prompt or --prompts, not both");
    QKV_CHECK(!cmd->count("--prompts") || !no_cache,
              "[sample] --prompts decodes through per-prompt KV caches; --no-kv-cache is for a single --prompt");
    refuse_alone(cmd, {"--batch-size"}, cmd->count("--prompts") > 0, "--prompts");
    refuse_alone(cmd, {"--logprobs"}, json, "--json (it adds to the JSON output)");
    // Read before the checkpoint, so a bad prompts file is refused without loading a model.
    const std::vector<std::string> texts =
        cmd->count("--prompts") ? read_prompt_lines(prompts_path) : std::vector<std::string>{};
    train::LoadedModel m = train::load_for_inference(ckpt, device_option(device), numerics);
    const SampleSettings& s = m.meta.config.sample;  // validated when the checkpoint's config was parsed
    train::SampleOptions o;
    o.max_new_tokens = max_new.value_or(s.max_new_tokens);
    o.temperature = temperature.value_or(s.temperature);
    o.top_k = top_k.value_or(s.top_k);
    o.top_p = top_p.value_or(s.top_p);
    o.seed = static_cast<uint64_t>(seed.value_or(s.seed));
    o.kv_cache = !no_cache;
    o.token_count = m.meta.tokenizer->vocab_size();  // rows past it (padding) have no text to print
    if (!texts.empty()) {
      // One JSON line per prompt, in prompt order, as soon as it and every prompt before it are done.
      std::vector<std::vector<int32_t>> prompts;
      for (const std::string& t : texts) prompts.push_back(m.meta.tokenizer->encode(t));
      int64_t generated = 0;
      const auto t0 = std::chrono::steady_clock::now();
      train::generate_batch(*m.model, prompts, o, batch_size, logprobs, [&](size_t i, const train::Completion& c) {
        nlohmann::json j = {{"index", i},
                            {"prompt", texts[i]},
                            {"text", decode_ids(*m.meta.tokenizer, c.tokens)},
                            {"tokens", c.tokens}};
        if (logprobs) j["logprobs"] = c.logprobs;
        print_json(j);
        generated += static_cast<int64_t>(c.tokens.size());
      });
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      // tokens_per_s: generated tokens over the whole run (prefills included).
      if (json)
        print_json({{"prompts", prompts.size()},
                    {"tokens", generated},
                    {"tokens_per_s", secs > 0 ? static_cast<double>(generated) / secs : 0.0},
                    {"batch_size", batch_size},
                    {"seconds", secs},
                    {"numerics", choice_name(kNumericsModes, qkv::numerics())},
                    {"dtype", m.model->bf16_autocast() ? "bf16" : "float32"},
                    {"peak_rss_bytes", train::peak_rss_bytes()}});
      exit_code = 0;
      return;
    }
    std::string text = cmd->count("--prompt") ? prompt : (s.prompt.empty() ? std::string("\n") : s.prompt);
    const std::vector<int32_t> ids = m.meta.tokenizer->encode(text);
    // Stream: print only complete UTF-8 characters as they form.
    std::string pending, all;
    std::FILE* out = json ? stderr : stdout;
    std::fputs(text.c_str(), out);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<double> lps;
    auto tokens = train::generate(
        *m.model, ids, o,
        [&](int32_t id) {
          m.meta.tokenizer->append_token(id, pending);
          const size_t n = utf8_complete_prefix(pending);
          std::fwrite(pending.data(), 1, n, out);
          std::fflush(out);
          all += pending.substr(0, n);
          pending.erase(0, n);
        },
        logprobs ? &lps : nullptr);
    std::fwrite(pending.data(), 1, pending.size(), out);
    all += pending;
    std::fputc('\n', out);
    // print_json writes invalid UTF-8 in "prompt"/"text" as U+FFFD (a byte tokenizer can generate
    // any byte); "tokens" keeps the exact ids. tokens_per_s: generated tokens over the whole
    // generation (prefill included).
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (json) {
      nlohmann::json j = {{"prompt", text},
                          {"prompt_tokens", ids},
                          {"text", all},
                          {"tokens", tokens},
                          {"tokens_per_s", secs > 0 ? static_cast<double>(tokens.size()) / secs : 0.0},
                          {"dtype", m.model->bf16_autocast() ? "bf16" : "float32"},
                          {"peak_rss_bytes", train::peak_rss_bytes()}};
      if (logprobs) j["logprobs"] = lps;
      print_json(j);
    }
    exit_code = 0;
  });
}

}  // namespace qkv::app
