// Safe file writing (see data/h5_atomic.h): the injected write budget, temporary names and the
// atomic HDF5 writer.
#include "data/h5_atomic.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <utility>

#include "tensor/error.h"

namespace qkv::h5 {

namespace fs = std::filesystem;

namespace {
// Bytes left before injected writes fail; negative = no injection (the default).
std::atomic<int64_t>& write_budget() {
  static std::atomic<int64_t> budget{-1};
  return budget;
}
}  // namespace

void fail_writes_after(int64_t bytes) { write_budget().store(bytes < 0 ? -1 : bytes); }

bool injected_write_allowed(size_t n) {
  std::atomic<int64_t>& b = write_budget();
  int64_t left = b.load();
  while (left >= 0) {
    if (static_cast<uint64_t>(left) < n) {
      b.store(0);
      errno = ENOSPC;
      return false;
    }
    if (b.compare_exchange_weak(left, left - static_cast<int64_t>(n))) return true;
  }
  return true;
}

std::string unique_temp_path(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  static const uint32_t salt = [] {
    std::random_device rd;
    return static_cast<uint32_t>(rd());
  }();
  const uint64_t n = counter.fetch_add(1);
  char tail[40];
  std::snprintf(tail, sizeof tail, "%llu.%08x", static_cast<unsigned long long>(n),
                static_cast<unsigned>(salt ^ static_cast<uint32_t>(n * 0x9e3779b9u)));
  return path + ".tmp." + std::to_string(::getpid()) + "." + tail;
}

AtomicWriter::AtomicWriter(std::string path) : path_(std::move(path)) {
  // Exclusive creation: a name some other writer holds (however unlikely) is never shared.
  for (int attempt = 0;; ++attempt) {
    tmp_ = unique_temp_path(path_);
    try {
      file_ = File::create(tmp_, /*exclusive=*/true);
      break;
    } catch (const Error&) {
      if (attempt >= 8 || !fs::exists(tmp_)) throw;
    }
  }
}

AtomicWriter::~AtomicWriter() {
  if (done_) return;
  file_ = File();  // closes, ignoring errors
  std::remove(tmp_.c_str());
}

namespace {
// fsync; the error (errno) of a file's sync, 0 when it worked. A directory's sync is best effort.
int fsync_path(const std::string& p, bool directory) {
  const int fd = ::open(p.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return directory ? 0 : errno;
  const int rc = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return directory ? 0 : rc;
}
}  // namespace

void AtomicWriter::commit() {
  file_.flush();
  file_.close();
  // Delayed allocation can report a full disk only here.
  if (const int e = fsync_path(tmp_, false)) {
    std::remove(tmp_.c_str());
    done_ = true;
    ::qkv::fail("[h5] ", path_, ": cannot write ", tmp_, " to disk (", std::strerror(e), ")");
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    std::remove(tmp_.c_str());
    done_ = true;
    ::qkv::fail("[h5] ", path_, ": cannot rename ", tmp_, " into place");
  }
  const fs::path dir = fs::path(path_).parent_path();
  fsync_path(dir.empty() ? "." : dir.string(), true);
  done_ = true;
}

}  // namespace qkv::h5
