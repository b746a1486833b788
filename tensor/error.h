// qkv::Error and the check macro every front end uses: bad input becomes one readable line that
// names the op and the shapes at fault, e.g. "[matmul] a is [2,3] but b is [4,5]".
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace qkv {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <class... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(cat(args...));
}

}  // namespace qkv

#define QKV_CHECK(cond, ...)               \
  do {                                     \
    if (!(cond)) ::qkv::fail(__VA_ARGS__); \
  } while (0)
