// Atomic file replacement: write PATH.tmp.<pid>, flush and fsync, rename over PATH. A crash or
// error midway leaves the previous file intact and no half-written PATH.
#pragma once
#include <string>

namespace qkv::train {

void write_file_atomic(const std::string& path, const std::string& contents);
// For writers that produce the temporary file themselves (HDF5): the temp name, and the commit.
std::string temp_path_for(const std::string& path);
void commit_temp_file(const std::string& tmp, const std::string& path);  // fsync + rename

}  // namespace qkv::train
