// qkv import --from DIR --out CKPT.h5 [--tokenizer byte] [--json]: a Hugging Face model directory
// (config.json + model.safetensors or its shards) as a qkv checkpoint (step 0, weights only) that
// eval, sample, leakcheck and train --init-from take (train/hf_interop.h: what is read, what is
// refused).
#include <cstdio>
#include <string>

#include "app/commands.h"
#include "app/options.h"
#include "train/hf_interop.h"
#include "train/output_paths.h"

namespace qkv::app {

void add_import_command(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("import", "read a Hugging Face model directory into a qkv checkpoint");
  static std::string from, out, tokenizer;
  static bool json = false, force = false;
  add_path_option(cmd, "--from", from, "HF model directory (config.json + model.safetensors)")->required();
  add_path_option(cmd, "--out", out, "checkpoint to write (.h5)")->required();
  cmd->add_flag("--force", force, "replace --out if it exists");
  add_choice_option(cmd, "--tokenizer", tokenizer, {"byte"},
                    "byte: the model's ids are bytes (for a directory without tokenizer files); default: DIR's files");
  cmd->add_flag("--json", json, "print one JSON object as the last stdout line");
  cmd->callback([&exit_code] {
    train::OutputGuard guard;
    guard.add_input("--from", from);
    guard.add_input_files_in("--from", from);  // config.json, the weights, the tokenizer files
    guard.check_file("--out", out, {.replace = force});
    train::HfImportOptions o;
    o.tokenizer = tokenizer;
    const train::HfImportResult r = train::import_hf(from, out, o);
    if (json) {
      print_json({{"checkpoint", r.checkpoint},
                  {"architecture", r.architecture},
                  {"tokenizer", r.tokenizer},
                  {"vocab_size", r.vocab_size},
                  {"tensors", r.tensors},
                  {"parameters", r.parameters}});
    } else {
      std::printf("wrote %s: %s, %lld tensors (%lld parameters), tokenizer %s, vocab %lld\n", r.checkpoint.c_str(),
                  r.architecture.c_str(), static_cast<long long>(r.tensors), static_cast<long long>(r.parameters),
                  r.tokenizer.c_str(), static_cast<long long>(r.vocab_size));
    }
    exit_code = 0;
  });
}

}  // namespace qkv::app
