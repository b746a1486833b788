// Input-file reader (see data/input_file.h).
#include "data/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "tensor/error.h"

namespace qkv {

std::string_view file_kind(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "a regular file";
    case S_IFDIR:
      return "a directory";
    case S_IFIFO:
      return "a pipe or FIFO";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    case S_IFSOCK:
      return "a socket";
    default:
      return "not a file";
  }
}

namespace {
[[noreturn]] void refuse_kind(const std::string& path, unsigned mode, std::string_view what) {
  fail(path, ": is ", file_kind(mode), ", not a regular file (", what, " is read from a file on disk)");
}
}  // namespace

void require_regular_file(const std::string& path, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, ": cannot open ", what, " (", std::strerror(errno), ")");
  if (!S_ISREG(st.st_mode)) refuse_kind(path, st.st_mode, what);
}

InputFile InputFile::open(const std::string& path, uint64_t max_bytes, std::string_view what) {
  // Non-blocking: opening a FIFO for reading otherwise waits for a writer, possibly forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail(path, ": cannot open ", what, " (", std::strerror(errno), ")");
  InputFile f;
  f.fd_ = fd;
  f.path_ = path;
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(path, ": cannot read the size of ", what, " (", std::strerror(errno), ")");
  if (!S_ISREG(st.st_mode)) refuse_kind(path, st.st_mode, what);
  f.size_ = static_cast<uint64_t>(st.st_size);
  if (f.size_ > max_bytes) fail(path, ": is ", f.size_, " bytes, over the ", max_bytes, "-byte limit for ", what);
  return f;
}

InputFile::InputFile(InputFile&& o) noexcept : fd_(o.fd_), size_(o.size_), path_(std::move(o.path_)) { o.fd_ = -1; }

InputFile& InputFile::operator=(InputFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    size_ = o.size_;
    path_ = std::move(o.path_);
  }
  return *this;
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_at(uint64_t offset, void* out, size_t n) const {
  auto* p = static_cast<char*>(out);
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd_, p + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail(path_, ": read failed at byte ", offset + done, " (", std::strerror(errno), ")");
    if (got == 0) fail(path_, ": ends at byte ", offset + done, ", expected ", offset + n, " bytes (file truncated?)");
    done += static_cast<size_t>(got);
  }
}

std::string InputFile::read_all() const {
  std::string bytes(static_cast<size_t>(size_), '\0');
  read_at(0, bytes.data(), bytes.size());
  return bytes;
}

std::string read_input_file(const std::string& path, uint64_t max_bytes, std::string_view what) {
  return InputFile::open(path, max_bytes, what).read_all();
}

std::string json_error(const nlohmann::json::exception& e, std::string_view text) {
  if (const auto* pe = dynamic_cast<const nlohmann::json::parse_error*>(&e)) {
    // byte: 1-based position of the character that could not be parsed (0: none).
    const size_t at = std::min<size_t>(pe->byte > 0 ? pe->byte - 1 : 0, text.size());
    size_t line = 1, column = 1;
    for (size_t i = 0; i < at; ++i) {
      if (text[i] == '\n') ++line, column = 1;
      else ++column;
    }
    if (at >= text.size() && pe->byte > 0)
      return cat("not valid JSON: it ends early (line ", line, ", column ", column, ")");
    return cat("not valid JSON at line ", line, ", column ", column);
  }
  if (dynamic_cast<const nlohmann::json::type_error*>(&e)) return "a value has the wrong JSON type";
  if (dynamic_cast<const nlohmann::json::out_of_range*>(&e)) return "a required key or element is missing";
  return "malformed JSON content";
}

nlohmann::json parse_json(std::string_view text, std::string_view where, const nlohmann::json::parser_callback_t& cb) {
  try {
    return nlohmann::json::parse(text.begin(), text.end(), cb);
  } catch (const nlohmann::json::exception& e) { fail(where, ": ", json_error(e, text)); }
}

}  // namespace qkv
