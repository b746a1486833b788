// Atomic file replacement: write a fresh temporary next to PATH (PATH.tmp.<pid>.<n>.<random>,
// created exclusively, so two writers of the same PATH never share one), flush and fsync it,
// rename it over PATH. A crash or error midway (a full disk included) leaves the previous file
// intact, no half-written PATH, and (unless the process died) no temporary.
#pragma once
#include <string>

namespace qkv::train {

void write_file_atomic(const std::string& path, const std::string& contents);
// For writers that produce the temporary file themselves: a fresh temporary name for PATH
// (unique per process and call; create it with O_EXCL), and the commit.
std::string temp_path_for(const std::string& path);
void commit_temp_file(const std::string& tmp, const std::string& path);  // fsync + rename

}  // namespace qkv::train
