// Inputs that used to be taken silently: a metrics log that is a FIFO, holds a step that is not a
// number or spans more than a double; a reference attention bench past its N; `heads` windows
// longer than the text and separators no token is made of; a prepared dataset asked for another
// split or bpe size; a block_sparse layout file edited after the checkpoint was written;
// `--overwrite` over the --init-from checkpoint. Each is now refused by name, or computed as asked.
#include <catch2/catch.hpp>
#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "analysis/plot.h"
#include "checkpoint_test_util.h"
#include "data/dataset.h"
#include "train/config.h"
#include "train/model_factory.h"
#include "build_dir.h"

using namespace qkv;
using namespace qkv::ckpt_test;
using Catch::Contains;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string qkv_binary() { return std::string(QKV_BINARY_DIR) + "/qkv"; }

// `qkv ARGS` run in `dir` under `timeout` (a hang is status 124): exit status; stderr in `err`.
int run_qkv(const std::string& dir, const std::string& args, std::string& err) {
  const std::string err_file = dir + "/stderr.txt";
  std::string out;
  const int rc = run_command(
      "cd " + dir + " && timeout 120 " + qkv_binary() + " " + args + " >/dev/null 2>" + err_file + " </dev/null", out);
  err = slurp(err_file);
  return rc;
}

// The polyline's points of an SVG that `qkv plot` drew, as text.
std::string points_of(const std::string& svg) {
  const size_t at = svg.find("points='");
  REQUIRE(at != std::string::npos);
  const size_t from = at + 8;
  return svg.substr(from, svg.find('\'', from) - from);
}

}  // namespace

TEST_CASE("qkv plot: a FIFO or device is refused, a bad step named by line, any finite range drawn finite",
          "[faults][plot]") {
  TempDir dir;
  const std::string svg = dir.file("loss.svg");

  // Nobody writes into the FIFO: a reader that opened it would block.
  const std::string fifo = dir.file("metrics.fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THAT(error_of([&] { analysis::plot_metrics(fifo, svg); }), Contains(fifo) && Contains("not a regular file"));
  CHECK_THAT(error_of([&] { analysis::plot_metrics("/dev/zero", svg); }), Contains("/dev/zero"));

  const std::string log = dir.file("metrics.jsonl");
  write_text(log, "{\"step\": 1, \"loss\": 2.0}\n{\"step\": \"a\", \"loss\": 1.0}\n");
  CHECK(error_of([&] { analysis::plot_metrics(log, svg); }) == log + ":2: \"step\" is not a number");
  write_text(log, "[1, 2]\n");
  CHECK(error_of([&] { analysis::plot_metrics(log, svg); }) == log + ":1: not a JSON object");
  CHECK_FALSE(fs::exists(svg));

  // Hand-computed: x from 0..10 onto 70..780; y over [1, 2] padded by 5% a side, [0.95, 2.05],
  // onto 430..40: 430 - 0.05/1.1 * 390 = 412.2727..., 430 - 1.05/1.1 * 390 = 57.7272...
  write_text(log, "{\"step\": 0, \"loss\": 1.0}\n{\"step\": 10, \"loss\": 2.0}\n");
  analysis::plot_metrics(log, svg);
  CHECK(points_of(slurp(svg)) == "70,412.273 780,57.7273 ");

  // Losses from -1e308 to 1e308: their difference overflows a double; the drawing stays finite,
  // the end points at the plot's edges.
  write_text(log, "{\"step\": 1, \"loss\": 1e308}\n{\"step\": 2, \"loss\": -1e308}\n");
  analysis::plot_metrics(log, svg);
  const std::string drawn = slurp(svg);
  CHECK(drawn.find("nan") == std::string::npos);
  CHECK(drawn.find("inf") == std::string::npos);
  CHECK(points_of(drawn) == "70,57.7273 780,412.273 ");

  // No finite loss at all: refused, not an empty plot.
  write_text(log, "{\"step\": 1, \"loss\": null}\n");
  CHECK_THAT(error_of([&] { analysis::plot_metrics(log, svg); }), Contains("no finite loss values"));
}

TEST_CASE("a prepared dataset refuses a run that asks for another split or bpe size", "[faults][data]") {
  TempDir dir;
  const std::string text = dir.file("corpus.txt");
  std::string corpus;
  for (int i = 0; i < 40; ++i) corpus += std::string(kCorpus) + " line " + std::to_string(i) + "\n\n";
  write_text(text, corpus);

  PrepareOptions o;
  o.tokenizer = TokenizerKind::character;
  o.val_fraction = 0.2;
  const std::string h5 = dir.file("char.h5");
  prepare_dataset(text, h5, o);
  CHECK(load_or_prepare(h5, o).val_fraction == 0.2);  // as prepared: loads
  PrepareOptions asks = o;
  asks.val_fraction = 0.5;
  CHECK_THAT(error_of([&] { load_or_prepare(h5, asks); }),
             Contains(h5) && Contains("val_fraction 0.2, but data.val_fraction is 0.5"));

  o.tokenizer = TokenizerKind::bpe;
  o.bpe_vocab_size = 300;
  const std::string bpe = dir.file("bpe.h5");
  prepare_dataset(text, bpe, o);
  CHECK(load_or_prepare(bpe, o).bpe_vocab_size == 300);
  asks = o;
  asks.bpe_vocab_size = 1000;
  CHECK_THAT(error_of([&] { load_or_prepare(bpe, asks); }),
             Contains(bpe) && Contains("bpe_vocab_size 300, but data.bpe_vocab_size is 1000"));

  // A tokenizer given to prepare (its --tokenizer-from) was not built from bpe_vocab_size: any
  // size the run states is not compared with it.
  const Dataset built = load_dataset(bpe);
  PrepareOptions given = o;
  given.given = built.tokenizer;
  const std::string from = dir.file("from.h5");
  prepare_dataset(text, from, given);
  CHECK(load_dataset(from).bpe_vocab_size == 0);
  CHECK_NOTHROW(load_or_prepare(from, asks));
}

TEST_CASE("a checkpoint holds its block_sparse layout: an edited layout file changes neither model nor resume",
          "[faults][checkpoint]") {
  TempDir dir;
  const std::string layout = dir.file("layout.txt");
  write_text(layout, "1000\n1100\n0110\n0011\n");
  Config cfg = tiny_config("gpt2");
  for (const std::string& o : std::vector<std::string>{"model.attention_pattern=block_sparse",
                                                       "model.pattern_block_size=4", "model.pattern_layout=" + layout})
    apply_override(cfg, o);
  validate(cfg, "test");
  Run r;
  r.cfg = cfg.resolved();
  r.tok = CharTokenizer::train(kCorpus);
  r.model = train::build_model(r.cfg, r.tok->vocab_size());
  r.model->init_weights(3);
  r.opt = make_optimizer(*r.model, r.cfg);
  r.state.step = 1;
  const std::string ckpt = dir.file("ckpt.h5");
  save(r, ckpt);

  write_text(layout, "1000\n1100\n1110\n1111\n");  // edited after the run
  const train::CheckpointMeta meta = train::read_checkpoint_meta(ckpt);
  CHECK(meta.config.model.pattern_layout == "rows:1000/1100/0110/0011");
  const auto loaded = train::build_model(meta.config.resolved(), r.tok->vocab_size());
  CHECK(loaded->config().pattern.layout_table == r.model->config().pattern.layout_table);
  CHECK(loaded->config() == r.model->config());  // the same model, whatever the layout's source

  // Resuming compares the tables: the edited file is another model, the file restored the same.
  const auto edited = train::build_model(r.cfg, r.tok->vocab_size());
  const auto d = train::model_difference(loaded->config(), edited->config());
  REQUIRE(d);
  CHECK(d->key == "model.pattern_layout");
  CHECK(d->a == "\"rows:1000/1100/0110/0011\"");
  CHECK(d->b == "\"rows:1000/1100/1110/1111\"");
  write_text(layout, "1000\n1100\n0110\n0011\n");
  CHECK_FALSE(train::model_difference(loaded->config(), train::build_model(r.cfg, r.tok->vocab_size())->config()));
}

TEST_CASE("CLI: heads, bench, keys and train --overwrite refuse what they used to take silently", "[faults][cli]") {
  if (::access(qkv_binary().c_str(), X_OK) != 0) {
    WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
    return;
  }
  TempDir dir;
  const std::string d = dir.path.string();
  std::string err;

  // heads: a --length the text cannot fill; separators no token is made of. Without --length the
  // short text is analysed whole.
  Run r = make_run("gpt2");
  save(r, dir.file("ckpt.h5"));
  write_text(dir.file("short.txt"), "was");
  CHECK(run_qkv(d, "heads --checkpoint ckpt.h5 --data short.txt --length 16 --windows 5", err) == 2);
  CHECK(err == "qkv: [heads] --data short.txt encodes to 3 tokens; --length 16 needs at least 16\n");
  CHECK(run_qkv(d, "heads --checkpoint ckpt.h5 --data short.txt", err) == 0);
  CHECK(run_qkv(d, "heads --checkpoint ckpt.h5 --data short.txt --separators Ω", err) == 2);
  CHECK_THAT(err, Contains("--separators \"Ω\": no token of the checkpoint's tokenizer"));
  CHECK(run_qkv(d, "heads --checkpoint ckpt.h5 --data short.txt --separators ' ,'", err) == 0);

  // bench: the reference kernel alone past its N is refused; beside fused it is left out, said so.
  CHECK(run_qkv(d, "bench --what attention --n 8192 --kernel reference", err) == 2);
  CHECK_THAT(err, Contains("--kernel reference") && Contains("up to N = 4096") && Contains("--n 8192"));

  // keys --json: every key, as the Markdown reference lists them.
  std::string out;
  REQUIRE(run_command(qkv_binary() + " keys --json", out) == 0);
  const nlohmann::json keys = nlohmann::json::parse(out).at("keys");
  CHECK(keys.size() == config_keys().size());
  CHECK(keys[0].at("key") == "model.family");
  CHECK(keys[0].at("type") == "gpt2 | llama");

  // train --overwrite would delete the --init-from checkpoint inside train.out_dir: refused, kept.
  std::string corpus;
  for (int i = 0; i < 20; ++i) corpus += kCorpus;
  write_text(dir.file("corpus.txt"), corpus);
  write_text(dir.file("t.toml"),
             "[model]\nfamily = \"gpt2\"\nn_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 8\n"
             "[data]\npath = \"corpus.txt\"\ntokenizer = \"char\"\nseparator = \"none\"\n"
             "[train]\nbatch_size = 2\nmax_steps = 2\neval_interval = 2\neval_batches = 1\nout_dir = \"run\"\n");
  REQUIRE(run_qkv(d, "train --config t.toml --quiet", err) == 0);
  const std::string init = dir.file("run/ckpt_000002.h5");
  REQUIRE(fs::exists(init));
  CHECK(run_qkv(d, "train --config t.toml --quiet --init-from run/ckpt_000002.h5 --overwrite", err) == 2);
  CHECK_THAT(err, Contains("run/ckpt_000002.h5: --init-from is a file of train.out_dir run"));
  CHECK(fs::exists(init));
}
