// `qkv sample --prompts FILE --batch-size B`: one JSON line per prompt in prompt order, each the
// tokens train::generate gives that prompt alone (numerics = invariant), log-probs on request, a
// summary line with --json; a bad prompts line is refused naming the file and line.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "data/tokenizer.h"
#include "tensor/numerics.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/model_factory.h"
#include "train/sampler.h"
#include "build_dir.h"

using namespace qkv;
namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct Run {
  int rc = -1;
  std::vector<std::string> lines;  // stdout's non-empty lines
  std::string err;
};

Run run_qkv(const std::string& dir, const std::string& args) {
  const std::string cmd = std::string(QKV_BINARY_DIR) + "/qkv " + args + " >" + dir + "/out 2>" + dir + "/err";
  const int rc = std::system(cmd.c_str());
  Run r;
  r.rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  std::istringstream in(slurp(dir + "/out"));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) r.lines.push_back(line);
  r.err = slurp(dir + "/err");
  return r;
}

}  // namespace

TEST_CASE("sample --prompts: JSON lines in prompt order, each generate's tokens; a bad line names file:line",
          "[cli][sample]") {
  if (!fs::exists(std::string(QKV_BINARY_DIR) + "/qkv")) {
    WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
    return;
  }
  const fs::path dir = fs::temp_directory_path() / ("qkv_sample_batch_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // A random-weight byte-tokenizer model (no training needed: the CLI must match the library).
  Config c;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.n_embd = 48;
  c.model.block_size = 48;
  c.data.tokenizer = TokenizerKind::byte;
  const ByteTokenizer tok;
  auto model = train::build_model(c.resolved(), tok.vocab_size());
  model->init_weights(3);
  model->eval();
  const std::string ckpt = (dir / "m.h5").string();
  train::TrainState state;
  train::save_checkpoint(ckpt, c, *model, nullptr, state, tok);

  const std::vector<std::string> texts = {"hello", "a", "the quick brown fox", "zz", "0123456789"};
  {
    std::ofstream f(dir / "prompts.jsonl");
    f << "\"hello\"\n{\"prompt\": \"a\", \"id\": 7}\n\n\"the quick brown fox\"\n{\"prompt\":\"zz\"}\n\"0123456789\"\n";
  }
  const Run r = run_qkv(dir.string(), "sample --checkpoint " + ckpt + " --prompts " + (dir / "prompts.jsonl").string() +
                                          " --batch-size 2 --max-new-tokens 5 --temperature 0 --numerics invariant "
                                          "--logprobs --json");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  REQUIRE(r.lines.size() == texts.size() + 1);
  const NumericsGuard mode(Numerics::invariant);
  train::SampleOptions o;
  o.temperature = 0;
  o.max_new_tokens = 5;
  for (size_t i = 0; i < texts.size(); ++i) {
    INFO("prompt " << i);
    const nlohmann::json j = nlohmann::json::parse(r.lines[i]);
    CHECK(j["index"] == i);
    CHECK(j["prompt"] == texts[i]);
    std::vector<double> lp;
    const std::vector<int32_t> want = train::generate(*model, tok.encode(texts[i]), o, {}, &lp);
    CHECK(j["tokens"].get<std::vector<int32_t>>() == want);
    REQUIRE(j["logprobs"].size() == want.size());
    for (size_t t = 0; t < want.size(); ++t)
      CHECK(j["logprobs"][t].get<double>() == lp[t]);  // JSON doubles round-trip exactly
  }
  const nlohmann::json summary = nlohmann::json::parse(r.lines.back());
  CHECK(summary["prompts"] == texts.size());
  CHECK(summary["tokens"] == 5 * texts.size());
  CHECK(summary["batch_size"] == 2);
  CHECK(summary["tokens_per_s"].get<double>() > 0);

  // Line 3 (the blank line 3 counts) is not a string or {"prompt": string}.
  {
    std::ofstream f(dir / "bad.jsonl");
    f << "\"ok\"\n\n{\"text\": \"no prompt key\"}\n";
  }
  const Run bad = run_qkv(dir.string(), "sample --checkpoint " + ckpt + " --prompts " + (dir / "bad.jsonl").string());
  CHECK(bad.rc == 2);
  CHECK(bad.err.find("bad.jsonl:3:") != std::string::npos);
  CHECK(std::count(bad.err.begin(), bad.err.end(), '\n') == 1);
  {
    std::ofstream f(dir / "bad.jsonl");
    f << "\"ok\"\n{not json\n";
  }
  const Run bad2 = run_qkv(dir.string(), "sample --checkpoint " + ckpt + " --prompts " + (dir / "bad.jsonl").string());
  CHECK(bad2.rc == 2);
  CHECK(bad2.err.find("bad.jsonl:2:") != std::string::npos);
  CHECK(bad2.err.find("not valid JSON") != std::string::npos);
  // Options that do not go together are refused by name, before any generation.
  const std::string prompts = " --prompts " + (dir / "prompts.jsonl").string();
  const std::pair<std::string, const char*> clash[] = {{" --prompt x" + prompts, "--prompt or --prompts"},
                                                       {" --batch-size 4", "--batch-size only acts with --prompts"},
                                                       {prompts + " --no-kv-cache", "--no-kv-cache"},
                                                       {prompts + " --logprobs", "--logprobs"},
                                                       {prompts + " --batch-size 0", "--batch-size"}};
  for (const auto& [args, name] : clash) {
    const Run c = run_qkv(dir.string(), "sample --checkpoint " + ckpt + args);
    INFO(args << ": " << c.err);
    CHECK(c.rc == 2);
    CHECK(c.err.find(name) != std::string::npos);
    CHECK(c.lines.empty());
  }
  fs::remove_all(dir);
}
