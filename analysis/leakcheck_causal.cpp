// The checks that feed the whole model: future-token perturbation (changing a later token must
// not move an earlier position's logits), training path vs inference paths (KV-cache decode,
// chunked prefill, greedy generation), padding and packing invariance.
//
// Each compares two ways of computing the same thing on the seeded probe batch. The consistency
// checks (KV decode, chunked prefill, padding, packing) measure max |Δlogit| against a threshold
// of 0 under numerics = invariant and of the float32 rounding bound times max |logit| under
// standard, where different batch shapes reach different GEMM blockings and attention tiles
// (leak::consistency_bound). The future-token perturbation compares equal shapes, so it is exact
// in both modes.
#include <algorithm>
#include <cmath>
#include <map>

#include "tensor/ops.h"
#include "analysis/leakcheck_internal.h"
#include "train/sampler.h"

namespace qkv::analysis {

using leak::fmt;
using leak::max_abs;
using leak::max_delta;

namespace {

Tensor bool_tensor(const std::vector<uint8_t>& v, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::boolean);
  bool* p = t.data<bool>();
  for (size_t i = 0; i < v.size(); ++i) p[i] = v[i] != 0;
  return t;
}

// Tokens guaranteed to differ from `row` at every position (the perturbation must change them).
std::vector<int64_t> replacement(const std::vector<int64_t>& row, const std::vector<int64_t>& draw, int64_t V) {
  std::vector<int64_t> out = draw;
  for (size_t t = 0; t < out.size(); ++t)
    if (out[t] == row[t]) out[t] = (out[t] + 1) % std::max<int64_t>(V, 1);
  return out;
}

}  // namespace

LeakCheck check_future_perturbation(const nn::DecoderModel& model, const LeakCheckOptions& o) {
  const leak::EvalModel m(model);
  const nn::ModelConfig& c = m->config();
  const int64_t L = leak::probe_len(c, o), V = c.vocab_size;
  const std::string name = "future_token_perturbation";
  if (L < 2 || V < 2) return leak::make_check(name, 0, 0, "probe too short (or vocabulary too small) to perturb");
  const auto rows = leak::probe_rows(c, o, 2, L, 1), draws = leak::probe_rows(c, o, 2, L, 2);
  // Rows per forward, so logits and hidden states stay ~64 MB.
  const int64_t per_row = L * std::max(V, c.n_embd * c.n_layer);
  const int64_t group = std::clamp<int64_t>((int64_t{16} << 20) / std::max<int64_t>(per_row, 1), 1, 32);
  // Logits and every layer's hidden state of one forward over `batch`.
  const auto outputs = [&](const std::vector<std::vector<int64_t>>& batch) {
    std::vector<Tensor> hidden;
    nn::ForwardArgs a;
    a.ids = leak::ids_tensor(batch);
    a.hidden = &hidden;
    std::vector<Tensor> outs{leak::forward(*m, a)};
    outs.insert(outs.end(), hidden.begin(), hidden.end());
    return outs;
  };
  double worst = 0;
  int64_t worst_t = -1;
  std::string worst_where = "logits";
  for (size_t r = 0; r < rows.size(); ++r) {
    const std::vector<int64_t> alt = replacement(rows[r], draws[r], V);
    // The probe is never compared across batch rows: perturbed row k of a batch of n is compared
    // with row k of a batch of n copies of the probe (same shapes, same row position), so every
    // GEMM and kernel reduces each compared element in the same order on both sides, and a model
    // that reads no future token gives exactly 0 under any deterministic BLAS and thread count.
    std::map<int64_t, std::vector<Tensor>> probe_by_batch_size;
    for (int64_t t0 = 0; t0 < L - 1; t0 += group) {
      const int64_t n = std::min(group, L - 1 - t0);
      auto& base = probe_by_batch_size[n];
      if (base.empty()) base = outputs(std::vector<std::vector<int64_t>>(static_cast<size_t>(n), rows[r]));
      // Row k: tokens after t = t0 + k replaced.
      std::vector<std::vector<int64_t>> batch;
      for (int64_t k = 0; k < n; ++k) {
        std::vector<int64_t> p = rows[r];
        for (int64_t s = t0 + k + 1; s < L; ++s) p[s] = alt[s];
        batch.push_back(p);
      }
      const std::vector<Tensor> outs = outputs(batch);
      for (size_t w = 0; w < outs.size(); ++w) {
        const double norm = max_abs(base[w].select(0, 0));
        for (int64_t k = 0; k < n; ++k) {
          const int64_t t = t0 + k;
          const double d = leak::ratio(
              max_delta(outs[w].select(0, k).narrow(0, 0, t + 1), base[w].select(0, k).narrow(0, 0, t + 1)), norm);
          if (d > worst) {
            worst = d;
            worst_t = t;
            worst_where = w == 0 ? "logits" : "hidden state of layer " + std::to_string(w - 1);
          }
        }
      }
    }
  }
  std::string detail = "every t < " + std::to_string(L) + " on 2 probe rows; logits and " + std::to_string(c.n_layer) +
                       " hidden states at positions <= t, each compared with the probe at the same batch row in a "
                       "batch of the same shape (identical rounding), so any change is information from the future";
  if (worst_t >= 0 && worst > 0) detail += "; worst: " + worst_where + " at t = " + std::to_string(worst_t);
  return leak::make_check(name, worst, 0, detail);
}

std::vector<LeakCheck> check_train_vs_inference(const nn::DecoderModel& model, const LeakCheckOptions& o) {
  const leak::EvalModel m(model);
  const nn::ModelConfig& c = m->config();
  const int64_t L = leak::probe_len(c, o), B = 2;
  const auto rows = leak::probe_rows(c, o, B, L, 3);
  const Tensor ids = leak::ids_tensor(rows);
  const Tensor full = leak::forward(*m, ids);  // [B, L, V], the training path in eval mode
  const double scale = max_abs(full);
  // Both decode paths step linear attention's recurrent state (leak::consistency_bound).
  const leak::ConsistencyBound bound = leak::consistency_bound(c, L, scale, leak::recurrent_decode(c));
  const double tol = leak::rounding_tolerance(c, L);
  const std::string rows_note = std::to_string(B) + "x" + std::to_string(L) + " tokens";
  std::vector<LeakCheck> out;

  // Token by token through the KV cache.
  {
    nn::ModelCache cache = m->make_cache(B, L);
    std::vector<Tensor> steps;
    for (int64_t t = 0; t < L; ++t) {
      nn::ForwardArgs a;
      a.ids = ids.narrow(1, t, 1);
      a.cache = &cache;
      steps.push_back(leak::forward(*m, a));
    }
    const Tensor decoded = cat(steps, 1);
    std::vector<double> per;
    int64_t diverges = -1;
    for (int64_t b = 0; b < B; ++b) leak::fold_gaps(per, diverges, 0, decoded.select(0, b), full.select(0, b));
    out.push_back(leak::make_consistency_check(
        "kv_decode", per, diverges, bound,
        "max |Δlogit|, parallel forward vs one token at a time with the KV cache, " + rows_note));
  }

  // Chunked prefill at each chunk size and the whole probe in one call.
  {
    std::vector<int64_t> sizes;
    for (int64_t cs : o.chunk_sizes)
      if (cs >= 1) sizes.push_back(std::min(cs, L));
    sizes.push_back(L);
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    std::vector<double> per;
    int64_t diverges = -1;
    std::string each;
    for (int64_t cs : sizes) {
      nn::ModelCache cache = m->make_cache(B, L);
      std::vector<Tensor> parts;
      for (int64_t s = 0; s < L; s += cs) {
        nn::ForwardArgs a;
        a.ids = ids.narrow(1, s, std::min(cs, L - s));
        a.cache = &cache;
        parts.push_back(leak::forward(*m, a));
      }
      const Tensor chunked = cat(parts, 1);
      std::vector<double> mine;
      for (int64_t b = 0; b < B; ++b) leak::fold_gaps(mine, diverges, 0, chunked.select(0, b), full.select(0, b));
      per.resize(std::max(per.size(), mine.size()), 0.0);
      for (size_t t = 0; t < mine.size(); ++t) per[t] = std::max(per[t], mine[t]);
      each += (each.empty() ? "" : ", ") + (cs == L ? "whole (" + std::to_string(L) + ")" : std::to_string(cs)) + ": " +
              fmt(*std::max_element(mine.begin(), mine.end()));
    }
    out.push_back(leak::make_consistency_check(
        "chunked_prefill", per, diverges, bound,
        "max |Δlogit|, parallel forward vs prefill through the KV cache in chunks of " + each + ", " + rows_note));
  }

  // Greedy generation with and without the cache.
  {
    const int64_t P = std::max<int64_t>(1, std::min<int64_t>(8, L / 2));
    std::vector<int32_t> prompt(rows[0].begin(), rows[0].begin() + P);
    train::SampleOptions so;
    so.temperature = 0;
    so.max_new_tokens = o.greedy_tokens > 0 ? o.greedy_tokens : std::min<int64_t>(c.block_size, 64);
    so.kv_cache = true;
    const auto with_cache = generate(*m, prompt, so);
    so.kv_cache = false;
    const auto without = generate(*m, prompt, so);
    int64_t differ = 0, first = -1;
    for (size_t i = 0; i < with_cache.size(); ++i)
      if (with_cache[i] != without[i]) {
        ++differ;
        if (first < 0) first = static_cast<int64_t>(i);
      }
    std::string detail = std::to_string(so.max_new_tokens) + " greedy tokens after a " + std::to_string(P) +
                         "-token prompt, KV cache vs full recompute";
    // Bitwise-equal logits (numerics = invariant, softmax attention) cannot break a tie two ways.
    const bool exact = bound.threshold == 0;
    if (first >= 0 && exact) {
      detail += "; first difference at token " + std::to_string(first) +
                " (numerics = invariant: the logits of both paths must be equal, so no tie excuses it)";
    } else if (first >= 0) {
      detail += "; first difference at token " + std::to_string(first);
      // Both paths are right when the two tokens they chose tie to within rounding: the two
      // rounding paths may then break the tie either way, and the sequences part from there on.
      std::vector<int64_t> context(prompt.begin(), prompt.end());
      context.insert(context.end(), without.begin(), without.begin() + first);
      if (static_cast<int64_t>(context.size()) > c.block_size)
        context.erase(context.begin(), context.end() - c.block_size);
      const Tensor last = leak::forward(*m, leak::ids_tensor(context))
                              .select(0, 0)
                              .select(0, static_cast<int64_t>(context.size()) - 1)
                              .to(Device::cpu);
      const double gap = std::abs(last.select(0, with_cache[first]).item() - last.select(0, without[first]).item());
      const double tie = tol * max_abs(last);
      if (gap <= tie) {
        detail += " after a tie within rounding (logit gap " + fmt(gap) + " <= " + fmt(tie) + "), so it is not counted";
        differ = 0;
      } else {
        detail += " (logit gap " + fmt(gap) + " > rounding " + fmt(tie) + ")";
      }
    }
    out.push_back(leak::make_check("greedy_generation", static_cast<double>(differ), 0, detail));
  }
  return out;
}

std::vector<LeakCheck> check_padding(const nn::DecoderModel& model, const LeakCheckOptions& o) {
  const leak::EvalModel m(model);
  const nn::ModelConfig& c = m->config();
  const int64_t L = leak::probe_len(c, o), V = c.vocab_size, B = 3;
  const auto rows = leak::probe_rows(c, o, B, L, 4), targets = leak::probe_rows(c, o, B, L, 5),
             pads = leak::probe_rows(c, o, B, L, 6);
  const std::vector<int64_t> len{L, std::max<int64_t>(1, L - std::max<int64_t>(1, L / 4)),
                                 std::max<int64_t>(1, L / 2 - 1)};

  // Each sequence alone, and its summed cross-entropy against arbitrary targets.
  std::vector<Tensor> alone;
  double alone_scale = 0, loss_sum = 0;
  int64_t loss_count = 0;
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int64_t> seq(rows[b].begin(), rows[b].begin() + len[b]);
    alone.push_back(leak::forward(*m, leak::ids_tensor(seq)));
    alone_scale = std::max(alone_scale, max_abs(alone.back()));
    const std::vector<int64_t> tg(targets[b].begin(), targets[b].begin() + len[b]);
    const CrossEntropyResult ce =
        cross_entropy(alone.back().reshape({len[b], V}), from_vector_i64(tg, {len[b]}).to(alone.back().device()));
    loss_sum += ce.loss.item() * static_cast<double>(ce.count);
    loss_count += ce.count;
  }
  const double loss_ref = loss_sum / static_cast<double>(loss_count);

  double worst_loss = 0;
  std::vector<double> per;  // max over sides and sequences, by position within the sequence
  int64_t diverges = -1;
  std::string sides, nonfinite;
  for (const bool left : {false, true}) {
    std::vector<int64_t> ids(static_cast<size_t>(B * L)), pos(static_cast<size_t>(B * L)),
        tgt(static_cast<size_t>(B * L), -100);
    std::vector<uint8_t> valid(static_cast<size_t>(B * L), 0);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t off = left ? L - len[b] : 0;  // where the sequence starts in its row
      for (int64_t t = 0; t < L; ++t) {
        const size_t at = static_cast<size_t>(b * L + t);
        const int64_t s = t - off;  // index within the sequence
        const bool real = s >= 0 && s < len[b];
        ids[at] = real ? rows[b][s] : pads[b][t];  // pad content is arbitrary on purpose
        // Real tokens keep their positions; pads take 0 on the left, the continuation on the right.
        pos[at] = real ? s : (left ? 0 : t);
        valid[at] = real;
        if (real) tgt[at] = targets[b][s];
      }
    }
    nn::ForwardArgs a;
    a.ids = from_vector_i64(ids, {B, L});
    a.positions = from_vector_i64(pos, {B, L});
    a.key_padding = bool_tensor(valid, {B, L});
    const Tensor lg = leak::forward(*m, a);
    if (!std::isfinite(max_abs(lg))) nonfinite = left ? "left" : "right";
    std::vector<double> side;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t off = left ? L - len[b] : 0;
      leak::fold_gaps(side, diverges, 0, lg.select(0, b).narrow(0, off, len[b]), alone[b].select(0, 0));
    }
    per.resize(std::max(per.size(), side.size()), 0.0);
    for (size_t t = 0; t < side.size(); ++t) per[t] = std::max(per[t], side[t]);
    sides += std::string(left ? ", left " : "right ") + fmt(*std::max_element(side.begin(), side.end()));
    const CrossEntropyResult ce = cross_entropy(lg.reshape({B * L, V}), from_vector_i64(tgt, {B * L}).to(lg.device()));
    worst_loss = std::max(worst_loss, leak::ratio(std::abs(ce.loss.item() - loss_ref), std::abs(loss_ref)));
  }
  std::string detail = "max |Δlogit|, 3 sequences (lengths " + std::to_string(len[0]) + ", " + std::to_string(len[1]) +
                       ", " + std::to_string(len[2]) +
                       ") alone vs in right- and left-padded batches with positions and key_padding (" + sides + ")";
  if (!nonfinite.empty()) detail += "; non-finite logits in the " + nonfinite + "-padded batch";
  const double tol = leak::rounding_tolerance(c, L);
  std::vector<LeakCheck> out;
  out.push_back(leak::make_consistency_check("padding_invariance", per, diverges,
                                             leak::consistency_bound(c, L, alone_scale, false), detail));
  if (!nonfinite.empty()) {  // non-finite logits anywhere in the batch, pads included, fail it
    out.back().value = INFINITY;
    out.back().pass = false;
  }
  out.push_back(leak::make_check("padding_target_loss", worst_loss, tol,
                                 "|Δloss| / loss: padded batch with ignore_index at pads vs the sequences alone "
                                 "(token-weighted mean " +
                                     fmt(loss_ref) + "); threshold: " + leak::rounding_tolerance_note(c, L)));
  return out;
}

LeakCheck check_packing(const nn::DecoderModel& model, const LeakCheckOptions& o) {
  const leak::EvalModel m(model);
  const nn::ModelConfig& c = m->config();
  const int64_t L = leak::probe_len(c, o), B = 2;
  const auto rows = leak::probe_rows(c, o, B, L, 7);
  // Document lengths per row (each > 0, summing to L).
  std::vector<std::vector<int64_t>> docs{{L / 3, L / 4, L - L / 3 - L / 4}, {L / 2, L - L / 2}};
  for (auto& d : docs) d.erase(std::remove(d.begin(), d.end(), int64_t{0}), d.end());
  std::vector<int64_t> seg(static_cast<size_t>(B * L)), pos(static_cast<size_t>(B * L));
  for (int64_t b = 0; b < B; ++b) {
    int64_t t = 0;
    for (size_t d = 0; d < docs[b].size(); ++d)
      for (int64_t s = 0; s < docs[b][d]; ++s, ++t) {
        seg[static_cast<size_t>(b * L + t)] = static_cast<int64_t>(d);
        pos[static_cast<size_t>(b * L + t)] = s;
      }
  }
  nn::ForwardArgs a;
  a.ids = leak::ids_tensor(rows);
  a.positions = from_vector_i64(pos, {B, L});
  a.segment_ids = from_vector_i64(seg, {B, L});
  const Tensor packed = leak::forward(*m, a);
  double scale = 0;
  int64_t n_docs = 0;
  std::vector<std::pair<Tensor, Tensor>> pairs;
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = 0;
    for (int64_t n : docs[b]) {
      const std::vector<int64_t> doc(rows[b].begin() + start, rows[b].begin() + start + n);
      const Tensor alone = leak::forward(*m, leak::ids_tensor(doc)).select(0, 0);
      scale = std::max(scale, max_abs(alone));
      pairs.emplace_back(packed.select(0, b).narrow(0, start, n), alone);
      start += n;
      ++n_docs;
    }
  }
  std::vector<double> per;  // by position within the document
  int64_t diverges = -1;
  for (const auto& [p, q] : pairs) leak::fold_gaps(per, diverges, 0, p, q);
  return leak::make_consistency_check("packing_invariance", per, diverges, leak::consistency_bound(c, L, scale, false),
                                      "max |Δlogit|, " + std::to_string(n_docs) +
                                          " documents packed into 2 rows with segment_ids and per-document "
                                          "positions vs each alone");
}

}  // namespace qkv::analysis
