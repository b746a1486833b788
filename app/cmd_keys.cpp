// qkv keys [--json]
//   Every config key: its type, default, accepted range and meaning, as Markdown tables (the key
//   reference of docs/config.md is this output), from the one table that declares the keys
//   (train/config.cpp). --json: {"keys": [{key, type, default, default_is_value, accepts, meaning,
//   used_by}, ...]} as one line.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "train/config.h"

namespace qkv::app {

void add_keys_command(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("keys", "list every config key: type, default, range, meaning (Markdown)");
  static bool json = false;
  cmd->add_flag("--json", json, "print {keys: [...]} as one JSON line");
  cmd->callback([&exit_code] {
    if (json) {
      nlohmann::json keys = nlohmann::json::array();
      for (const KeyDoc& d : key_docs())
        keys.push_back({{"key", d.key},
                        {"type", d.type},
                        {"default", d.default_value},
                        {"default_is_value", d.default_is_value},
                        {"accepts", d.accepts},
                        {"meaning", d.meaning},
                        {"used_by", d.used_by}});
      print_json({{"keys", keys}});
    } else {
      std::fputs(config_reference().c_str(), stdout);
    }
    exit_code = 0;
  });
}

}  // namespace qkv::app
