// The name a mistyped one was probably meant to be: the config's unknown keys and the command
// line's unknown subcommands both answer "did you mean ...?" from this one rule.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace qkv {

// Levenshtein distance: single-character insertions, deletions and substitutions.
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate nearest to `name` within `max_distance` edits (the first of equals), or "".
std::string closest_name(std::string_view name, const std::vector<std::string>& candidates, size_t max_distance = 3);

}  // namespace qkv
