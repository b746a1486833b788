// KV cache for incremental decoding: one per layer, holding K and V of every token
// seen so far in preallocated [B, Hkv, capacity, D] buffers (Hkv, not Hq: GQA shrinks the cache
// by G). Each step appends the new tokens' K/V (one token, or a chunk for chunked prefill) and
// attends over the filled part, returned as views (no copy).
//
// Positions: the cache's token t sits at absolute position t, and the Nq new queries at
// length_before + i — exactly attention()'s bottom-right alignment (pos_i = Nk − Nq + i with
// Nk = the new length), so causal and window masks stay right with no extra bookkeeping. Rotate
// new keys and queries by RoPE at positions [length(), length() + n) *before* appending; cached
// keys keep the rotation of their own absolute position.
//
// Inference only: appending copies values in, so no gradient flows through the cache.
#pragma once
#include <cstdint>
#include <utility>

#include "attention/attention.h"

namespace qkv::attn {

class KVCache {
 public:
  KVCache(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim, int64_t v_head_dim = -1,
          DType dtype = DType::f32, Device device = Device::cpu);

  // Appends k_new [B, Hkv, n, D] and v_new [B, Hkv, n, Dv] (any strides; converted to the cache
  // dtype) and returns views [B, Hkv, length(), D] / [.., Dv] of everything cached. Throws when
  // the shapes disagree with the cache or length() + n would exceed capacity().
  std::pair<Tensor, Tensor> append(const Tensor& k_new, const Tensor& v_new);
  // Views of the filled part.
  std::pair<Tensor, Tensor> view() const;
  // append(), then attention of q [B, Hq, n, D] over the whole cache with `opts` (causal is
  // usually what a decoder wants; masks are sized for the new length).
  Tensor attend(const Tensor& q, const Tensor& k_new, const Tensor& v_new, const AttentionOptions& opts);

  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  int64_t next_position() const { return length_; }  // absolute position of the next token
  void clear() { length_ = 0; }
  // Drops tokens past `length` (e.g. to rewind a rejected draft).
  void truncate(int64_t length);

 private:
  Tensor k_, v_;  // [B, Hkv, capacity, D], [B, Hkv, capacity, Dv]
  int64_t capacity_ = 0, length_ = 0;
};

}  // namespace qkv::attn
