// Loss curves as a standalone SVG a person can open in a browser: train loss (per logged step)
// and validation loss (per evaluation) against the step, with labelled axes.
#pragma once
#include <string>

namespace qkv::analysis {

// Reads metrics JSON lines (fields "step", "loss", optional "val_loss") and writes an SVG.
// Throws qkv::Error naming the file and line on unreadable input; the write is atomic.
void plot_metrics(const std::string& metrics_path, const std::string& out_svg);

}  // namespace qkv::analysis
