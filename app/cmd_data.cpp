// qkv prepare --input TEXT (--tokenizer byte|char|bpe | --tokenizer-from CKPT|HF_DIR) --out DATA.h5
//             [--separator …] [--bpe-vocab-size N]
// qkv plot --metrics RUN_DIR/metrics.jsonl --out loss.svg
#include <cstdio>
#include <filesystem>

#include "app/commands.h"
#include "app/options.h"
#include "data/dataset.h"
#include "analysis/plot.h"
#include "train/checkpoint.h"
#include "train/hf_interop.h"
#include "train/output_paths.h"

namespace qkv::app {

void add_prepare_command(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("prepare", "tokenize a text file into train/val splits (HDF5)");
  static std::string input, tokenizer, tokenizer_from, out, separator = "none";
  static int64_t bpe_vocab = 512;
  static double val_fraction = 0.1;
  static int64_t seed = 1337;
  static bool json = false, force = false;
  add_path_option(cmd, "--input", input, "text file")->required();
  // Every kind's spelling: gpt2_bpe is then refused by make_tokenizer, which says where it comes from.
  auto* kind =
      add_choice_option(cmd, "--tokenizer", tokenizer, choice_names(kTokenizerKinds), "the tokenizer to build");
  auto* from = add_path_option(cmd, "--tokenizer-from", tokenizer_from,
                               "use the tokenizer of a checkpoint, or of a Hugging Face tokenizer directory "
                               "(tokenizer.json, or vocab.json + merges.txt: GPT-2's BPE)");
  kind->excludes(from);
  from->excludes(kind);
  add_path_option(cmd, "--out", out, "output .h5")->required();
  cmd->add_flag("--force", force, "replace --out if it exists");
  add_choice_option(cmd, "--separator", separator, choice_names(kDocSeparators), "document separator");
  add_int_option(cmd, "--bpe-vocab-size", bpe_vocab, int_key_range("data.bpe_vocab_size"),
                 "--tokenizer bpe: vocabulary size");
  add_real_option(cmd, "--val-fraction", val_fraction, real_key_range("data.val_fraction"),
                  "share of documents (or tokens) held out");
  add_int_option(cmd, "--seed", seed, {0, kIntMax}, "which documents go to validation");
  cmd->add_flag("--json", json, "print a summary as one JSON line");
  cmd->callback([&exit_code, cmd, kind] {
    refuse_alone(cmd, {"--bpe-vocab-size"}, tokenizer == "bpe", "--tokenizer bpe",
                 kind->count() ? "--tokenizer " + tokenizer : std::string());
    PrepareOptions o;
    o.bpe_vocab_size = bpe_vocab;
    o.separator = parse_separator(separator);
    o.val_fraction = val_fraction;
    o.split_seed = static_cast<uint64_t>(seed);
    QKV_CHECK(!tokenizer_from.empty() || kind->count() > 0, "prepare: give --tokenizer or --tokenizer-from");
    train::OutputGuard guard;
    guard.add_input("--input", input);
    if (!tokenizer_from.empty()) {
      guard.add_input("--tokenizer-from", tokenizer_from);
      guard.add_input_files_in("--tokenizer-from", tokenizer_from);  // an HF directory's tokenizer files
    }
    guard.check_file("--out", out, {.replace = force});
    if (!tokenizer_from.empty()) {
      // A directory is a Hugging Face tokenizer (its tokenizer files; config.json is not needed).
      std::error_code ec;
      o.given = std::filesystem::is_directory(tokenizer_from, ec)
                    ? std::shared_ptr<const Tokenizer>(train::read_hf_tokenizer(tokenizer_from))
                    : std::shared_ptr<const Tokenizer>(train::read_checkpoint_meta(tokenizer_from).tokenizer);
      o.tokenizer.reset();  // `given` is the tokenizer, whatever its kind
    } else {
      o.tokenizer = parse_tokenizer_kind(tokenizer);
    }
    const Dataset ds = prepare_dataset(input, out, o);
    std::fprintf(
        json ? stderr : stdout,
        "%s: %s tokenizer (vocab %d), train %lld tokens in %lld documents, val %lld tokens in %lld documents\n",
        out.c_str(), ds.tokenizer->kind(), ds.tokenizer->vocab_size(), static_cast<long long>(ds.train->size()),
        static_cast<long long>(ds.train->n_docs()), static_cast<long long>(ds.val->size()),
        static_cast<long long>(ds.val->n_docs()));
    if (json)
      print_json({{"out", out},
                  {"tokenizer", ds.tokenizer->kind()},
                  {"vocab_size", ds.tokenizer->vocab_size()},
                  {"train_tokens", ds.train->size()},
                  {"val_tokens", ds.val->size()},
                  {"train_docs", ds.train->n_docs()},
                  {"val_docs", ds.val->n_docs()}});
    exit_code = 0;
  });
}

void add_plot_command(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("plot", "draw the loss curves of a run as an SVG");
  static std::string metrics, out;
  static bool json = false, force = false;
  add_path_option(cmd, "--metrics", metrics, "RUN_DIR/metrics.jsonl")->required();
  add_path_option(cmd, "--out", out, "output .svg")->required();
  cmd->add_flag("--force", force, "replace --out if it exists");
  cmd->add_flag("--json", json, "print {\"out\": …} as one JSON line");
  cmd->callback([&exit_code] {
    train::OutputGuard guard;
    guard.add_input("--metrics", metrics);
    guard.check_file("--out", out, {.replace = force});
    analysis::plot_metrics(metrics, out);
    if (json) print_json({{"out", out}});
    else std::printf("wrote %s\n", out.c_str());
    exit_code = 0;
  });
}

}  // namespace qkv::app
