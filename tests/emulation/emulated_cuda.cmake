# The QKV_CUDA=EMULATE build (included by the top-level CMakeLists.txt; see README.md here): every
# .cu file, rewritten by rewrite_launches.cmake into host C++, plus tensor/cuda/*.cpp, compiled
# against the shim headers of include/ and linked with the runtime emulator. That emulator is built
# as libcublas.so.13, so the dlopen of tensor/cuda/matmul.cu finds it (already loaded) instead of
# the real cuBLAS.
set(QKV_EMULATION_DIR ${CMAKE_SOURCE_DIR}/tests/emulation)
file(GLOB QKV_EMULATED_CU CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tensor/cuda/*.cu ${CMAKE_SOURCE_DIR}/attention/cuda/*.cu
     ${CMAKE_SOURCE_DIR}/attention/linear/*.cu)
file(GLOB QKV_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tensor/cuda/*.cpp)
# qkv_emulated_cu(<var> <file.cu>): adds the rule that rewrites <file.cu> into host C++ and sets
# <var> to the generated source (also used by tests/CMakeLists.txt for the test-only kernels).
function(qkv_emulated_cu var cu)
  file(RELATIVE_PATH rel ${CMAKE_SOURCE_DIR} ${cu})
  set(out ${CMAKE_BINARY_DIR}/emulated/${rel}.cpp)
  add_custom_command(OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DIN=${cu} -DOUT=${out} -P ${QKV_EMULATION_DIR}/rewrite_launches.cmake
    DEPENDS ${cu} ${QKV_EMULATION_DIR}/rewrite_launches.cmake
    COMMENT "Rewriting ${rel} for the CUDA emulator")
  # The kernels reinterpret register words (bf16 pairs as uint32): fine on a GPU, aliasing in C++.
  set_source_files_properties(${out} PROPERTIES COMPILE_OPTIONS "-fno-strict-aliasing;-Wno-unknown-pragmas;-Wno-sign-compare")
  set(${var} ${out} PARENT_SCOPE)
endfunction()
foreach(cu ${QKV_EMULATED_CU})
  qkv_emulated_cu(out ${cu})
  list(APPEND QKV_CUDA_SOURCES ${out})
endforeach()

add_library(qkv_cuda_emulator SHARED ${QKV_EMULATION_DIR}/cuda_runtime_emulator.cpp)
set_target_properties(qkv_cuda_emulator PROPERTIES OUTPUT_NAME cublas VERSION 13 SOVERSION 13)
target_include_directories(qkv_cuda_emulator PUBLIC ${QKV_EMULATION_DIR}/include)
target_compile_options(qkv_cuda_emulator PRIVATE -fno-strict-aliasing -Wall -Wextra)
