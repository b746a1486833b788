// Opening a shared library at first use (cuBLAS, NCCL): linking them would map hundreds of MB into
// every process, GPU or not. Failures name the library and what was tried.
#pragma once
#include <dlfcn.h>

#include <initializer_list>
#include <string>

#include "tensor/error.h"

namespace qkv {

// The first of `names` that dlopen loads; `what` names the library in the error ("[cuda] cuBLAS").
inline void* open_first_library(std::initializer_list<const char*> names, const char* what) {
  std::string errors;
  for (const char* name : names) {
    if (void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return lib;
    errors += std::string(" ") + dlerror();
  }
  fail(what, ": cannot load the library:", errors);
}

// *out = the symbol `name` of `lib`, or an error naming it.
template <class F>
void resolve_symbol(void* lib, const char* name, F* out, const char* what) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  QKV_CHECK(*out != nullptr, what, " has no symbol ", name);
}

}  // namespace qkv
