// qkv attention-map --checkpoint CKPT --text TEXT [--layer L] [--head H] --out map.png [--grid grid.png] [--json]
//   One head's attention weights on TEXT as a labelled heatmap (rows = queries, columns = keys),
//   and optionally every layer x head as a grid.
#include <cstdio>
#include <filesystem>

#include "app/commands.h"
#include "app/options.h"
#include "tensor/numerics.h"
#include "analysis/attention_map.h"
#include "train/checkpoint.h"
#include "train/output_paths.h"
#include "train/model_factory.h"
#include "analysis/png.h"
#include "train/session.h"

namespace qkv::app {

void add_attention_map_command(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("attention-map", "draw a head's attention weights on a text as a PNG heatmap");
  static std::string ckpt, text, out_path, grid_path;
  static int64_t layer = 0, head = 0;
  static bool json = false, force = false;
  add_path_option(cmd, "--checkpoint", ckpt, "checkpoint file (.h5)")->required();
  add_text_option(cmd, "--text", text, false, "the text to run (its last block_size tokens are used)")->required();
  add_int_option(cmd, "--layer", layer, {0, kIntMax}, "layer index, below model.n_layer");
  add_int_option(cmd, "--head", head, {0, kIntMax}, "query head index, below model.n_head");
  add_path_option(cmd, "--out", out_path, "PNG file for the head's heatmap")->required();
  add_path_option(cmd, "--grid", grid_path, "PNG file for the grid of every layer and head");
  cmd->add_flag("--force", force, "replace --out and --grid if they exist");
  cmd->add_flag("--json", json, "print {out, grid, tokens, layer, head} as one JSON line");
  static std::optional<Numerics> numerics;
  add_numerics_option(cmd, numerics);
  cmd->callback([&exit_code] {
    train::CheckpointMeta meta = train::read_checkpoint_meta(ckpt);
    train::OutputGuard guard;
    guard.add_input("--checkpoint", ckpt);
    guard.add_input("data.path", meta.config.data.path);  // the checkpoint's corpus
    guard.check_file("--out", out_path, {.replace = force});
    if (!grid_path.empty()) {
      guard.check_file("--grid", grid_path, {.replace = force});
      std::error_code ec;  // both directories were checked above; on an error the paths are compared as given
      const auto resolved = [&ec](const std::string& p) {
        const auto r = std::filesystem::weakly_canonical(p, ec);
        return ec ? std::filesystem::path(p) : r;
      };
      QKV_CHECK(resolved(grid_path) != resolved(out_path), "--grid ", grid_path, " is the same file as --out ",
                out_path, "; give two paths");
    }
    auto model = train::build_model(meta.config.resolved(), meta.tokenizer->vocab_size());
    train::load_model_weights(ckpt, *model);
    model->eval();
    train::apply_thread_setting(meta.config);
    set_numerics(numerics.value_or(meta.config.train.resolved_numerics()));
    const nn::ModelConfig& c = model->config();
    QKV_CHECK(layer >= 0 && layer < c.n_layer, "[attention-map] --layer ", layer, " is outside [0, ", c.n_layer, ")");
    QKV_CHECK(head >= 0 && head < c.n_head, "[attention-map] --head ", head, " is outside [0, ", c.n_head, ")");
    std::vector<int32_t> ids = meta.tokenizer->encode(text);
    QKV_CHECK(!ids.empty(), "[attention-map] --text encodes to no tokens");
    if (static_cast<int64_t>(ids.size()) > c.block_size) {
      std::fprintf(stderr, "attention-map: the text is %zu tokens; using its last %lld (block_size)\n", ids.size(),
                   static_cast<long long>(c.block_size));
      ids.erase(ids.begin(), ids.end() - c.block_size);
    }
    const analysis::AttentionMaps maps = analysis::compute_attention_maps(*model, ids, meta.tokenizer.get());
    analysis::write_png(out_path, analysis::render_attention_map(maps, layer, head));
    if (!grid_path.empty()) analysis::write_png(grid_path, analysis::render_attention_grid(maps));
    std::fprintf(json ? stderr : stdout, "attention-map: layer %lld head %lld over %lld tokens -> %s%s%s\n",
                 static_cast<long long>(layer), static_cast<long long>(head), static_cast<long long>(maps.tokens),
                 out_path.c_str(), grid_path.empty() ? "" : ", grid -> ", grid_path.c_str());
    if (json)
      print_json({{"out", out_path}, {"grid", grid_path}, {"tokens", maps.tokens}, {"layer", layer}, {"head", head}});
    exit_code = 0;
  });
}

}  // namespace qkv::app
