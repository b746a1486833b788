#include "train/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "data/h5_atomic.h"
#include "tensor/error.h"

namespace qkv::train {

std::string temp_path_for(const std::string& path) { return h5::unique_temp_path(path); }

// fsync; 0 or the errno of the failure.
static int fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return errno;
  const int rc = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return rc;
}

void commit_temp_file(const std::string& tmp, const std::string& path) {
  // Delayed allocation can report a full disk only at the sync.
  if (const int e = fsync_path(tmp)) {
    std::remove(tmp.c_str());
    fail(path, ": cannot write (", std::strerror(e), ")");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    fail(path, ": cannot replace file (", why, ")");
  }
  const auto dir = std::filesystem::path(path).parent_path();
  fsync_path(dir.empty() ? "." : dir.string());  // best effort
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    tmp = temp_path_for(path);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && (errno != EEXIST || attempt >= 8)) fail(path, ": cannot write (", std::strerror(errno), ")");
  }
  int err = 0;
  for (size_t done = 0; done < contents.size() && !err;) {
    const size_t chunk = std::min<size_t>(contents.size() - done, 1u << 20);
    if (!h5::injected_write_allowed(chunk)) {
      err = errno;
      break;
    }
    const ssize_t n = ::write(fd, contents.data() + done, chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) err = n < 0 ? errno : ENOSPC;
    else done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 && !err) err = errno;
  if (err) {
    std::remove(tmp.c_str());
    fail(path, ": cannot write (", std::strerror(err), ")");
  }
  commit_temp_file(tmp, path);
}

}  // namespace qkv::train
