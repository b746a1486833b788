#include "build_dir.h"

const char* qkv::test::binary_dir() { return QKV_BUILD_DIR; }
