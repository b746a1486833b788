// cat, split, index_select and index_add against naive index loops.
#include <catch2/catch.hpp>

#include "tensor/ops.h"

using namespace qkv;

namespace {
const DType kTypes[] = {DType::f32, DType::f64, DType::i64};

Tensor values(const Shape& s, uint64_t seed, DType t) {
  Tensor r = rand(s, seed, 0, -100, 100, DType::f64);
  return t == DType::i64 ? r.to(DType::i64) : r.to(t);
}
}  // namespace

TEST_CASE("cat concatenates along any dim, strided inputs included", "[ops][shape]") {
  for (DType t : kTypes) {
    const Tensor a = values({2, 3}, 1, t);
    const Tensor b = values({3, 4}, 2, t).transpose(0, 1);  // [4,3] strided
    const Tensor c = values({1, 3}, 3, t);
    const Tensor out = cat({a, b, c}, 0);
    REQUIRE(out.shape() == Shape{7, 3});
    REQUIRE(out.dtype() == t);
    for (int64_t i = 0; i < 7; ++i)
      for (int64_t j = 0; j < 3; ++j) {
        const double want = i < 2 ? a.at({i, j}) : i < 6 ? b.at({i - 2, j}) : c.at({i - 6, j});
        CHECK(out.at({i, j}) == want);
      }
    const Tensor x = values({2, 2, 3}, 4, t), y = values({2, 5, 3}, 5, t);
    const Tensor o2 = cat({x, y}, -2);
    REQUIRE(o2.shape() == Shape{2, 7, 3});
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 7; ++j)
        for (int64_t k = 0; k < 3; ++k) CHECK(o2.at({i, j, k}) == (j < 2 ? x.at({i, j, k}) : y.at({i, j - 2, k})));
  }
  CHECK_THROWS_WITH(cat({ones({2, 3}), ones({2, 4})}, 0),
                    Catch::Contains("[cat] along dim 0: tensor 0 is [2,3] but tensor 1 is [2,4]"));
  CHECK_THROWS_WITH(cat({ones({2}), ones({2}, DType::f64)}, 0), Catch::Contains("[cat] tensor 0 is float32"));
  CHECK_THROWS_WITH(cat({}, 0), Catch::Contains("[cat] no tensors"));
}

TEST_CASE("split returns views that tile the input", "[ops][shape]") {
  const Tensor a = values({3, 7}, 6, DType::f32);
  const auto parts = split(a, {2, 0, 5}, 1);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].shape() == Shape{3, 2});
  CHECK(parts[1].numel() == 0);
  CHECK(parts[2].storage() == a.storage());
  CHECK(parts[2].at({2, 4}) == a.at({2, 6}));
  CHECK(parts[0].at({1, 1}) == a.at({1, 1}));
  CHECK_THROWS_WITH(split(a, {3, 3}, 1), Catch::Contains("[split] sizes add up to 6 but dim 1 of [3,7] is 7"));
}

TEST_CASE("index_select gathers slices and index_add scatters them back", "[ops][shape]") {
  for (DType t : kTypes) {
    const Tensor a = values({5, 4, 3}, 7, t).permute({0, 2, 1});  // [5,3,4] strided
    for (DType it : {DType::i32, DType::i64}) {
      const std::vector<int64_t> idx{3, 0, 3, 2};
      const Tensor index = from_vector_i64(idx, {4}, it);
      const Tensor out = index_select(a, -1, index);
      REQUIRE(out.shape() == Shape{5, 3, 4});
      for (int64_t i = 0; i < 5; ++i)
        for (int64_t j = 0; j < 3; ++j)
          for (int64_t k = 0; k < 4; ++k) CHECK(out.at({i, j, k}) == a.at({i, j, idx[k]}));

      const Tensor src = values({2, 4, 3}, 8, t);
      const Tensor added = index_add({5, 4, 3}, 0, from_vector_i64({4, 4}, {2}, it), src);
      for (int64_t j = 0; j < 4; ++j)
        for (int64_t k = 0; k < 3; ++k) {
          CHECK(added.at({4, j, k}) == Approx(src.at({0, j, k}) + src.at({1, j, k})));
          CHECK(added.at({0, j, k}) == 0);
        }
    }
  }
  // Large enough for the parallel gather.
  const Tensor big = rand({1000, 70}, 9);
  const Tensor rows = index_select(big, 0, from_vector_i64(std::vector<int64_t>(1000, 999), {1000}));
  CHECK(max_abs_diff(rows, big.narrow(0, 999, 1).expand({1000, 70})) == 0);
  CHECK_THROWS_WITH(index_select(ones({3, 2}), 0, from_vector_i64({3}, {1})),
                    Catch::Contains("[index_select] index 3 at position 0 is out of range for dim 0 of [3,2]"));
  CHECK_THROWS_WITH(index_select(ones({3, 2}), 0, from_vector_i64({-1}, {1})), Catch::Contains("out of range"));
  CHECK_THROWS_WITH(index_select(ones({3}), 0, ones({1})), Catch::Contains("index must be int32 or int64"));
  CHECK_THROWS_WITH(index_add({3, 2}, 0, from_vector_i64({1}, {1}), ones({2, 2})),
                    Catch::Contains("[index_add] src is [2,2]"));
}
