// The tensor-core attention kernels (attention/cuda/mma_attention_kernels.cuh, the very source the
// CUDA build compiles) run on the host through cuda_emulator.h, so CI, which has no GPU, checks them:
// O, lse, dQ, dK and dV against float64 attention by the accuracy rule of
// tests/attention/test_cuda_attention_mma.cpp (max error at most 2x (O, lse, dQ) or 4x (dK, dV) that of a naive
// all-bf16 attention, + 1e-5), no shared-memory races or reads of unwritten shared memory, warp
// collectives reached by all 32 lanes, and no NaN from reading operand padding (the operands'
// padding is NaN). The launches mirror the host side of mma_attention.cu (grids, shared-memory
// sizes, the window clamp of params_of, backward on the forward's own O and lse).
//
// Usage: qkv_mma_emulation [ci|quick|full]
//   ci     (default; the ctest) the shapes of tests/attention/test_cuda_attention_mma.cpp plus windows beyond
//          int, fully masked batch rows and query rows, strided operands
//   quick  10 small cases (tests/emulation/run_mutants.sh)
//   full   82 cases (every shape above and more strided, masked and window cases), ~30 s
// Exit status 0 when every case passes.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda_emulator.h"

// after the emulator: it defines QKV_MMA_EMULATION and the CUDA names the kernels use
#include "attention/cuda/mma_attention_kernels.cuh"

namespace {

namespace kernels = qkv::attn::cuda_mma;

double bf16_of(double x) { return cuda_emu::bf16_value(cuda_emu::bf16_bits(static_cast<float>(x))); }

struct Case {
  int B, Hq, Hkv, Nq, Nk, D;
  bool causal;
  int64_t window = 0;
  std::vector<int64_t> key_lengths = {};  // empty: none
  int row_pad = 0;                        // floats after each row (a multiple of 4): a strided view
  int head_pad = 0;                       // floats after each head and batch entry
};

// A [B, H, N, D] float32 operand inside a buffer with NaN padding; it ends at the end of the
// allocation, so AddressSanitizer sees a read past its last row.
struct Operand {
  std::vector<float> mem;
  float* base;
  int64_t sb, sh, sn;
  int B, H, N, D;
  Operand(int B_, int H_, int N_, int D_, int row_pad, int head_pad) : B(B_), H(H_), N(N_), D(D_) {
    sn = D + row_pad;
    sh = N * sn + head_pad;
    sb = H * sh + head_pad;
    const int64_t extent = B == 0 || H == 0 || N == 0 ? 0 : (B - 1) * sb + (H - 1) * sh + (N - 1) * sn + D;
    mem.assign(static_cast<size_t>(extent) + 4, std::numeric_limits<float>::quiet_NaN());  // + 4: room to align
    base = mem.data() + (mem.size() - static_cast<size_t>(extent));
    while (reinterpret_cast<uintptr_t>(base) % 16) --base;  // float4 reads of rows
  }
  float& at(int b, int h, int n, int d) { return base[b * sb + h * sh + n * sn + d]; }
  double get(int b, int h, int n, int d) const { return base[b * sb + h * sh + n * sn + d]; }
  kernels::Operand view() const { return {base, sb, sh, sn}; }
};

struct Result {
  std::vector<double> out, lse, dq, dk, dv;
};
constexpr int kOutputs = 5;
const char* const kOutputNames[kOutputs] = {"O", "lse", "dQ", "dK", "dV"};

// Attention forward and backward in float64 (bottom-right causal, window, key lengths, kv head
// h / G). With `naive_bf16` every intermediate is rounded to bf16: S, P, O, dP, Di, dS and the three
// gradients (the naive attention of the accuracy rule).
Result attention_f64(const Case& c, const Operand& q, const Operand& k, const Operand& v, const Operand& dout,
                     bool naive_bf16) {
  auto r = [&](double x) { return naive_bf16 ? bf16_of(x) : x; };
  const int G = c.Hq / c.Hkv, D = c.D;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Result res;
  res.out.assign(size_t(c.B) * c.Hq * c.Nq * D, 0.0);
  res.dq.assign(res.out.size(), 0.0);
  res.lse.assign(size_t(c.B) * c.Hq * c.Nq, 0.0);
  res.dk.assign(size_t(c.B) * c.Hkv * c.Nk * D, 0.0);
  res.dv.assign(res.dk.size(), 0.0);
  const bool causal_like = c.causal || c.window > 0;
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.Hq; ++h)
      for (int i = 0; i < c.Nq; ++i) {
        const int hk = h / G;
        const int64_t pos = int64_t(c.Nk) - c.Nq + i, len = c.key_lengths.empty() ? c.Nk : c.key_lengths[b];
        const size_t row = (size_t(b) * c.Hq + h) * c.Nq + i;
        std::vector<int> js;
        for (int j = 0; j < c.Nk; ++j)
          if (j < len && (!causal_like || j <= pos) && (c.window <= 0 || j > pos - c.window)) js.push_back(j);
        if (js.empty()) {
          res.lse[row] = -INFINITY;
          continue;
        }
        std::vector<double> s(js.size()), p(js.size());
        double mx = -INFINITY, sum = 0;
        for (size_t t = 0; t < js.size(); ++t) {
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += q.get(b, h, i, d) * k.get(b, hk, js[t], d);
          s[t] = r(scale * dot);
          mx = std::max(mx, s[t]);
        }
        for (size_t t = 0; t < js.size(); ++t) sum += std::exp(s[t] - mx);
        res.lse[row] = mx + std::log(sum);
        for (size_t t = 0; t < js.size(); ++t) p[t] = r(std::exp(s[t] - mx) / sum);
        double* o = &res.out[row * D];
        for (int d = 0; d < D; ++d) {
          double acc = 0;
          for (size_t t = 0; t < js.size(); ++t) acc += p[t] * v.get(b, hk, js[t], d);
          o[d] = r(acc);
        }
        double di = 0;
        for (int d = 0; d < D; ++d) di += dout.get(b, h, i, d) * o[d];
        di = r(di);
        std::vector<double> dq(D, 0.0);
        for (size_t t = 0; t < js.size(); ++t) {
          double dp = 0;
          for (int d = 0; d < D; ++d) dp += dout.get(b, h, i, d) * v.get(b, hk, js[t], d);
          const double ds = r(p[t] * (r(dp) - di));
          const size_t krow = (size_t(b) * c.Hkv + hk) * c.Nk + js[t];
          for (int d = 0; d < D; ++d) {
            dq[d] += scale * ds * k.get(b, hk, js[t], d);
            res.dk[krow * D + d] += scale * ds * q.get(b, h, i, d);
            res.dv[krow * D + d] += p[t] * dout.get(b, h, i, d);
          }
        }
        for (int d = 0; d < D; ++d) res.dq[row * D + d] = r(dq[d]);
      }
  for (double& x : res.dk) x = r(x);
  for (double& x : res.dv) x = r(x);
  return res;
}

// max |got − ref| over finite pairs, max |ref|, and the places where exactly one is not finite or
// the infinities differ (a fully masked row has lse −inf in both).
struct Error {
  double max_abs = 0, max_ref = 0;
  long mismatched = 0;
};
Error error_of(const std::vector<float>& got, const std::vector<double>& ref) {
  Error e;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = got[i], r = ref[i];
    if (std::isfinite(g) && std::isfinite(r)) {
      e.max_abs = std::max(e.max_abs, std::abs(g - r));
      e.max_ref = std::max(e.max_ref, std::abs(r));
    } else if (!(std::isinf(g) && g == r)) {
      ++e.mismatched;
    }
  }
  return e;
}
double max_abs_error(const std::vector<double>& a, const std::vector<double>& ref) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::isfinite(a[i]) && std::isfinite(ref[i])) e = std::max(e, std::abs(a[i] - ref[i]));
  return e;
}

// The launches of mma_attention.cu's launch_forward and launch_backward, block by block.
int blocks_of(int rows) { return (rows + kernels::kBlockRows - 1) / kernels::kBlockRows; }

template <int D>
void launch_forward(const kernels::Params& a, int heads) {
  for (int y = 0; y < blocks_of(a.Nq); ++y)
    for (int x = 0; x < heads; ++x)
      cuda_emu::run_block({unsigned(x), unsigned(y), 0}, kernels::kThreads, kernels::forward_smem<D>(),
                          [&] { kernels::forward_kernel<D>(a); });
}

template <int D>
void launch_backward(const kernels::Params& a, int B, int64_t qrows, int64_t krows) {
  constexpr int tile = kernels::kBackwardTile<D>;
  if (qrows > 0) {
    for (int x = 0; x < int((qrows + kernels::kWarps - 1) / kernels::kWarps); ++x)
      cuda_emu::run_block({unsigned(x), 0, 0}, kernels::kThreads, 0, [&] { kernels::di_kernel(a, qrows, D); });
    for (int y = 0; y < blocks_of(a.Nq); ++y)
      for (int x = 0; x < B * a.Hq; ++x)
        cuda_emu::run_block({unsigned(x), unsigned(y), 0}, kernels::kThreads, kernels::dq_smem<D, tile>(),
                            [&] { kernels::dq_kernel<D, tile>(a); });
  }
  if (krows > 0)
    for (int y = 0; y < blocks_of(a.Nk); ++y)
      for (int x = 0; x < B * a.Hkv; ++x)
        cuda_emu::run_block({unsigned(x), unsigned(y), 0}, kernels::kThreads, kernels::dkv_smem<D, tile>(),
                            [&] { kernels::dkv_kernel<D, tile>(a); });
}

// Runs one case's forward and backward and prints one line; true when it passes.
bool run_case(const Case& c, uint64_t seed, double worst_ratio[kOutputs]) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0, 1);
  const int D = c.D;
  Operand q(c.B, c.Hq, c.Nq, D, c.row_pad, c.head_pad), k(c.B, c.Hkv, c.Nk, D, c.row_pad, c.head_pad),
      v(c.B, c.Hkv, c.Nk, D, c.row_pad, c.head_pad), dout(c.B, c.Hq, c.Nq, D, c.row_pad, c.head_pad);
  for (Operand* t : {&q, &k, &v, &dout}) {  // bf16 values, as autocast hands them to the kernels
    const double sd = t == &q ? 1.5 : 1;
    for (int b = 0; b < t->B; ++b)
      for (int h = 0; h < t->H; ++h)
        for (int n = 0; n < t->N; ++n)
          for (int d = 0; d < D; ++d) t->at(b, h, n, d) = static_cast<float>(bf16_of(sd * normal(rng)));
  }

  // As params_of builds them.
  kernels::Params a;
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.Hq = c.Hq;
  a.Hkv = c.Hkv;
  a.G = c.Hq / c.Hkv;
  a.Nq = c.Nq;
  a.Nk = c.Nk;
  a.q_offset = c.Nk - c.Nq;
  a.window = static_cast<int>(std::min<int64_t>(c.window, int64_t(c.Nk) + 1));
  a.causal_like = c.causal || c.window > 0;
  a.key_len = c.key_lengths.empty() ? nullptr : c.key_lengths.data();
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  a.scale = static_cast<float>(scale);
  a.scale_log2 = static_cast<float>(scale * 1.4426950408889634);

  const size_t qrows = size_t(c.B) * c.Hq * c.Nq, krows = size_t(c.B) * c.Hkv * c.Nk;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(qrows * D, nan), lse(qrows, nan);
  a.o_w = out.data();
  a.lse_w = lse.data();
  if (qrows > 0) {
    if (D == 64) launch_forward<64>(a, c.B * c.Hq);
    else launch_forward<128>(a, c.B * c.Hq);
  }
  std::vector<float> dq(qrows * D, nan), dk(krows * D, nan), dv(krows * D, nan), di(std::max<size_t>(qrows, 1), nan);
  a.out = {out.data(), int64_t(c.Hq) * c.Nq * D, int64_t(c.Nq) * D, D};
  a.dout = dout.view();
  a.lse = lse.data();
  a.di = di.data();
  a.di_w = di.data();
  a.dq = dq.data();
  a.dk = dk.data();
  a.dv = dv.data();
  if (D == 64) launch_backward<64>(a, c.B, int64_t(qrows), int64_t(krows));
  else launch_backward<128>(a, c.B, int64_t(qrows), int64_t(krows));

  const Result exact = attention_f64(c, q, k, v, dout, false), naive = attention_f64(c, q, k, v, dout, true);
  const std::vector<float>* got[kOutputs] = {&out, &lse, &dq, &dk, &dv};
  const std::vector<double>* exact_of[kOutputs] = {&exact.out, &exact.lse, &exact.dq, &exact.dk, &exact.dv};
  const std::vector<double>* naive_of[kOutputs] = {&naive.out, &naive.lse, &naive.dq, &naive.dk, &naive.dv};
  const double factor[kOutputs] = {2, 2, 2, 4, 4};
  std::printf("B%d Hq%d Hkv%d Nq%d Nk%d D%d causal%d window%lld%s pad%d/%d: error/bound", c.B, c.Hq, c.Hkv, c.Nq, c.Nk,
              D, int(c.causal), static_cast<long long>(c.window), c.key_lengths.empty() ? "" : " key_lengths",
              c.row_pad, c.head_pad);
  bool pass = true;
  for (int t = 0; t < kOutputs; ++t) {
    const Error e = error_of(*got[t], *exact_of[t]);
    const double bound = factor[t] * max_abs_error(*naive_of[t], *exact_of[t]) + 1e-5;
    const double ratio = e.max_abs / bound;
    worst_ratio[t] = std::max(worst_ratio[t], ratio);
    std::printf(" %s %.2f%s", kOutputNames[t], ratio, e.mismatched ? " (NaN or infinity mismatch)" : "");
    pass = pass && ratio <= 1 && e.mismatched == 0;
  }
  std::printf("%s\n", pass ? "" : "  FAIL");
  return pass;
}

// The shapes of tests/attention/test_cuda_attention_mma.cpp: accuracy_cases() and the fully masked rows case.
void add_test_file_cases(std::vector<Case>& cases) {
  for (int D : {64, 128})
    for (bool causal : {false, true})
      for (int N : {1, 17, 64, 200}) cases.push_back({N == 200 ? 1 : 2, 4, N % 2 == 0 ? 2 : 1, N, N, D, causal});
  cases.push_back({2, 4, 2, 5, 200, 64, true});
  cases.push_back({1, 4, 1, 17, 130, 128, false});
  cases.push_back({1, 2, 2, 70, 100, 128, true});
  cases.push_back({2, 2, 1, 40, 24, 64, true});
  cases.push_back({2, 4, 2, 150, 150, 64, true, 40});
  cases.push_back({2, 4, 4, 70, 90, 128, false, 0, {90, 33}});
  cases.push_back({2, 2, 1, 32, 32, 128, true, 4, {10, 0}});
}

// Windows past int (params_of clamps them to Nk + 1), for the given head dims.
void add_huge_windows(std::vector<Case>& cases, std::vector<int> dims, std::vector<int64_t> windows) {
  for (int D : dims)
    for (int64_t w : windows) {
      cases.push_back({1, 2, 1, 90, 70, D, false, w});
      cases.push_back({1, 2, 1, 70, 90, D, true, w});
    }
}

std::vector<Case> ci_cases() {
  std::vector<Case> cases;
  add_test_file_cases(cases);
  cases.push_back({1, 2, 1, 90, 70, 64, false, int64_t(INT_MAX)});
  cases.push_back({1, 2, 1, 70, 90, 128, true, (int64_t(1) << 32) + 5});
  cases.push_back({2, 4, 2, 100, 100, 64, false, 0, {0, 77}});    // batch row 0 fully masked
  cases.push_back({1, 2, 1, 100, 30, 128, true});                 // Nq > Nk, causal: 70 rows see nothing
  cases.push_back({2, 2, 1, 20, 150, 128, false, 9, {140, 60}});  // decode-like window and key lengths
  cases.push_back({2, 4, 2, 70, 70, 64, true, 0, {}, 4, 8});      // strided operands
  return cases;
}

std::vector<Case> quick_cases() {
  std::vector<Case> cases;
  for (int D : {64, 128})
    for (auto [nq, nk] : {std::pair{17, 17}, std::pair{64, 130}})
      for (bool causal : {false, true}) cases.push_back({1, 2, 1, nq, nk, D, causal});
  cases.push_back({1, 2, 1, 70, 90, 64, false, 9});
  cases.push_back({2, 2, 1, 40, 70, 128, true, 0, {50, 20}});
  return cases;
}

std::vector<Case> full_cases() {
  std::vector<Case> cases;
  for (int D : {64, 128}) {
    for (auto [nq, nk] :
         {std::pair{1, 1}, {17, 17}, {64, 64}, {200, 200}, {1, 200}, {17, 200}, {64, 130}, {130, 64}, {0, 5}, {5, 0}})
      for (bool causal : {false, true}) cases.push_back({1, 2, 1, nq, nk, D, causal});
    cases.push_back({2, 4, 2, 70, 70, D, true, 0, {}, 4, 8});
    cases.push_back({2, 4, 1, 33, 150, D, false, 0, {}, 0, 4});
    cases.push_back({1, 4, 4, 40, 40, D, true, 0, {}, 8, 0});
    cases.push_back({2, 4, 2, 100, 100, D, false, 0, {0, 77}});
    cases.push_back({2, 4, 2, 90, 120, D, true, 0, {3, 200}, 4, 4});
    cases.push_back({2, 2, 1, 150, 150, D, true, 5});
    cases.push_back({1, 2, 2, 150, 150, D, false, 70});
    cases.push_back({2, 2, 1, 20, 150, D, false, 9, {140, 60}});
    cases.push_back({1, 2, 1, 100, 30, D, true});
    cases.push_back({1, 2, 1, 100, 30, D, false, 7});
    cases.push_back({1, 1, 1, 200, 200, D, true, 1});  // window 1: the diagonal only
    cases.push_back({1, 1, 1, 65, 65, D, false, 64});
    cases.push_back({3, 2, 2, 64, 128, D, true, 0, {100, 0, 128}});
  }
  add_huge_windows(cases, {64, 128},
                   {int64_t(INT_MAX), int64_t(INT_MAX) - 3, (int64_t(1) << 32) + 5, int64_t(1) << 40});
  return cases;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "ci";
  std::vector<Case> cases;
  if (mode == "ci") cases = ci_cases();
  else if (mode == "quick") cases = quick_cases();
  else if (mode == "full") cases = full_cases();
  else {
    std::fprintf(stderr, "usage: %s [ci|quick|full]\n", argv[0]);
    return 2;
  }
  double worst_ratio[kOutputs] = {};
  int failures = 0;
  uint64_t seed = 1;
  for (const Case& c : cases) failures += !run_case(c, seed++, worst_ratio);
  std::printf("worst error/bound:");
  for (int t = 0; t < kOutputs; ++t) std::printf(" %s %.2f", kOutputNames[t], worst_ratio[t]);
  std::printf("\n%zu cases, %d failed, %ld shared-memory races, %ld reads of unwritten shared memory\n", cases.size(),
              failures, cuda_emu::g_races, cuda_emu::g_uninitialised_reads);
  return failures || cuda_emu::g_races || cuda_emu::g_uninitialised_reads ? 1 : 0;
}
