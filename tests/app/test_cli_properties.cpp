// Every command-line option of every subcommand and every config key, given each of the values
// that most often mean "nothing", "less than nothing" or "too much" — 0, -1, "", NaN and 2^64 —
// answers with a one-line refusal that names the option or key, or the value has a documented
// meaning listed below with its reason. The options are read from the parser qkv itself builds
// (app::add_all_commands) and the keys from the config's table (config_keys()), so an option or key
// added later is walked without a change here.
//
// The command line is parsed in-process with --help appended: CLI11 stores (and so checks) every
// option's value before it looks at --help, and --help ends the parse before any command runs. A
// value an option takes therefore answers with --help; a value it refuses, with the refusal.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "app/commands.h"
#include "app/options.h"
#include "train/config.h"

using namespace qkv;

namespace {

const std::vector<std::string> kProbes = {"0", "-1", "", "nan", "18446744073709551616"};

struct Answer {
  bool refused = false;
  std::string message;
};

Answer parse_with_help(std::vector<std::string> args) {
  CLI::App app;
  int exit_code = 0;
  app::add_all_commands(app, exit_code);
  args.push_back("--help");
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments last first
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) { return {}; } catch (const CLI::ParseError& e) {
    return {true, e.what()};
  } catch (const std::exception& e) { return {true, e.what()}; }
  return {true, "--help did not end the parse"};
}

// An option's name as qkv's messages spell it: "--what", or a positional argument's own name.
std::string spelling(const CLI::Option& o) {
  if (!o.get_lnames().empty()) return "--" + o.get_lnames().front();
  if (!o.get_snames().empty()) return "-" + o.get_snames().front();
  return o.get_name();
}

// The values a command line may give and the meaning each has (docs/cli.md): "<command> <option>
// <value>" -> why it is not refused. Every other probe of a number, a list or a choice must be.
const std::map<std::string, std::string> kMeaningfulOptionValues = {
    {"attention-map --layer 0", "layers count from 0"},
    {"attention-map --head 0", "heads count from 0"},
    {"bench --count 0", "no greedy completions: the consistency count is skipped"},
    {"bench --pattern-global 0", "global or bigbird with no global position is a pattern"},
    {"bench --pattern-random-blocks 0", "bigbird with no random block is a pattern (local and global only)"},
    {"eval --ids 0", "token id 0 is a token"},
    {"gradcheck --atol 0", "a zero tolerance asks for exact agreement"},
    {"gradcheck --rtol 0", "a zero tolerance asks for exact agreement"},
    {"gradcheck --directions 0", "only the element checks (both 0 is refused when the command runs)"},
    {"gradcheck --elements 0", "only the directional checks (both 0 is refused when the command runs)"},
    {"gradcheck --seed 0", "a seed: every integer in range is one"},
    {"leakcheck --max-ngram-share 0", "no val n-gram may be found in train"},
    {"prepare --seed 0", "a seed: every integer in range is one"},
    {"prepare --val-fraction 0", "no held-out split (data.val_fraction = 0)"},
    {"sample --max-new-tokens 0", "no new token: the prompt alone (sample.max_new_tokens = 0)"},
    {"sample --temperature 0", "greedy decoding (sample.temperature = 0)"},
    {"sample --top-k 0", "no top-k cut (sample.top_k = 0)"},
    {"sample --seed 0", "a seed: every integer in range is one"},
};

}  // namespace

TEST_CASE("every option of every command refuses 0, -1, \"\", NaN and 2^64 by name, or the value means something",
          "[refusals][cli][property][long]") {
  CLI::App app;
  int exit_code = 0;
  app::add_all_commands(app, exit_code);
  std::set<std::string> used;  // allow-list entries met, so a stale one fails too
  int walked = 0;
  for (const CLI::App* sub : app.get_subcommands(std::function<bool(const CLI::App*)>{})) {
    for (const CLI::Option* opt : sub->get_options()) {
      if (opt->get_expected_max() == 0) continue;  // a flag: it takes no value
      const std::string name = spelling(*opt), type = opt->get_type_name();
      const std::string where = sub->get_name() + " " + name;
      INFO(where << " (" << type << ")");
      // Every option that takes a value is declared through app/options.h, which states its kind.
      CHECK((type == app::kPathType || type == app::kTextType || type == app::kChoiceType || type == app::kListType ||
             type == app::kIntType || type == app::kRealType || type == app::kSetType));
      for (const std::string& value : kProbes) {
        std::vector<std::string> args{sub->get_name()};
        if (opt->nonpositional()) args.push_back(name);
        args.push_back(value);
        const Answer a = parse_with_help(args);
        ++walked;
        INFO("value \"" << value << "\": " << (a.refused ? "refused: " + a.message : "taken"));
        if (a.refused) {
          CHECK(a.message.find(name) != std::string::npos);
          CHECK(a.message.find('\n') == std::string::npos);
          continue;
        }
        // Taken: a file name or free text takes any non-empty text; anything else only what is listed.
        const bool any_text = (type == app::kPathType || type == app::kTextType) && !value.empty();
        const auto listed = kMeaningfulOptionValues.find(where + " " + value);
        if (listed != kMeaningfulOptionValues.end()) used.insert(listed->first);
        CHECK((any_text || listed != kMeaningfulOptionValues.end()));
      }
    }
  }
  CHECK(walked > 300);  // the walk reached the options (about 100 of them)
  for (const auto& [entry, why] : kMeaningfulOptionValues) {
    INFO("listed but refused (or no such option): " << entry);
    CHECK(used.count(entry) == 1);
  }
}

namespace {

// "<key> <value>" -> why the config takes it (docs/config.md states each meaning). A text key
// (kTextKeys) takes any non-empty text besides.
const std::map<std::string, std::string> kMeaningfulKeyValues = {
    {"model.n_kv_head 0", "0 = model.n_head (multi-head attention)"},
    {"model.vocab_size 0", "0 = the tokenizer's vocabulary"},
    {"model.ffn_hidden 0", "0 = the family's MLP width"},
    {"model.position ", "\"\" = the family's position scheme"},
    {"model.norm ", "\"\" = the family's norm"},
    {"model.activation ", "\"\" = the family's activation"},
    {"model.window 0", "0 = no sliding window"},
    {"model.dropout 0", "no dropout"},
    {"model.attn_dropout 0", "no dropout"},
    {"model.init_std 0", "every weight 0: the uniform predictor, loss log V"},
    {"model.linear_features 0", "0 = the head size"},
    {"model.pattern_stride 0", "0 = ceil(sqrt(block_size))"},
    {"model.pattern_local 0", "0 = the pattern's default width"},
    {"model.pattern_global 0", "no global position: global and bigbird are still patterns"},
    {"model.pattern_global_tokens ", "\"\" = the first model.pattern_global positions"},
    {"model.pattern_global_tokens 0", "position 0 is global"},
    {"model.pattern_random_blocks 0", "bigbird without random blocks"},
    {"model.pattern_block_size 0", "0 = clamp(block_size / 4, 1, 64)"},
    {"model.pattern_seed 0", "a seed: every integer in range is one"},
    {"data.path ", "no corpus: data.random_tokens, or a command that reads none (cost, bench)"},
    {"data.val_fraction 0", "no held-out split"},
    {"train.seq_len 0", "0 = model.block_size"},
    {"train.lr 0", "a run that leaves the weights where they start"},
    {"train.min_lr 0", "the cosine schedule ends at 0"},
    {"train.warmup_steps 0", "no warmup"},
    {"train.weight_decay 0", "no weight decay"},
    {"train.beta1 0", "no moving average of the gradient"},
    {"train.beta2 0", "no moving average of its square"},
    {"train.grad_clip 0", "0 = no clipping"},
    {"train.seed 0", "a seed: every integer in range is one"},
    {"train.checkpoint_interval 0", "0 = a checkpoint at the end only"},
    {"train.threads 0", "0 = every core"},
    {"train.zero 0", "no optimizer-state sharding"},
    {"train.numerics ", "\"\" = by train.device (invariant on the CPU, standard on CUDA)"},
    {"sample.max_new_tokens 0", "the prompt alone"},
    {"sample.temperature 0", "greedy decoding"},
    {"sample.top_k 0", "0 = no top-k cut"},
    {"sample.seed 0", "a seed: every integer in range is one"},
    {"sample.prompt ", "\"\" = a newline"},
};
const std::set<std::string> kTextKeys = {"data.path", "train.out_dir", "sample.prompt"};  // a path or free text

}  // namespace

TEST_CASE("every config key refuses 0, -1, \"\", NaN and 2^64 by name, or the value means something",
          "[refusals][config][property]") {
  // Each key under every attention pattern, so a key that only acts under some is walked where it acts.
  const std::vector<std::string> patterns = {"full",    "window",       "strided", "global",
                                             "bigbird", "block_sparse", "linear"};
  std::set<std::string> used;
  for (const std::string& key : config_keys()) {
    for (const std::string& value : kProbes) {
      const std::string text = value.empty() ? "\"\"" : value;  // TOML's empty string
      bool taken = false;
      for (const std::string& pattern : patterns) {
        std::vector<std::string> sets{key + "=" + text};
        if (key != "model.attention_pattern") sets.insert(sets.begin(), "model.attention_pattern=" + pattern);
        INFO(key << " = " << text << " under model.attention_pattern = " << pattern);
        try {
          (void)parse_config_text("", "x.toml", sets);
          taken = true;
        } catch (const Error& e) {
          const std::string message = e.what();
          INFO("refused: " << message);
          CHECK(message.find(key) != std::string::npos);
          CHECK(message.find('\n') == std::string::npos);
        }
      }
      if (!taken) continue;
      const auto listed = kMeaningfulKeyValues.find(key + " " + value);
      if (listed != kMeaningfulKeyValues.end()) used.insert(listed->first);
      INFO(key << " = " << text << " is taken");
      CHECK((listed != kMeaningfulKeyValues.end() || (kTextKeys.count(key) && !value.empty())));
    }
  }
  for (const auto& [entry, why] : kMeaningfulKeyValues) {
    INFO("listed but refused (or no such key): " << entry);
    CHECK(used.count(entry) == 1);
  }
}
