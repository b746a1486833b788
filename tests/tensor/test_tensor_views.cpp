#include <catch2/catch.hpp>

#include "tensor/ops.h"

using namespace qkv;

TEST_CASE("views share storage and index like the naive formula", "[tensor][views]") {
  Tensor a = Tensor::empty({2, 3, 4}, DType::f64);
  double* p = a.data<double>();
  for (int i = 0; i < 24; ++i) p[i] = i;
  // a[i,j,k] = 12 i + 4 j + k
  Tensor t = a.permute({2, 0, 1});  // [4,2,3]: t[k,i,j]
  REQUIRE(t.shape() == Shape{4, 2, 3});
  REQUIRE_FALSE(t.is_contiguous());
  CHECK(t.at({3, 1, 2}) == 12 * 1 + 4 * 2 + 3);
  Tensor c = t.contiguous();
  REQUIRE(c.is_contiguous());
  for (int k = 0; k < 4; ++k)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) CHECK(c.at({k, i, j}) == 12 * i + 4 * j + k);
  Tensor n = a.narrow(2, 1, 2);  // a[:, :, 1:3]
  CHECK(n.at({1, 2, 1}) == 12 + 8 + 2);
  CHECK(n.storage() == a.storage());
  Tensor e = a.narrow(1, 0, 1).expand({2, 5, 4});
  CHECK(e.stride(1) == 0);
  CHECK(e.at({1, 4, 3}) == 12 + 3);
  Tensor v = a.view({6, 4});
  CHECK(v.storage() == a.storage());
  CHECK(v.at({5, 1}) == 21);
  Tensor tr = a.transpose(0, 2);  // [4,3,2]: cannot view as [24] without a copy
  CHECK_THROWS_WITH(tr.view({24}), Catch::Contains("[view]"));
  Tensor r = tr.reshape({24});
  CHECK(r.at({1}) == 12);  // tr[0,0,1] = a[1,0,0]
  CHECK(a.unsqueeze(1).shape() == Shape{2, 1, 3, 4});
  CHECK(a.unsqueeze(1).squeeze(1).shape() == Shape{2, 3, 4});
  CHECK(a.select(1, 2).at({1, 3}) == 12 + 8 + 3);
}

TEST_CASE("view of a split-able non-contiguous tensor needs no copy", "[tensor][views]") {
  Tensor a = Tensor::empty({4, 6}, DType::f32);
  Tensor t = a.narrow(1, 0, 4);  // rows of 4 with stride 6
  Tensor v = t.view({4, 2, 2});
  CHECK(v.strides() == Strides{6, 2, 1});
  CHECK_THROWS_AS(t.view({16}), Error);
}

TEST_CASE("element counts that overflow are refused before allocating", "[tensor][errors]") {
  CHECK_THROWS_WITH(Tensor::empty({1ll << 40, 1ll << 40}), Catch::Contains("overflows"));
  CHECK_THROWS_WITH(Tensor::empty({-1, 3}), Catch::Contains("negative"));
}

TEST_CASE("dtype conversions round-trip through bf16 and f16", "[tensor][dtype]") {
  CHECK(bf16_to_float(float_to_bf16(1.0f)) == 1.0f);
  CHECK(bf16_to_float(float_to_bf16(3.140625f)) == 3.140625f);
  CHECK(f16_to_float(float_to_f16(0.5f)) == 0.5f);
  Tensor a = Tensor::empty({3}, DType::f32);
  a.data<float>()[0] = 1.5f;
  a.data<float>()[1] = -2.0f;
  a.data<float>()[2] = 65504.0f;
  auto h = a.to(DType::f16).to(DType::f32).to_vector();
  CHECK(h == std::vector<double>{1.5, -2.0, 65504.0});
}
