// Strided copy with dtype conversion: the kernel behind contiguous(), clone(), to(dtype) and copy_.
#include "tensor/cpu/copy.h"

#include <cstring>

#include "tensor/cpu/loops.h"

namespace qkv::cpu {
namespace {

template <class T>
struct Conv {  // element <-> float/double bridge for the storage types
  static double load(const T* p) { return static_cast<double>(*p); }
  static void store(T* p, double v) { *p = static_cast<T>(v); }
};
struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};
template <>
struct Conv<Bf16> {
  static double load(const Bf16* p) { return bf16_to_float(p->bits); }
  static void store(Bf16* p, double v) { p->bits = float_to_bf16(static_cast<float>(v)); }
};
template <>
struct Conv<F16> {
  static double load(const F16* p) { return f16_to_float(p->bits); }
  static void store(F16* p, double v) { p->bits = float_to_f16(static_cast<float>(v)); }
};

template <class S, class D>
void copy_typed(const Tensor& src, const Tensor& dst) {
  const int64_t ss = sizeof(S), ds = sizeof(D);
  Strides sb = src.strides(), db = dst.strides();
  for (auto& s : sb) s *= ss;
  for (auto& s : db) s *= ds;
  for_each_strided<2>(dst.shape(), {&db, &sb},
                      std::array<char*, 2>{static_cast<char*>(dst.raw_data()), static_cast<char*>(src.raw_data())},
                      [&](std::array<char*, 2> p, std::array<int64_t, 2> st, int64_t n) {
                        if constexpr (std::is_same_v<S, D>) {
                          if (st[0] == ds && st[1] == ss) {
                            std::memcpy(p[0], p[1], static_cast<size_t>(n) * ds);
                            return;
                          }
                          for (int64_t i = 0; i < n; ++i)
                            *reinterpret_cast<D*>(p[0] + i * st[0]) = *reinterpret_cast<const S*>(p[1] + i * st[1]);
                        } else if constexpr (std::is_same_v<S, float> && std::is_same_v<D, Bf16>) {
                          for (int64_t i = 0; i < n; ++i) {
                            uint32_t u;
                            std::memcpy(&u, p[1] + i * st[1], 4);
                            const uint16_t h = static_cast<uint16_t>(bf16_rounded_bits(u) >> 16);
                            std::memcpy(p[0] + i * st[0], &h, 2);
                          }
                        } else if constexpr (std::is_same_v<S, Bf16> && std::is_same_v<D, float>) {
                          for (int64_t i = 0; i < n; ++i) {
                            uint16_t h;
                            std::memcpy(&h, p[1] + i * st[1], 2);
                            const uint32_t u = uint32_t(h) << 16;
                            std::memcpy(p[0] + i * st[0], &u, 4);
                          }
                        } else if constexpr (std::is_arithmetic_v<S> && std::is_arithmetic_v<D>) {
                          for (int64_t i = 0; i < n; ++i)
                            *reinterpret_cast<D*>(p[0] + i * st[0]) =
                                static_cast<D>(*reinterpret_cast<const S*>(p[1] + i * st[1]));
                        } else {
                          for (int64_t i = 0; i < n; ++i)
                            Conv<D>::store(reinterpret_cast<D*>(p[0] + i * st[0]),
                                           Conv<S>::load(reinterpret_cast<const S*>(p[1] + i * st[1])));
                        }
                      });
}

template <class S>
void copy_from(const Tensor& src, const Tensor& dst) {
  switch (dst.dtype()) {
    case DType::f32:
      return copy_typed<S, float>(src, dst);
    case DType::f64:
      return copy_typed<S, double>(src, dst);
    case DType::i32:
      return copy_typed<S, int32_t>(src, dst);
    case DType::i64:
      return copy_typed<S, int64_t>(src, dst);
    case DType::bf16:
      return copy_typed<S, Bf16>(src, dst);
    case DType::f16:
      return copy_typed<S, F16>(src, dst);
    case DType::boolean:
      return copy_typed<S, bool>(src, dst);
  }
}

}  // namespace

void copy_cast(const Tensor& src, const Tensor& dst) {
  QKV_CHECK(src.shape() == dst.shape(), "[copy] source ", shape_str(src.shape()), " and destination ",
            shape_str(dst.shape()), " differ");
  QKV_CHECK(src.device() == Device::cpu && dst.device() == Device::cpu, "[copy] cpu kernel given a cuda tensor");
  switch (src.dtype()) {
    case DType::f32:
      return copy_from<float>(src, dst);
    case DType::f64:
      return copy_from<double>(src, dst);
    case DType::i32:
      return copy_from<int32_t>(src, dst);
    case DType::i64:
      return copy_from<int64_t>(src, dst);
    case DType::bf16:
      return copy_from<Bf16>(src, dst);
    case DType::f16:
      return copy_from<F16>(src, dst);
    case DType::boolean:
      return copy_from<bool>(src, dst);
  }
}

void round_bf16_values(const Tensor& src, const Tensor& dst) {
  QKV_CHECK(src.shape() == dst.shape() && src.dtype() == DType::f32 && dst.dtype() == DType::f32 &&
                src.device() == Device::cpu && dst.device() == Device::cpu,
            "[round_bf16] needs float32 CPU tensors of one shape, got ", dtype_name(src.dtype()), " ",
            shape_str(src.shape()), " and ", dtype_name(dst.dtype()), " ", shape_str(dst.shape()));
  Strides sb = src.strides(), db = dst.strides();
  for (auto& s : sb) s *= 4;
  for (auto& s : db) s *= 4;
  for_each_strided<2>(dst.shape(), {&db, &sb},
                      std::array<char*, 2>{static_cast<char*>(dst.raw_data()), static_cast<char*>(src.raw_data())},
                      [&](std::array<char*, 2> p, std::array<int64_t, 2> st, int64_t n) {
                        if (st[0] == 4 && st[1] == 4) {
                          uint32_t* d = reinterpret_cast<uint32_t*>(p[0]);
                          const uint32_t* s = reinterpret_cast<const uint32_t*>(p[1]);
                          for (int64_t i = 0; i < n; ++i) d[i] = bf16_rounded_bits(s[i]);
                          return;
                        }
                        for (int64_t i = 0; i < n; ++i) {
                          uint32_t u;
                          std::memcpy(&u, p[1] + i * st[1], 4);
                          u = bf16_rounded_bits(u);
                          std::memcpy(p[0] + i * st[0], &u, 4);
                        }
                      });
}

}  // namespace qkv::cpu
