// qkv export --checkpoint CKPT --out DIR [--dtype f32|bf16] [--json]: a directory Hugging Face's
// `transformers` loads with AutoModelForCausalLM.from_pretrained(DIR) (train/hf_interop.h says
// what is written and what is refused).
#include <cstdio>
#include <string>

#include "app/commands.h"
#include "app/options.h"
#include "train/hf_interop.h"
#include "train/output_paths.h"

namespace qkv::app {

void add_export_command(CLI::App& root, int& exit_code) {
  auto* cmd =
      root.add_subcommand("export", "write a checkpoint as a Hugging Face model directory (safetensors + config.json)");
  static std::string checkpoint, out, dtype = "f32";
  static bool json = false;
  add_path_option(cmd, "--checkpoint", checkpoint, "checkpoint file (.h5)")->required();
  add_path_option(cmd, "--out", out, "output directory (must not exist)")->required();
  add_choice_option(cmd, "--dtype", dtype, {"f32", "bf16"}, "stored weights");
  cmd->add_flag("--json", json, "print one JSON object as the last stdout line");
  cmd->callback([&exit_code] {
    train::OutputGuard guard;
    guard.add_input("--checkpoint", checkpoint);
    guard.check_dir("--out", out);
    train::HfExportOptions o;
    o.dtype = dtype;
    const train::HfExportResult r = train::export_hf(checkpoint, out, o);
    if (json) {
      print_json({{"out", r.dir},
                  {"architecture", r.architecture},
                  {"dtype", r.dtype},
                  {"tensors", r.tensors},
                  {"parameters", r.parameters},
                  {"safetensors_bytes", r.bytes},
                  {"tokenizer", r.tokenizer},
                  {"files", r.files}});
    } else {
      std::printf(
          "wrote %s: %s, %lld tensors (%lld parameters, %s), tokenizer %s\n", r.dir.c_str(), r.architecture.c_str(),
          static_cast<long long>(r.tensors), static_cast<long long>(r.parameters), r.dtype.c_str(),
          r.tokenizer == "hf"
              ? "as HF files"
              : "as qkv_tokenizer.json only (a mapping, not an HF tokenizer; AutoTokenizer refuses the directory)");
    }
    exit_code = 0;
  });
}

}  // namespace qkv::app
