// Internal to train/leakcheck*.cpp: the probe batch, eval copies, float comparisons, and the
// naive float64 attention the reference checks compare against.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "analysis/leakcheck.h"

namespace qkv::analysis::leak {

// ---- probe ----
int64_t probe_len(const nn::ModelConfig& c, const LeakCheckOptions& o);
// `rows` seeded rows of `len` tokens uniform in [0, vocab); `stream` separates independent draws.
std::vector<std::vector<int64_t>> probe_rows(const nn::ModelConfig& c, const LeakCheckOptions& o, int64_t rows,
                                             int64_t len, uint32_t stream);
// Rows of equal length as an int64 [rows, len] tensor.
Tensor ids_tensor(const std::vector<std::vector<int64_t>>& rows);
Tensor ids_tensor(const std::vector<int64_t>& row);  // [1, len]

// The model itself when in eval mode, else an eval copy.
class EvalModel {
 public:
  explicit EvalModel(const nn::DecoderModel& m);
  const nn::DecoderModel& operator*() const { return *ptr_; }
  const nn::DecoderModel* operator->() const { return ptr_; }

 private:
  std::unique_ptr<nn::DecoderModel> owned_;
  const nn::DecoderModel* ptr_;
};

// Forward without recording a graph.
Tensor forward(const nn::DecoderModel& m, nn::ForwardArgs& a);
Tensor forward(const nn::DecoderModel& m, const Tensor& ids);

// ---- comparisons (float32 or float64 tensors of any strides; NaN counts as +inf) ----
double max_abs(const Tensor& a);
double max_delta(const Tensor& a, const Tensor& b);  // shapes must match
inline double ratio(double num, double den) {
  if (!std::isfinite(num) || !std::isfinite(den)) return std::numeric_limits<double>::infinity();
  return num / std::max(den, 1e-30);
}

LeakCheck make_check(std::string name, double value, double threshold, std::string detail);

// ---- error measure of the attention comparisons ----
// max|Δ| / max(max|ref|, floor). The floor is a fixed fraction (kFloorShare) of the largest value
// the compared quantity can take for these inputs (its a-priori bound below), so a reference that
// is (near) zero, such as dQ = dK = 0 on rows that see a single key (a window of 1, global with
// g = 0), measures the kernel's rounding against the inputs' scale instead of dividing it by ~0;
// where the reference is not small (max|ref| >= the floor) the measure is max|Δ| / max|ref|.
// Bounds (softmax attention, s the scale, rows of P summing to 1):
//   out  |O_id| <= max|v|                            (each row a convex combination of v)
//   dV   |dV_jd| <= Σ_i P_ij |dO_id|, scale max|dO|
//   dQ   |dQ_id| = s|Σ_j P_ij (dO_i·v_j − dO_i·O_i) k_jd| <= 2 s max‖dO_i‖ max‖v_j‖ max|k|
//   dK   |dK_jd| <= 2 s max‖dO_i‖ max‖v_j‖ max|q| per query that sees j (scale: one query)
// Linear attention's outputs are convex combinations of v too (out: max|v|); its dQ, dK have no
// such bound (they grow as the normaliser shrinks) and keep floor 0.
constexpr double kFloorShare = 0.05;
inline double floored_ratio(const Tensor& got, const Tensor& want, double floor) {
  return ratio(max_delta(got, want), std::max(max_abs(want), floor));
}
struct AttentionFloors {
  double out = 0, dq = 0, dk = 0, dv = 0;
};
// Rows of length D (q, k) and Dv (v, dout), float64; scale as NaiveSpec::scale (0 -> 1/sqrt(D)).
AttentionFloors attention_floors(int64_t D, int64_t Dv, double scale, const std::vector<double>& q,
                                 const std::vector<double>& k, const std::vector<double>& v,
                                 const std::vector<double>& dout, bool linear);

// The largest relative difference (max|Δ| / max|ref|) that float32 rounding alone can put between
// two evaluations of the same model on the same tokens that group the arithmetic differently (a
// batch of another shape, other GEMM blocking or attention tiles, KV-cache decode vs the parallel
// forward):
//     tol = u · sqrt(K) · (2 + 6 · n_layer),   u = 2^-24 (float32's unit roundoff),
// K = max(n_embd, ffn_hidden, probe length), the longest reduction. A sum of K rounded terms is off
// by about sqrt(K)·u relative when the rounding errors are independent, and the model chains
// 2 + 6·n_layer such reductions (embedding sum and head; per layer the QKV projection, scores,
// weighted sum, output projection, MLP in and out), whose errors add. Clean models measure 50-1000x
// below it (1e-7 relative on the tiny models); a leak moves outputs by orders of magnitude more.
double rounding_tolerance(const nn::ModelConfig& c, int64_t probe_len);
std::string rounding_tolerance_note(const nn::ModelConfig& c, int64_t probe_len);  // the formula, filled in
std::string fmt(double v);                                                         // "%.3g"

// ---- the consistency checks' measures (leakcheck.h) ----
// Logits a, b [T, V] (any device, float): max_v |a[t, v] − b[t, v]| for each t.
std::vector<double> position_gaps(const Tensor& a, const Tensor& b);
// The first t whose argmax over v differs between a and b [T, V] (first index on ties), -1 if none.
int64_t first_argmax_divergence(const Tensor& a, const Tensor& b);
// Folds one compared row into a check's per-position maximum and first divergence.
void fold_gaps(std::vector<double>& per, int64_t& diverges_at, int64_t offset, const Tensor& got, const Tensor& want);
// The threshold on |Δlogit| for a consistency check whose logits reach `scale`: 0 under
// numerics() == invariant, else rounding_tolerance(c, L) · scale. `recurrent` (the compared way
// decodes linear attention through its recurrent state) keeps the rounding bound in both modes.
struct ConsistencyBound {
  double threshold = 0;
  std::string note;  // how the threshold was set, for the check's detail
};
ConsistencyBound consistency_bound(const nn::ModelConfig& c, int64_t L, double scale, bool recurrent);
// Whether `c` decodes through linear attention's recurrent state (model.attention_pattern = linear).
bool recurrent_decode(const nn::ModelConfig& c);
// Builds a consistency check from its per-position gaps: value their max, detail + where the worst is.
LeakCheck make_consistency_check(std::string name, std::vector<double> per, int64_t diverges_at,
                                 const ConsistencyBound& bound, std::string detail);

// ---- naive float64 attention, the textbook loop: masked softmax(s·QKᵀ + ALiBi)·V ----
// Row-major arrays: q [B, Hq, Nq, D], k [B, Hkv, Nk, D], v [B, Hkv, Nk, Dv], out [B, Hq, Nq, Dv],
// weights [B, Hq, Nq, Nk]. Query i sits at absolute position p = Nk - Nq + i (bottom-right).
struct NaiveSpec {
  int64_t B = 1, Hq = 1, Hkv = 1, Nq = 1, Nk = 1, D = 1, Dv = 1;
  bool causal = true;
  int64_t window = 0;              // > 0: key j visible iff p - window < j <= p
  std::vector<uint8_t> key_valid;  // optional [B, Nk]
  std::vector<int64_t> segment;    // optional [B, Nk]: query at p sees only keys of segment[b, p]
  std::vector<double> alibi;       // optional slopes per query head: adds -m_h (p - j)
  double scale = 0;                // 0 -> 1 / sqrt(D)
  // optional sparse pattern (attention.h's definitions, the library's predicate): key j visible
  // only if pattern->allows(p, j)
  std::shared_ptr<const attn::PatternPredicate> pattern;
};
// The predicate of c's sparse pattern for Nk keys under its causal mask, or null for full attention.
std::shared_ptr<const attn::PatternPredicate> naive_pattern(const nn::ModelConfig& c, int64_t nk);
// The model's pattern as attention options carry it (null for full attention).
std::shared_ptr<const attn::SparsePattern> model_pattern(const nn::ModelConfig& c);
bool naive_visible(const NaiveSpec& s, int64_t b, int64_t i, int64_t j);
// Fills out (and weights when non-null); fully masked rows give zero weights and a zero output.
// Returns the number of fully masked (b, h, i) rows.
int64_t naive_attention(const NaiveSpec& s, const std::vector<double>& q, const std::vector<double>& k,
                        const std::vector<double>& v, std::vector<double>& out, std::vector<double>* weights);
// The vjp of naive_attention in float64 for an output gradient dout [B, Hq, Nq, Dv]: with P the
// weights and O the output, dV = Pᵀ·dO, dP = dO·Vᵀ, dS = P∘(dP − rowsum(dO∘O)), dQ = s·dS·K,
// dK = s·dSᵀ·Q (K/V gradients summed over the query heads of a group); zeros on fully masked rows.
void naive_attention_backward(const NaiveSpec& s, const std::vector<double>& q, const std::vector<double>& k,
                              const std::vector<double>& v, const std::vector<double>& dout, std::vector<double>& dq,
                              std::vector<double>& dk, std::vector<double>& dv);
// Linear attention's textbook loop (attention/linear/linear_attention.h) with the same visibility:
// O_i = Σ_j vis·(φ(q~_i)·φ(k~_j)) v_j / (Σ_j vis·φ(q~_i)·φ(k~_j) + eps), q~ = √s·q; `W` [m, D] for favor.
void naive_linear_attention(const NaiveSpec& s, attn::LinearFeature f, const std::vector<double>& W, double eps,
                            const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                            std::vector<double>& out);
// Its vjp in the quadratic form (no state, no chunks): dnum_i = dO_i / den_i, dden_i = −dO_i·O_i / den_i,
// for visible (i, j): dw_ij = dnum_i·v_j + dden_i, dv_j += w_ij dnum_i, dφ_i += dw_ij φ(k~_j),
// dφ(k~_j) += dw_ij φ_i; then through φ and √s (dk, dv summed over the query heads of a group).
void naive_linear_attention_backward(const NaiveSpec& s, attn::LinearFeature f, const std::vector<double>& W,
                                     double eps, const std::vector<double>& q, const std::vector<double>& k,
                                     const std::vector<double>& v, const std::vector<double>& dout,
                                     std::vector<double>& dq, std::vector<double>& dk, std::vector<double>& dv);
// RoPE, rotate-half pairing, in place on x [B, H, N, D] with positions pos [B, N].
void naive_rope(std::vector<double>& x, int64_t B, int64_t H, int64_t N, int64_t D, const std::vector<int64_t>& pos,
                double theta);
// ALiBi slopes (power-of-two heads: 2^(-8(h+1)/H); otherwise the closest power of two's slopes,
// then every other slope of twice that many heads).
std::vector<double> naive_alibi_slopes(int64_t H);

// ---- the backward check's test seam ----
// The attention call check_reference_attention_backward differentiates (the model's own
// attention ops: attn::attention unless a fault is planted); a test
// passes a deliberately wrong one to prove the check fires, with no fault branch in the kernels.
using AttentionFn =
    std::function<Tensor(const Tensor& q, const Tensor& k, const Tensor& v, const attn::AttentionOptions& opts)>;
LeakCheck reference_attention_backward(const nn::DecoderModel& model, const LeakCheckOptions& o, const AttentionFn& fn);

}  // namespace qkv::analysis::leak
