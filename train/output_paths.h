// The one check every writing command runs on its outputs before it writes anything: an output
// must not be, contain or lead to one of the command's inputs, and an existing file is replaced
// only when the command says so (`--force`). Every refusal is one line naming the output's
// option and path, and the input's ("--out runs/a.h5 is the input --checkpoint runs/a.h5").
//
// Files are compared by identity (device and inode, following symbolic links), so a symbolic or
// hard link to an input is the input. An output file is refused when
//   - it is an input file or directory, or an existing file inside an input directory (import's
//     model.safetensors in its --from directory; a file there the reader may take);
//   - it is a directory;
//   - it exists (a dangling symbolic link included) and the rule does not allow replacing it;
//   - its directory does not exist (unless the writer makes it), is not a directory, or cannot be
//     written (the part of the path at fault is named: "runs is a file, not a directory").
// An output directory is refused when it is an input, contains an input, is an existing
// non-directory, exists and the rule does not allow reusing it (OutputRule::owner), or cannot be
// created or written.
//
// The check runs once, before the command reads its model or data; a path that changes between
// the check and the write is not guarded against.
#pragma once
#include <string>
#include <vector>

namespace qkv::train {

struct OutputRule {
  bool replace = false;       // an existing file may be replaced (a directory: reused and rewritten)
  bool make_parents = false;  // the writer creates missing parent directories itself
  // The command whose reports a directory holds (study, heads, leakcheck): an existing directory
  // is then reused without `replace` when it is empty or that command created it (its marker,
  // mark_output_dir); one holding anything else (a training run, another command's report, a
  // user's files) is refused unless `replace` (the command's --force).
  const char* owner = nullptr;
};

// Creates `dir` (and its parents) for command `owner` and leaves the marker that lets the next
// run of the same command reuse it: the file `dir`/.qkv-<owner>.
void mark_output_dir(const std::string& dir, const std::string& owner);

class OutputGuard {
 public:
  // An input file or directory, under the option (or config key) that named it. A path that does
  // not exist is skipped: its reader refuses it.
  void add_input(const std::string& option, const std::string& path);
  // Every regular file directly inside `dir` (what a reader of that directory may open), each
  // named "<option> <dir>/<name>".
  void add_input_files_in(const std::string& option, const std::string& dir);

  // Throw qkv::Error when the output breaks a rule above.
  void check_file(const std::string& option, const std::string& path, OutputRule rule = {}) const;
  void check_dir(const std::string& option, const std::string& path, OutputRule rule = {}) const;

 private:
  struct Input {
    std::string option, path;
    unsigned long long dev = 0, ino = 0;
    bool is_dir = false;
    std::vector<std::pair<unsigned long long, unsigned long long>> ancestors;  // (dev, ino) of each enclosing directory
  };
  const Input* same_as_input(const std::string& path) const;
  std::vector<Input> inputs_;
};

}  // namespace qkv::train
