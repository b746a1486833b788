#include "attention/kv_cache.h"

#include "tensor/ops.h"

namespace qkv::attn {

KVCache::KVCache(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim, int64_t v_head_dim, DType dtype,
                 Device device)
    : capacity_(capacity) {
  if (v_head_dim < 0) v_head_dim = head_dim;
  QKV_CHECK(batch > 0 && kv_heads > 0 && capacity >= 0 && head_dim > 0 && v_head_dim > 0,
            "[kv_cache] invalid geometry: batch ", batch, ", kv_heads ", kv_heads, ", capacity ", capacity,
            ", head_dim ", head_dim, ", v_head_dim ", v_head_dim);
  k_ = Tensor::empty({batch, kv_heads, capacity, head_dim}, dtype, device);
  v_ = Tensor::empty({batch, kv_heads, capacity, v_head_dim}, dtype, device);
}

std::pair<Tensor, Tensor> KVCache::append(const Tensor& k_new, const Tensor& v_new) {
  QKV_CHECK(k_new.defined() && v_new.defined() && k_new.dim() == 4 && v_new.dim() == 4,
            "[kv_cache] k_new and v_new must be [B,Hkv,n,D]");
  const int64_t n = k_new.size(2);
  const Shape want_k = {k_.size(0), k_.size(1), n, k_.size(3)};
  const Shape want_v = {v_.size(0), v_.size(1), n, v_.size(3)};
  QKV_CHECK(k_new.shape() == want_k, "[kv_cache] k_new is ", shape_str(k_new.shape()), " but the cache expects ",
            shape_str(want_k), " (cache [B,Hkv,capacity,D] = ", shape_str(k_.shape()), ")");
  QKV_CHECK(v_new.shape() == want_v, "[kv_cache] v_new is ", shape_str(v_new.shape()), " but the cache expects ",
            shape_str(want_v), " (cache [B,Hkv,capacity,Dv] = ", shape_str(v_.shape()), ")");
  QKV_CHECK(length_ + n <= capacity_, "[kv_cache] appending ", n, " tokens to ", length_,
            " cached exceeds the capacity ", capacity_);
  if (n > 0) {
    copy_(k_.narrow(2, length_, n), k_new);  // any device (and dtype), converted
    copy_(v_.narrow(2, length_, n), v_new);
  }
  length_ += n;
  return view();
}

std::pair<Tensor, Tensor> KVCache::view() const { return {k_.narrow(2, 0, length_), v_.narrow(2, 0, length_)}; }

Tensor KVCache::attend(const Tensor& q, const Tensor& k_new, const Tensor& v_new, const AttentionOptions& opts) {
  auto [k, v] = append(k_new, v_new);
  return attention(q, k, v, opts);
}

void KVCache::truncate(int64_t length) {
  QKV_CHECK(length >= 0 && length <= length_, "[kv_cache] cannot truncate ", length_, " tokens to ", length);
  length_ = length;
}

}  // namespace qkv::attn
