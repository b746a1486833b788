// --set section.key=value, checked against the config's key table when the command line is read.
// Apart from app/options.cpp, whose number parser builds on its own (tests/fuzz/run_fuzz.sh).
#include "app/options.h"
#include "train/config.h"

namespace qkv::app {

CLI::Option* add_set_option(CLI::App* cmd, std::vector<std::string>& sets, const std::string& help) {
  return cmd
      ->add_option_function<std::vector<std::string>>(
          "--set",
          [&sets](const std::vector<std::string>& values) {
            Config scratch;
            for (const std::string& v : values) apply_override(scratch, v);  // "--set <v>: ..." on a bad one
            sets.insert(sets.end(), values.begin(), values.end());
          },
          help)
      ->type_name(kSetType);
}

}  // namespace qkv::app
