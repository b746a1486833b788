// Element types and devices. float32/float64 compute on the CPU; int32/int64 hold token ids and
// indices; boolean holds masks; bf16/f16 are storage types for the CUDA backend (converted with to()).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace qkv {

enum class DType : uint8_t { f32, f64, i32, i64, bf16, f16, boolean };
enum class Device : uint8_t { cpu, cuda };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::f64:
    case DType::i64:
      return 8;
    case DType::bf16:
    case DType::f16:
      return 2;
    case DType::boolean:
      return 1;
  }
  return 0;
}
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "float32";
    case DType::f64:
      return "float64";
    case DType::i32:
      return "int32";
    case DType::i64:
      return "int64";
    case DType::bf16:
      return "bfloat16";
    case DType::f16:
      return "float16";
    case DType::boolean:
      return "bool";
  }
  return "?";
}
inline bool is_floating(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16; }
inline bool is_integral(DType t) { return t == DType::i32 || t == DType::i64; }
inline const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

// bfloat16: the upper 16 bits of a float32, rounded to nearest even; a NaN stays a NaN (quiet).
// On float32 bit patterns, giving the rounded value widened back (low 16 bits zero). Branch-free,
// for a uint32_t or a GCC vector of them, so that loops over it vectorise.
template <class U>
inline U bf16_rounded_bits(U u) {
  return (u & 0x7fffffffu) > 0x7f800000u ? (u & 0xffff0000u) | 0x00400000u
                                         : (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
}
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(bf16_rounded_bits(u) >> 16);
}
inline float bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// IEEE half precision through the compiler's _Float16 (g++ >= 12 on x86-64).
inline uint16_t float_to_f16(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
inline float f16_to_float(uint16_t u) {
  _Float16 h;
  std::memcpy(&h, &u, 2);
  return static_cast<float>(h);
}

}  // namespace qkv
