// The build folder of this test binary (where `qkv` and the Python module were built). It comes
// from build_dir.cpp, the one test source compiled with the folder's path, so every other test
// object is the same in every build folder and the compiler cache (scripts/ccache_flags.sh) shares
// it between the main, sanitized and emulated builds of scripts/test.sh.
#pragma once

namespace qkv::test {
const char* binary_dir();
}  // namespace qkv::test

#define QKV_BINARY_DIR (::qkv::test::binary_dir())
