# Turns a .cu file into host C++ for the QKV_CUDA=EMULATE build (tests/emulation/README.md):
#   kernel<<<grid, block[, shared[, stream]]>>>(args)
#     -> ::cuda_emu::launch("kernel", kernel, grid, block[, shared[, stream]])(args)
#   extern __shared__ ... name[];   (dynamic shared memory)
#     -> unsigned char* name = ::cuda_emu::dynamic_shared_memory();
# A launch statement holds no ';' and one '>>>', which is what the patterns rely on; clang-format may
# break the line before '<<<' or after '>>>', so whitespace is allowed there. A #line
# directive keeps compiler messages pointing at the original file.
# Usage: cmake -DIN=file.cu -DOUT=file.cpp -P rewrite_launches.cmake
file(READ "${IN}" text)
string(REGEX REPLACE "([A-Za-z_][A-Za-z_0-9]*(<[^;<>]*>)?)[ \t\r\n]*<<<([^;]*)>>>[ \t\r\n]*\\("
       "::cuda_emu::launch(\"\\1\", \\1, \\3)(" text "${text}")
string(REGEX REPLACE "extern __shared__[^;]*[ ]([A-Za-z_][A-Za-z_0-9]*)\\[\\];"
       "unsigned char* \\1 = ::cuda_emu::dynamic_shared_memory();" text "${text}")
if(text MATCHES "<<<|>>>")
  message(FATAL_ERROR "${IN}: a kernel launch the emulation rewrite does not understand is left")
endif()
file(WRITE "${OUT}.tmp" "#line 1 \"${IN}\"\n${text}")
file(RENAME "${OUT}.tmp" "${OUT}")
