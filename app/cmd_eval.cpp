// qkv eval --checkpoint CKPT (--data FILE | --ids LIST) [--per-token] [--device cpu|cuda] [--numerics MODE] [--json]
// --device: where the model runs; cpu by default, whatever device trained it.
#include <climits>
#include <cmath>
#include <cstdio>
#include <optional>

#include "app/commands.h"
#include "train/inference.h"
#include "app/options.h"
#include "train/config_schema.h"
#include "data/dataset.h"
#include "train/evaluate.h"
#include "train/session.h"

namespace qkv::app {

namespace {

// --ids "5,17,3": token ids, each an integer (app/options.h's parse_int).
std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    ids.push_back(static_cast<int32_t>(parse_int("--ids", text.substr(start, comma - start), {0, INT32_MAX})));
    start = comma + 1;
  }
  return ids;
}

}  // namespace

void add_eval_command(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("eval", "score a file: mean loss over consecutive windows of block_size + 1 tokens");
  static std::string ckpt, data_path, ids_text;
  static bool json = false, per_token = false;
  add_path_option(cmd, "--checkpoint", ckpt, "checkpoint file (.h5)")->required();
  auto* data = add_path_option(cmd, "--data", data_path, "text file or prepared .h5 (scored whole, no split)");
  auto* ids = add_list_option(
      cmd, "--ids", ids_text, [](const std::string& s) { (void)parse_ids(s); },
      "token ids to score instead of a file, comma-separated (\"5,17,3\")");
  data->excludes(ids);
  cmd->add_flag("--per-token", per_token,
                "also score every token (windows as above, plus a final partial one): log p(token | the tokens "
                "before it in its window), by the training loss's kernel; with --json as \"per_token\"");
  cmd->add_flag("--json", json, "print {loss, perplexity, tokens} as one JSON line");
  static std::string device = "cpu";
  add_choice_option(cmd, "--device", device, choice_names(kDevices), "where the model runs");
  static std::optional<Numerics> numerics;
  add_numerics_option(cmd, numerics);
  cmd->callback([&exit_code] {
    QKV_CHECK(!data_path.empty() || !ids_text.empty(), "[eval] give --data FILE or --ids LIST");
    train::LoadedModel m = train::load_for_inference(ckpt, device_option(device), numerics);
    const std::string source = data_path.empty() ? std::string("--ids") : data_path;
    const std::vector<int32_t> tokens =
        data_path.empty() ? parse_ids(ids_text) : load_eval_tokens(data_path, *m.meta.tokenizer);
    for (size_t i = 0; i < tokens.size(); ++i)
      QKV_CHECK(tokens[i] >= 0 && tokens[i] < m.model->config().vocab_size, source, ": token ", tokens[i], " at ", i,
                " is outside the model's vocabulary of ", m.model->config().vocab_size);
    std::FILE* out = json ? stderr : stdout;
    nlohmann::json result;
    if (per_token) {
      // The per-token scores include the final partial window, so the mean is over them all.
      const train::TokenScores t = train::score_tokens(*m.model, tokens, source);
      double sum = 0;
      for (double lp : t.logprob) sum -= lp;
      const double loss = sum / static_cast<double>(t.logprob.size());
      std::fprintf(out, "index token logprob\n");
      for (size_t i = 0; i < t.index.size(); ++i)
        std::fprintf(out, "%lld %d %.9g\n", static_cast<long long>(t.index[i]), t.token[i], t.logprob[i]);
      std::fprintf(out, "loss %.4f  perplexity %.3f  tokens %zu\n", loss, std::exp(loss), t.logprob.size());
      result = {{"loss", loss},
                {"perplexity", std::exp(loss)},
                {"tokens", t.logprob.size()},
                {"per_token", {{"index", t.index}, {"token", t.token}, {"logprob", t.logprob}}}};
    } else {
      const train::LossSum s = train::evaluate_windows(*m.model, tokens, source);
      const double loss = s.mean();
      std::fprintf(out, "loss %.4f  perplexity %.3f  tokens %lld\n", loss, std::exp(loss),
                   static_cast<long long>(s.tokens));
      result = {{"loss", loss}, {"perplexity", std::exp(loss)}, {"tokens", s.tokens}};
    }
    if (json) print_json(result);
    exit_code = 0;
  });
}

}  // namespace qkv::app
