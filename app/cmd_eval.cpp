// qkv eval --checkpoint CKPT --data FILE [--device cpu|cuda] [--numerics MODE] [--json]
// --device: where the model runs; cpu by default, whatever device trained it.
#include <cmath>
#include <cstdio>
#include <optional>

#include "app/commands.h"
#include "app/inference.h"
#include "app/options.h"
#include "data/dataset.h"
#include "train/evaluate.h"
#include "train/session.h"

namespace qkv::app {

void add_eval_command(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("eval", "score a file: mean loss over consecutive windows of block_size + 1 tokens");
  static std::string ckpt, data_path;
  static bool json = false;
  add_path_option(cmd, "--checkpoint", ckpt, "checkpoint file (.h5)")->required();
  add_path_option(cmd, "--data", data_path, "text file or prepared .h5 (scored whole, no split)")->required();
  cmd->add_flag("--json", json, "print {loss, perplexity, tokens} as one JSON line");
  static std::string device = "cpu";
  cmd->add_option("--device", device, "cpu | cuda: where the model runs")->capture_default_str();
  static std::optional<Numerics> numerics;
  add_numerics_option(cmd, numerics);
  cmd->callback([&exit_code] {
    LoadedModel m = load_for_inference(ckpt, device, numerics);
    const std::vector<int32_t> tokens = load_eval_tokens(data_path, *m.meta.tokenizer);
    for (size_t i = 0; i < tokens.size(); ++i)
      QKV_CHECK(tokens[i] >= 0 && tokens[i] < m.model->config().vocab_size, data_path, ": token ", tokens[i], " at ", i,
                " is outside the model's vocabulary of ", m.model->config().vocab_size);
    const train::LossSum s = train::evaluate_windows(*m.model, tokens, data_path);
    const double loss = s.mean();
    std::fprintf(json ? stderr : stdout, "loss %.4f  perplexity %.3f  tokens %lld\n", loss, std::exp(loss),
                 static_cast<long long>(s.tokens));
    if (json) print_json({{"loss", loss}, {"perplexity", std::exp(loss)}, {"tokens", s.tokens}});
    exit_code = 0;
  });
}

}  // namespace qkv::app
