// Input validation and the mask plan shared by both attention kernels (see attention/mask.h).
#include "attention/mask.h"

#include <omp.h>

#include <cmath>

#include "tensor/ops.h"

namespace qkv::attn {

namespace {

std::string target_str(const AttentionShape& s) {
  return cat("[B,Hq,Nq,Nk] = ", shape_str({s.batch, s.q_heads, s.nq, s.nk}));
}

// Strides (in elements, 0 on broadcast dims) of `t` read as [B, Hq, Nq, Nk].
void broadcast_strides(const Tensor& t, const AttentionShape& s, const char* name, int64_t out[4]) {
  const Shape target = {s.batch, s.q_heads, s.nq, s.nk};
  const int nd = t.dim();
  QKV_CHECK(nd >= 1 && nd <= 4, "[attention] ", name, " ", shape_str(t.shape()), " does not broadcast to ",
            target_str(s));
  for (int d = 0; d < 4; ++d) {
    const int td = d - (4 - nd);
    if (td < 0) {
      out[d] = 0;
      continue;
    }
    const int64_t sz = t.size(td);
    QKV_CHECK(sz == target[d] || sz == 1, "[attention] ", name, " ", shape_str(t.shape()), " does not broadcast to ",
              target_str(s));
    out[d] = sz == 1 ? 0 : t.stride(td);
  }
}

}  // namespace

Problem check_problem(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  QKV_CHECK(q.defined() && k.defined() && v.defined(), "[attention] q, k and v must all be defined");
  QKV_CHECK(q.dim() == 4, "[attention] q must be [B,Hq,Nq,D], got ", shape_str(q.shape()));
  QKV_CHECK(k.dim() == 4, "[attention] k must be [B,Hkv,Nk,D], got ", shape_str(k.shape()));
  QKV_CHECK(v.dim() == 4, "[attention] v must be [B,Hkv,Nk,Dv], got ", shape_str(v.shape()));
  const std::string shapes =
      cat(" (q ", shape_str(q.shape()), ", k ", shape_str(k.shape()), ", v ", shape_str(v.shape()), ")");
  QKV_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype() && (q.dtype() == DType::f32 || q.dtype() == DType::f64),
            "[attention] q, k, v must share dtype float32 or float64, got ", dtype_name(q.dtype()), ", ",
            dtype_name(k.dtype()), ", ", dtype_name(v.dtype()));
  QKV_CHECK(k.device() == q.device() && v.device() == q.device(),
            "[attention] q, k and v must be on one device, got q on ", device_name(q.device()), ", k on ",
            device_name(k.device()), ", v on ", device_name(v.device()));
  Problem p;
  p.B = q.size(0);
  p.Hq = q.size(1);
  p.Nq = q.size(2);
  p.D = q.size(3);
  p.Hkv = k.size(1);
  p.Nk = k.size(2);
  p.Dv = v.size(3);
  p.dtype = q.dtype();
  QKV_CHECK(k.size(0) == p.B && v.size(0) == p.B, "[attention] batch sizes differ", shapes);
  QKV_CHECK(k.size(3) == p.D, "[attention] head dims differ: q has D=", p.D, " but k has D=", k.size(3), shapes);
  QKV_CHECK(v.size(2) == p.Nk, "[attention] k has Nk=", p.Nk, " keys but v has ", v.size(2), " values", shapes);
  QKV_CHECK(v.size(1) == p.Hkv, "[attention] k has ", p.Hkv, " heads but v has ", v.size(1), shapes);
  QKV_CHECK(p.Hkv > 0 && p.Hq % p.Hkv == 0, "[attention] q has Hq=", p.Hq, " heads, not a multiple of Hkv=", p.Hkv,
            shapes);
  QKV_CHECK(p.D > 0, "[attention] head dim must be positive", shapes);
  p.G = p.Hq / p.Hkv;
  p.scale = o.scale != 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(p.D));
  QKV_CHECK(o.dropout_p >= 0 && o.dropout_p < 1, "[attention] dropout_p must be in [0, 1), got ", o.dropout_p);
  QKV_CHECK(o.window >= 0, "[attention] window must be >= 0, got ", o.window);
  return p;
}

void fail_fully_masked(const Problem& p, int64_t flat_row) {
  const int64_t i = flat_row % p.Nq, h = (flat_row / p.Nq) % p.Hq, b = flat_row / (p.Nq * p.Hq);
  fail("[attention] query row ", i, " of batch ", b, ", head ", h, " has no visible key (fully_masked = error); q [",
       p.B, ",", p.Hq, ",", p.Nq, ",", p.D, "], Nk=", p.Nk);
}

MaskPlan::MaskPlan(const AttentionShape& s, const AttentionOptions& o, DType bias_dtype)
    : B(s.batch), Hq(s.q_heads), Hkv(s.kv_heads), G(s.kv_heads > 0 ? s.q_heads / s.kv_heads : 1), Nq(s.nq), Nk(s.nk) {
  // The predicate runs on the host: masks given on a device are read from host copies.
  auto host = [](const Tensor& t) { return t.device() == Device::cpu ? t : t.to(Device::cpu); };
  rules_ = o.rules ? *o.rules : mask_rules(s, o);
  if (o.rules) {  // the derived rules are right by construction; explicit ones are checked
    QKV_CHECK(static_cast<int64_t>(rules_.kv_head.size()) == Hq, "[attention] mask rules map ", rules_.kv_head.size(),
              " query heads, but q has Hq=", Hq);
    for (size_t h = 0; h < rules_.kv_head.size(); ++h)
      QKV_CHECK(rules_.kv_head[h] >= 0 && rules_.kv_head[h] < Hkv, "[attention] mask rules send query head ", h,
                " to kv head ", rules_.kv_head[h], ", outside [0, Hkv=", Hkv, ")");
  }

  if (!o.key_lengths.empty()) {
    QKV_CHECK(static_cast<int64_t>(o.key_lengths.size()) == B, "[attention] key_lengths has ", o.key_lengths.size(),
              " entries for batch ", B);
    for (size_t b = 0; b < o.key_lengths.size(); ++b)
      QKV_CHECK(o.key_lengths[b] >= 0 && o.key_lengths[b] <= Nk, "[attention] key_lengths[", b,
                "] = ", o.key_lengths[b], " is outside [0, Nk=", Nk, "]");
    key_len_store_ = o.key_lengths;
    key_len_ = key_len_store_.data();
  }
  if (o.key_padding.defined()) {
    const Tensor kp = host(o.key_padding);
    QKV_CHECK(kp.dtype() == DType::boolean, "[attention] key_padding must be bool [B,Nk], got ",
              dtype_name(kp.dtype()));
    QKV_CHECK(kp.dim() == 2 && kp.size(0) == B && kp.size(1) == Nk, "[attention] key_padding is ",
              shape_str(kp.shape()), " but [B,Nk] = ", shape_str({B, Nk}));
    keep_.push_back(kp);
    key_pad_ = kp.data<bool>();
    kp_sb_ = kp.stride(0);
    kp_sj_ = kp.stride(1);
  }
  if (o.segment_ids.defined()) {
    const Tensor sg = host(o.segment_ids);
    QKV_CHECK(is_integral(sg.dtype()), "[attention] segment_ids must be int32/int64 [B,Nk], got ",
              dtype_name(sg.dtype()));
    QKV_CHECK(sg.dim() == 2 && sg.size(0) == B && sg.size(1) == Nk, "[attention] segment_ids is ",
              shape_str(sg.shape()), " but [B,Nk] = ", shape_str({B, Nk}));
    QKV_CHECK(Nq <= Nk, "[attention] segment_ids need Nq <= Nk (queries are the last Nq positions), got Nq=", Nq,
              " Nk=", Nk);
    Tensor s64 = sg.to(DType::i64).contiguous();
    keep_.push_back(s64);
    seg_ = s64.data<int64_t>();
  }
  if (o.allow_mask.defined()) {
    QKV_CHECK(o.allow_mask.dtype() == DType::boolean, "[attention] allow_mask must be bool, got ",
              dtype_name(o.allow_mask.dtype()));
    const Tensor allow = host(o.allow_mask);
    broadcast_strides(allow, s, "allow_mask", al_s_);
    keep_.push_back(allow);
    allow_ = allow.data<bool>();
  }
  if (o.bias.defined()) {
    QKV_CHECK(is_floating(o.bias.dtype()), "[attention] bias must be a float tensor, got ", dtype_name(o.bias.dtype()));
    int64_t st[4];
    broadcast_strides(o.bias, s, "bias", st);  // shape check first, then convert
    const Tensor hb = host(o.bias);
    Tensor bt = hb.dtype() == bias_dtype ? hb : hb.to(bias_dtype);
    broadcast_strides(bt, s, "bias", bi_s_);
    keep_.push_back(bt);
    bias_ = bt.raw_data();
  }
  if (!o.alibi_slopes.empty()) {
    QKV_CHECK(static_cast<int64_t>(o.alibi_slopes.size()) == Hq, "[attention] alibi_slopes has ", o.alibi_slopes.size(),
              " entries for Hq=", Hq, " query heads");
    alibi_ = o.alibi_slopes;
  }
  elementwise_ = key_pad_ || seg_ || allow_;
  if (o.pattern && o.pattern->sparse()) {
    pat_ = std::make_shared<const PatternPredicate>(*o.pattern, Nk, rules_.has_hi);
    layout_ = block_layout(*o.pattern, rules_, Nq, Nk, kTileQ, kTileK);
  } else if (rules_.sliding_window_cuts(Nq)) {
    // A causal sliding window without a pattern: its layout carries the band-only walk the fused
    // CPU kernels take (patterns.h, StridedWalk); the grid paths never read it.
    layout_ = block_layout(SparsePattern{}, rules_, Nq, Nk, kTileQ, kTileK);
  }
}

bool MaskPlan::grouped_heads() const {
  for (int64_t h = 0; h < Hq; ++h)
    if (rules_.kv_head[h] != h / G) return false;
  return true;
}

MaskRules mask_rules(const AttentionShape& s, const AttentionOptions& o) {
  MaskRules r;
  r.q_offset = s.nk - s.nq;
  r.has_hi = o.causal || o.window > 0;  // a sliding window is causal
  r.hi = 1;                             // j <= pos
  r.has_lo = o.window > 0;
  r.lo = 1 - o.window;  // j > pos - w
  const int64_t G = s.kv_heads > 0 ? s.q_heads / s.kv_heads : 1;
  r.kv_head.resize(static_cast<size_t>(std::max<int64_t>(s.q_heads, 0)));
  for (int64_t h = 0; h < s.q_heads; ++h) r.kv_head[h] = h / std::max<int64_t>(G, 1);
  return r;
}

int64_t MaskPlan::count_fully_masked() const {
  int64_t count = 0;
  const int64_t rows = B * Hq * Nq;
#pragma omp parallel for reduction(+ : count) schedule(static) if (rows * Nk > (1 << 16) && !omp_in_parallel())
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r % Nq, h = (r / Nq) % Hq, b = r / (Nq * Hq);
    const int64_t p = pos(i), a = lo(p), e = hi(b, p);
    bool any = false;
    if (!per_element()) {
      any = a < e;
    } else {
      for (int64_t j = a; j < e && !any; ++j) any = visible_elementwise(b, h, i, j);
    }
    if (!any) ++count;
  }
  return count;
}

bool MaskPlan::first_fully_masked(int64_t* bo, int64_t* ho, int64_t* io) const {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Nq; ++i) {
        const int64_t p = pos(i), a = lo(p), e = hi(b, p);
        bool any = false;
        for (int64_t j = a; j < e && !any; ++j) any = !per_element() || visible_elementwise(b, h, i, j);
        if (!any) {
          *bo = b;
          *ho = h;
          *io = i;
          return true;
        }
      }
  return false;
}

int64_t count_fully_masked_rows(const AttentionShape& shape, const AttentionOptions& opts) {
  return MaskPlan(shape, opts).count_fully_masked();
}

Tensor visibility_mask(const AttentionShape& s, const AttentionOptions& opts) {
  const MaskPlan plan(s, opts);
  Tensor m = Tensor::empty({s.batch, s.q_heads, s.nq, s.nk}, DType::boolean);
  bool* out = m.data<bool>();
  const int64_t rows = s.batch * s.q_heads * s.nq, nk = s.nk;
#pragma omp parallel for schedule(static) if (rows * nk > (1 << 16) && !omp_in_parallel())
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r % s.nq, h = (r / s.nq) % s.q_heads, b = r / (s.nq * s.q_heads);
    for (int64_t j = 0; j < nk; ++j) out[r * nk + j] = plan.visible(b, h, i, j);
  }
  return m;
}

PatternStats pattern_stats(const AttentionShape& s, const AttentionOptions& opts) {
  const MaskPlan plan(s, opts);
  // Without a pattern: the structural mask's own layout (a "full" pattern under the same rules).
  const std::shared_ptr<const BlockLayout> own =
      plan.has_pattern() ? nullptr : block_layout(SparsePattern{}, plan.rules(), s.nq, s.nk, kTileQ, kTileK);
  const BlockLayout& L = own ? *own : plan.layout();
  PatternStats st;
  st.visited_tiles = L.visited_tiles;
  st.full_tiles = L.full_tiles;
  st.total_tiles = L.nqt * L.nkt;
  st.tile_q = L.tq;
  st.tile_k = L.tk;
  if (!plan.elementwise() && opts.key_lengths.empty()) {
    st.kept_pairs = L.kept_pairs * s.batch * s.q_heads;
    return st;
  }
  // Per-batch masks: count the layout's tiles element by element.
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.q_heads; ++h)
      for (int64_t qt = 0; qt < L.nqt; ++qt)
        for (int64_t e = L.row_ptr[qt]; e < L.row_ptr[qt + 1]; ++e) {
          const int64_t kt = L.row_tiles[e];
          for (int64_t i = qt * L.tq; i < std::min(s.nq, (qt + 1) * L.tq); ++i)
            for (int64_t j = kt * L.tk; j < std::min(s.nk, (kt + 1) * L.tk); ++j)
              st.kept_pairs += plan.visible(b, h, i, j);
        }
  return st;
}

Tensor dropout_scale_mask(const AttentionShape& s, const AttentionOptions& opts, DType dtype) {
  QKV_CHECK(dtype == DType::f32 || dtype == DType::f64, "[attention] dropout mask dtype must be float");
  const DropoutDraw draw(opts, s.q_heads);
  Tensor z = Tensor::empty({s.batch, s.q_heads, s.nq, s.nk}, dtype);
  const int64_t rows = s.batch * s.q_heads * s.nq, nk = s.nk;
#pragma omp parallel for schedule(static) if (rows * nk > (1 << 16) && !omp_in_parallel())
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r % s.nq, h = (r / s.nq) % s.q_heads, b = r / (s.nq * s.q_heads);
    if (dtype == DType::f32) {
      if (draw.on()) draw.row(b, h, i, 0, nk, z.data<float>() + r * nk);
      else std::fill_n(z.data<float>() + r * nk, nk, 1.0f);
    } else {
      if (draw.on()) draw.row(b, h, i, 0, nk, z.data<double>() + r * nk);
      else std::fill_n(z.data<double>() + r * nk, nk, 1.0);
    }
  }
  return z;
}

}  // namespace qkv::attn
