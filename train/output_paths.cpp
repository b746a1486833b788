#include "train/output_paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include "tensor/error.h"

namespace qkv::train {
namespace {

namespace fs = std::filesystem;
using Id = std::pair<unsigned long long, unsigned long long>;

std::optional<struct stat> stat_of(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return std::nullopt;
  return st;
}
Id id_of(const struct stat& st) { return {st.st_dev, st.st_ino}; }

// `p` without a trailing separator ("runs/out/" -> "runs/out").
fs::path trimmed(const std::string& p) {
  fs::path path(p);
  if (!path.has_filename() && path.has_parent_path() && path != path.root_path()) path = path.parent_path();
  return path;
}
fs::path parent_of(const fs::path& p) { return p.has_parent_path() ? p.parent_path() : fs::path("."); }

// The identities of every directory enclosing the existing path `p` (its resolved form).
std::vector<Id> ancestor_ids(const fs::path& p) {
  std::vector<Id> out;
  std::error_code ec;
  fs::path c = fs::canonical(p, ec);
  if (ec) return out;
  while (c.has_relative_path()) {
    c = c.parent_path();
    if (const auto st = stat_of(c)) out.push_back(id_of(*st));
  }
  return out;
}

// Refuses `dir` as the place an output is created in: it (or, with make_parents, its nearest
// existing ancestor) must be a directory this process can write in.
void check_writable_dir(const std::string& option, const std::string& out, const fs::path& dir, bool make_parents) {
  fs::path p = dir;
  std::optional<struct stat> st = stat_of(p);
  while (!st && make_parents && errno == ENOENT && p.has_relative_path() && p != ".") {
    p = parent_of(p);
    st = stat_of(p);
  }
  if (!st) {
    // Name the part of the path in the way: the nearest ancestor that exists but is no directory.
    for (fs::path a = p; a.has_relative_path() && a != ".";) {
      a = parent_of(a);
      if (const auto sa = stat_of(a)) {
        QKV_CHECK(S_ISDIR(sa->st_mode), option, " ", out, ": ", a.string(), " is a file, not a directory");
        break;
      }
    }
    fail(option, " ", out, ": directory ", p.string(), " does not exist");
  }
  QKV_CHECK(S_ISDIR(st->st_mode), option, " ", out, ": ", p.string(), " is a file, not a directory");
  if (::access(p.c_str(), W_OK | X_OK) != 0)
    fail(option, " ", out, ": cannot write in ", p.string(), " (", std::strerror(errno), ")");
}

std::string marker_name(const std::string& owner) { return ".qkv-" + owner; }

}  // namespace

void mark_output_dir(const std::string& dir, const std::string& owner) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  QKV_CHECK(!ec, "cannot create ", dir, " (", ec.message(), ")");
  const fs::path marker = fs::path(dir) / marker_name(owner);
  if (fs::exists(marker, ec)) return;
  std::FILE* f = std::fopen(marker.c_str(), "w");
  QKV_CHECK(f, "cannot write ", marker.string(), " (", std::strerror(errno), ")");
  // What the marker is for, for whoever finds it.
  std::fprintf(f, "written by qkv %s: this directory holds its reports, and its next run may rewrite them\n",
               owner.c_str());
  QKV_CHECK(std::fclose(f) == 0, "cannot write ", marker.string());
}

void OutputGuard::add_input(const std::string& option, const std::string& path) {
  const auto st = stat_of(path);
  if (!st) return;
  Input in{option, path, st->st_dev, st->st_ino, S_ISDIR(st->st_mode), ancestor_ids(path)};
  inputs_.push_back(std::move(in));
}

void OutputGuard::add_input_files_in(const std::string& option, const std::string& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec)) add_input(option, (fs::path(dir) / it->path().filename()).string());
}

const OutputGuard::Input* OutputGuard::same_as_input(const std::string& path) const {
  const auto st = stat_of(path);
  if (!st) return nullptr;
  for (const Input& in : inputs_)
    if (Id{in.dev, in.ino} == id_of(*st)) return &in;
  return nullptr;
}

void OutputGuard::check_file(const std::string& option, const std::string& path, OutputRule rule) const {
  if (const Input* in = same_as_input(path)) fail(option, " ", path, " is the input ", in->option, " ", in->path);
  struct stat lst {};
  const bool exists = ::lstat(path.c_str(), &lst) == 0;  // a dangling symbolic link exists too
  if (exists) {
    for (const Id& a : ancestor_ids(path))
      for (const Input& dir : inputs_)
        if (dir.is_dir && Id{dir.dev, dir.ino} == a)
          fail(option, " ", path, " is a file inside the input ", dir.option, " ", dir.path,
               "; write it outside that directory");
    const auto st = stat_of(path);
    QKV_CHECK(!(st && S_ISDIR(st->st_mode)), option, " ", path, " is a directory; give a file path");
    QKV_CHECK(rule.replace, option, " ", path, " exists; pass --force to replace it");
  }
  check_writable_dir(option, path, parent_of(path), rule.make_parents);
}

void OutputGuard::check_dir(const std::string& option, const std::string& path, OutputRule rule) const {
  const fs::path p = trimmed(path);
  if (const auto st = stat_of(p)) {
    for (const Input& in : inputs_) {
      if (Id{in.dev, in.ino} == id_of(*st)) fail(option, " ", path, " is the input ", in.option, " ", in.path);
      for (const Id& a : in.ancestors)
        if (a == id_of(*st)) fail(option, " ", path, " contains the input ", in.option, " ", in.path);
    }
    QKV_CHECK(S_ISDIR(st->st_mode), option, " ", path, " is a file, not a directory");
    if (rule.owner && !rule.replace) {
      std::error_code ec;
      if (fs::exists(p / marker_name(rule.owner), ec)) return check_writable_dir(option, path, p, false);
      // The first entry that is not this command's, to say what the directory holds.
      for (fs::directory_iterator it(p, ec), end; !ec && it != end; it.increment(ec))
        fail(option, " ", path, " holds ", it->path().filename().string(), ", which qkv ", rule.owner,
             " did not write; choose a new directory or pass --force to write into it");
      QKV_CHECK(!ec, option, " ", path, ": cannot list (", ec.message(), ")");
    } else {
      QKV_CHECK(rule.replace, option, " ", path, " already exists; choose a directory that does not");
    }
    check_writable_dir(option, path, p, false);
    return;
  }
  struct stat lst {};
  QKV_CHECK(::lstat(p.c_str(), &lst) != 0, option, " ", path,
            " is a dangling symbolic link; remove it or choose another path");
  check_writable_dir(option, path, parent_of(p), rule.make_parents);
}

}  // namespace qkv::train
