#include "train/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "tensor/error.h"

namespace qkv::train {

std::string temp_path_for(const std::string& path) { return path + ".tmp." + std::to_string(::getpid()); }

static void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void commit_temp_file(const std::string& tmp, const std::string& path) {
  fsync_path(tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    fail(path, ": cannot replace file (", why, ")");
  }
  const auto dir = std::filesystem::path(path).parent_path();
  fsync_path(dir.empty() ? "." : dir.string());
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  const std::string tmp = temp_path_for(path);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  QKV_CHECK(f != nullptr, path, ": cannot write (", std::strerror(errno), ")");
  const bool ok = std::fwrite(contents.data(), 1, contents.size(), f) == contents.size() && std::fflush(f) == 0;
  std::fclose(f);
  if (!ok) {
    std::remove(tmp.c_str());
    fail(path, ": write failed");
  }
  commit_temp_file(tmp, path);
}

}  // namespace qkv::train
