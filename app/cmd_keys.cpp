// qkv keys
//   Every config key: its type, default, accepted range and meaning, as Markdown tables (the key
//   reference of docs/config.md is this output), from the one table that declares the keys
//   (train/config.cpp).
#include <cstdio>

#include "app/commands.h"
#include "train/config.h"

namespace qkv::app {

void add_keys_command(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("keys", "list every config key: type, default, range, meaning (Markdown)");
  cmd->callback([&exit_code] {
    std::fputs(config_reference().c_str(), stdout);
    exit_code = 0;
  });
}

}  // namespace qkv::app
