// The head-pattern detector (analysis/heads.h) on heads whose weights are built to have a known
// pattern: each head must get its label.
#include <catch2/catch.hpp>

#include <filesystem>

#include "analysis/heads.h"
#include "analysis/png.h"
#include "autograd/grad_mode.h"
#include "tensor/ops.h"

using namespace qkv;

namespace {

// One layer, six heads of size 16, learned positions, RMSNorm, no bias. Token embeddings: letters
// (ids 0, 1) are zero vectors, separators (ids 2, 3) set dimension 16; position p sets dimension p
// (p < 16). RMSNorm then gives sqrt(C)·e_p for a letter and sqrt(C/2)·(e_p + e_16) for a separator,
// so a query/key projection that maps dimension p to a head dimension makes q_i·k_j a scaled
// indicator of the positions (or of "j is a separator") the head is built to prefer:
//   head 0 diagonal:  q = e_i,          k = e_j              peaks at j = i
//   head 1 previous:  q = e_i,          k = e_{j+1}          peaks at j = i - 1
//   head 2 first:     q = e_0 always,   k = e_0 iff j = 0     peaks at j = 0
//   head 3 separator: q = e_0 always,   k = e_0 iff j is a separator
//   head 4 local:     q = e_i,          k = Σ_{o<4} e_{j+o}   uniform over i-3 .. i
//   head 5 broad:     q = k = 0                               uniform over 0 .. i
// The logits are C/4 = 24 (letters) down to 12 (separators) against 0: the softmax puts all but
// ~e^-12 of the weight where intended.
std::unique_ptr<nn::DecoderModel> constructed_model() {
  nn::ModelConfig c;
  c.family = nn::Family::gpt2;
  c.n_layer = 1;
  c.n_head = c.n_kv_head = 6;
  c.n_embd = 96;
  c.block_size = 16;
  c.vocab_size = 4;
  c.ffn_hidden = 32;
  c.position = nn::Position::learned;
  c.norm = nn::NormKind::rmsnorm;
  c.bias = false;
  auto model = std::make_unique<nn::DecoderModel>(c);
  autograd::NoGradGuard no_grad;
  const int64_t C = 96, hd = 16, T = 16;
  std::vector<double> wte(4 * C, 0.0), wpe(T * C, 0.0), attn(3 * C * C, 0.0);
  wte[2 * C + 16] = wte[3 * C + 16] = 1;
  for (int64_t p = 0; p < T; ++p) wpe[p * C + p] = 1;
  auto q = [&](int64_t h, int64_t d, int64_t in) { attn[(h * hd + d) * C + in] = 1; };
  auto k = [&](int64_t h, int64_t d, int64_t in) { attn[(C + h * hd + d) * C + in] = 1; };
  for (int64_t d = 0; d < hd; ++d) {
    q(0, d, d), k(0, d, d);  // diagonal
    q(1, d, d);              // previous
    if (d + 1 < hd) k(1, d + 1, d);
    q(2, 0, d);  // first
    q(3, 0, d);  // separator
    q(4, d, d);  // local
    for (int64_t o = 0; o < 4 && d + o < hd; ++o) k(4, d + o, d);
  }
  k(2, 0, 0);
  k(3, 0, 16);
  for (const auto& p : model->named_parameters()) {
    if (p.name == "transformer.wte.weight") copy_(p.tensor, from_vector(wte, {4, C}));
    else if (p.name == "transformer.wpe.weight") copy_(p.tensor, from_vector(wpe, {T, C}));
    else if (p.name == "transformer.h.0.attn.c_attn.weight") copy_(p.tensor, from_vector(attn, {3 * C, C}));
    else if (p.name.find("norm") != std::string::npos || p.name.find("ln_") != std::string::npos) fill_(p.tensor, 1.0);
    else fill_(p.tensor, 0.0);
  }
  model->eval();
  return model;
}

}  // namespace

TEST_CASE("heads: constructed heads get their labels", "[heads]") {
  const auto model = constructed_model();
  // "ab ab\nab ab ..." : a separator every third token, never at 0.
  std::vector<int32_t> text;
  for (int i = 0; i < 40; ++i) text.push_back(i % 3 == 2 ? (i % 6 == 5 ? 3 : 2) : i % 3);
  const std::vector<bool> sep = {false, false, true, true};
  const auto windows = analysis::sample_windows(text, 16, 3);
  REQUIRE(windows.size() == 3);
  const analysis::HeadsReport r = analysis::analyze_heads(*model, windows, sep);
  REQUIRE(r.heads.size() == 6);
  CHECK(r.queries == 3 * 15);
  const char* expected[] = {"diagonal", "previous_token", "first_token", "separator", "local", "broad"};
  for (int h = 0; h < 6; ++h) {
    const auto& s = r.heads[static_cast<size_t>(h)];
    INFO("head " << h << ": " << s.label << " diag " << s.diagonal << " prev " << s.previous_token << " first "
                 << s.first_token << " sep " << s.separator << " local " << s.local << " ent/max " << s.entropy_norm);
    CHECK(s.label == expected[h]);
  }
  // The scores behind the labels, against hand counts.
  CHECK(r.heads[0].diagonal > 0.99);
  CHECK(r.heads[0].mean_distance < 0.01);
  CHECK(r.heads[1].previous_token > 0.99);
  CHECK(r.heads[1].mean_distance == Approx(1.0).epsilon(0.01));
  CHECK(r.heads[2].first_token > 0.99);
  CHECK(r.heads[2].mean_distance == Approx(8.0).epsilon(0.01));  // mean of i over 1..15
  // Separator head: query 1 of each window sees no separator yet (uniform there, 1 query in 15);
  // every other query puts ~all its weight on separators: 14/15.
  CHECK(r.heads[3].separator > 0.9);
  CHECK(r.heads[4].local > 0.99);
  CHECK(r.heads[4].diagonal < 0.5);
  // Uniform weights: entropy ln(i + 1) exactly, first-token weight 1/(i + 1).
  CHECK(r.heads[5].entropy_norm == Approx(1.0).epsilon(1e-4));
  double first = 0;
  for (int i = 1; i < 16; ++i) first += 1.0 / (i + 1);
  CHECK(r.heads[5].first_token == Approx(first / 15).epsilon(1e-4));
  // The averaged maps and the report.
  REQUIRE(r.mean_maps.weights.size() == 1);
  CHECK(r.mean_maps.tokens == 16);
  const std::string dir = (std::filesystem::temp_directory_path() / "qkv_test_heads_report").string();
  std::filesystem::remove_all(dir);
  analysis::write_heads_report(dir, r, "constructed");
  CHECK(std::filesystem::exists(dir + "/index.html"));
  const analysis::Image img = analysis::read_png(dir + "/heads.png");
  CHECK(img.width() > 100);
  const auto j = analysis::heads_json(r);
  REQUIRE(j["heads"].size() == 6);
  CHECK(j["heads"][1]["label"] == "previous_token");
  CHECK(j["heads"][1]["scores"]["previous_token"].get<double>() > 0.99);
  CHECK(j["labels"]["broad"] == 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE("heads: label rules and thresholds", "[heads]") {
  analysis::HeadsOptions o;
  analysis::HeadScores s;
  s.diagonal = 0.3;
  s.previous_token = 0.45;
  s.local = 0.6;
  s.entropy_norm = 0.5;
  analysis::label_head(s, o);
  CHECK(s.label == "mixed");
  CHECK(s.label_score == 0.45);
  s.previous_token = 0.5;  // the threshold itself passes
  analysis::label_head(s, o);
  CHECK(s.label == "previous_token");
  s.previous_token = 0.45;
  s.local = 0.75;
  analysis::label_head(s, o);
  CHECK(s.label == "local");
  s.local = 0.2;
  s.entropy_norm = 0.85;
  analysis::label_head(s, o);
  CHECK(s.label == "broad");
  o.broad_threshold = 0.9;
  analysis::label_head(s, o);
  CHECK(s.label == "mixed");
}

TEST_CASE("heads: separator table and windows", "[heads]") {
  const auto tok = make_tokenizer(TokenizerKind::character, "ab c\n.d");
  const auto sep = analysis::separator_ids(*tok, analysis::default_separators());
  int n = 0;
  for (int32_t id = 0; id < tok->vocab_size(); ++id) {
    std::string s;
    tok->append_token(id, s);
    const bool expect = s == " " || s == "\n" || s == ".";
    CHECK(sep[static_cast<size_t>(id)] == expect);
    n += expect;
  }
  CHECK(n == 3);
  const auto only_space = analysis::separator_ids(*tok, " ");
  CHECK(std::count(only_space.begin(), only_space.end(), true) == 1);
  std::vector<int32_t> ids(100);
  for (int i = 0; i < 100; ++i) ids[static_cast<size_t>(i)] = i;
  auto w = analysis::sample_windows(ids, 10, 4);
  REQUIRE(w.size() == 4);
  CHECK(w[0].front() == 0);
  CHECK(w[3].back() == 99);
  CHECK(w[1].front() == 30);
  w = analysis::sample_windows(std::vector<int32_t>{1, 2, 3}, 10, 5);
  REQUIRE(w.size() == 1);  // shorter than a window: the text once
  CHECK(w[0].size() == 3);
  CHECK_THROWS_WITH(analysis::sample_windows({}, 10, 2), Catch::Contains("no tokens"));
}
