// Documents, train/val splitting, the prepared-dataset HDF5 file, the HDF5 helper, and how
// damaged files are reported.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "data/dataset.h"
#include "data/h5.h"
#include "data/h5_atomic.h"
#include "tensor/error.h"

using namespace qkv;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path =
        fs::temp_directory_path() / ("qkv_data_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Twenty documents "doc K\n" in fortune format.
std::string fortune_text(int n) {
  std::string s;
  for (int k = 0; k < n; ++k) s += "doc " + std::to_string(k) + "\n%\n";
  return s;
}

// A hand-built dataset file with a byte tokenizer; the arguments break one thing at a time.
void write_manual(const std::string& path, const std::vector<int32_t>& train_tokens,
                  const std::string& format = "qkv-dataset", bool with_val = true, bool float_tokens = false) {
  h5::File f = h5::File::create(path);
  f.set_attr("/", "format", format);
  f.set_attr("/", "format_version", int64_t{1});
  f.set_attr("/", "tokenizer", "byte");
  f.set_attr("/", "vocab_size", int64_t{256});
  f.set_attr("/", "source", "manual.txt");
  save_tokenizer(f, "/tokenizer", ByteTokenizer());
  if (float_tokens) {
    std::vector<float> ft(train_tokens.begin(), train_tokens.end());
    f.write("/train/tokens", ft);
  } else {
    f.write("/train/tokens", train_tokens);
  }
  f.write("/train/doc_offsets", std::vector<int64_t>{0, static_cast<int64_t>(train_tokens.size())});
  if (with_val) {
    f.write("/val/tokens", std::vector<int32_t>{1, 2});
    f.write("/val/doc_offsets", std::vector<int64_t>{0, 2});
  }
  f.close();
}

}  // namespace

TEST_CASE("documents split on blank lines, percent lines, or not at all", "[data][dataset]") {
  const std::string blank = "\n\nfirst line\nsecond\n\n  \t\nthird\n\n\n";
  auto docs = split_documents(blank, DocSeparator::blank_line);
  REQUIRE(docs.size() == 2);
  CHECK(docs[0] == "first line\nsecond\n");
  CHECK(docs[1] == "third\n");

  const std::string pct = "a\n%\nb\nc\n%\n%\n  \n%\nd %\n%%\ne";
  docs = split_documents(pct, DocSeparator::percent_line);
  REQUIRE(docs.size() == 3);
  CHECK(docs[0] == "a\n");
  CHECK(docs[1] == "b\nc\n");
  CHECK(docs[2] == "d %\n%%\ne");  // only a line that is exactly "%" separates
  CHECK(split_documents("x\r\n%\r\ny\r\n", DocSeparator::percent_line).size() == 2);

  docs = split_documents(blank, DocSeparator::none);
  REQUIRE(docs.size() == 1);
  CHECK(docs[0] == blank);
  CHECK(split_documents(" \n\t\n", DocSeparator::none).empty());

  CHECK(document_text("d", DocSeparator::percent_line, true) == "d\n%\n");
  CHECK(document_text("b\nc\n", DocSeparator::blank_line, true) == "b\nc\n\n");
  CHECK(document_text("b\nc", DocSeparator::blank_line, false) == "b\nc");
  CHECK(document_text("b", DocSeparator::none, true) == "b");
  CHECK(parse_separator("percent_line") == DocSeparator::percent_line);
  CHECK_THROWS_WITH(parse_separator("dash"), Catch::Contains("unknown document separator 'dash'"));
}

TEST_CASE("prepare puts a seeded choice of whole documents into val", "[data][dataset]") {
  PrepareOptions o;
  o.separator = DocSeparator::percent_line;
  o.val_fraction = 0.2;
  const Dataset ds = prepare_text(fortune_text(20), "f.txt", o);
  CHECK(ds.split == "documents");
  REQUIRE(ds.train->n_docs() == 16);
  REQUIRE(ds.val->n_docs() == 4);
  // Every document is in exactly one split, whole, in file order within the split.
  std::vector<int> seen;
  for (const TokenSplit* s : {ds.train.get(), ds.val.get()}) {
    int last = -1;
    for (int64_t d = 0; d < s->n_docs(); ++d) {
      const std::string text = ds.tokenizer->decode(s->doc(d));
      REQUIRE(text.rfind("doc ", 0) == 0);
      REQUIRE(text.size() >= 8);
      CHECK(text.substr(text.size() - 3) == "\n%\n");
      const int k = std::stoi(text.substr(4));
      CHECK(k > last);
      last = k;
      seen.push_back(k);
    }
  }
  std::sort(seen.begin(), seen.end());
  for (int k = 0; k < 20; ++k) CHECK(seen[k] == k);
  // Same seed, same split; another seed, another split.
  CHECK(prepare_text(fortune_text(20), "f.txt", o).val->tokens == ds.val->tokens);
  o.split_seed = 99;
  CHECK(prepare_text(fortune_text(20), "f.txt", o).val->tokens != ds.val->tokens);
}

TEST_CASE("repeated documents are dropped before the split unless dedupe is off", "[data][dataset]") {
  PrepareOptions o;
  o.separator = DocSeparator::percent_line;
  o.val_fraction = 0.0;
  const std::string text = "same\n%\nb\n%\nsame\n%\nc\n%\nb\n";
  const Dataset d = prepare_text(text, "dup.txt", o);
  CHECK(d.duplicates_dropped == 2);
  REQUIRE(d.train->n_docs() == 3);
  CHECK(d.tokenizer->decode(d.train->tokens) == "same\n%\nb\n%\nc\n%\n");
  o.dedupe = false;
  const Dataset all = prepare_text(text, "dup.txt", o);
  CHECK(all.duplicates_dropped == 0);
  CHECK(all.train->n_docs() == 5);
}

TEST_CASE("a single document is split at the last val_fraction of its tokens", "[data][dataset]") {
  std::string text;
  for (int i = 0; i < 1000; ++i) text.push_back(static_cast<char>('a' + i % 26));
  PrepareOptions o;  // separator none, val 0.1, byte tokenizer
  const Dataset ds = prepare_text(text, "one.txt", o);
  CHECK(ds.split == "tokens");
  REQUIRE(ds.train->size() == 900);
  REQUIRE(ds.val->size() == 100);
  CHECK(ds.train->tokens[899] == static_cast<unsigned char>(text[899]));
  CHECK(ds.val->tokens[0] == static_cast<unsigned char>(text[900]));
  CHECK(ds.train->doc_offsets == std::vector<int64_t>{0, 900});
  CHECK(ds.val->doc_offsets == std::vector<int64_t>{0, 100});
  o.val_fraction = 0.0;
  const Dataset all = prepare_text(text, "one.txt", o);
  CHECK(all.train->size() == 1000);
  CHECK(all.val->size() == 0);
  CHECK(all.val->n_docs() == 0);
  o.val_fraction = 1.0;
  CHECK_THROWS_WITH(prepare_text(text, "one.txt", o), Catch::Contains("val_fraction 1"));
  CHECK_THROWS_WITH(prepare_text("", "empty.txt", PrepareOptions{}), Catch::Contains("empty.txt is empty"));
}

TEST_CASE("a prepared dataset round-trips through HDF5 with its attributes", "[data][dataset][h5]") {
  TempDir dir;
  const std::string txt = dir / "story.txt", out = dir / "story.h5";
  write_file(txt, "Once upon a time.\n\nThere was a cat.\n\nIt sat. ✓\n\nThe end.\n");
  PrepareOptions o;
  o.tokenizer = TokenizerKind::character;
  o.separator = DocSeparator::blank_line;
  o.val_fraction = 0.25;
  const Dataset ds = prepare_dataset(txt, out, o);
  CHECK(ds.prepared_now);
  CHECK_FALSE(fs::exists(out + ".tmp"));
  const Dataset mem = prepare_text(read_bytes(txt), "story.txt", o);
  const Dataset back = load_dataset(out);
  CHECK(back.train->tokens == mem.train->tokens);
  CHECK(back.train->doc_offsets == mem.train->doc_offsets);
  CHECK(back.val->tokens == mem.val->tokens);
  CHECK(back.val->doc_offsets == mem.val->doc_offsets);
  CHECK(back.val->n_docs() == 1);
  CHECK(back.tokenizer->serialize() == mem.tokenizer->serialize());
  CHECK(back.source == "story.txt");
  CHECK(back.split == "documents");

  const h5::File f = h5::File::open(out);
  CHECK(f.attr_string("/", "format") == "qkv-dataset");
  CHECK(f.attr_int("/", "format_version") == 1);
  CHECK(f.attr_string("/", "tokenizer") == "char");
  CHECK(f.attr_int("/", "vocab_size") == back.tokenizer->vocab_size());
  CHECK(f.attr_string("/", "separator") == "blank_line");
  CHECK(f.attr_double("/", "val_fraction") == 0.25);
  CHECK(f.info("/train/tokens").type == "int32");
  CHECK(f.info("/val/doc_offsets").type == "int64");
  CHECK(f.attr_string("/tokenizer", "kind") == "char");
}

TEST_CASE("damaged or foreign dataset files are rejected naming the file and the item", "[data][dataset][h5]") {
  TempDir dir;
  const std::string good = dir / "good.h5";
  std::vector<int32_t> tokens(4000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7 + 3) % 256);
  write_manual(good, tokens);
  REQUIRE(load_dataset(good).train->tokens == tokens);

  SECTION("missing file") {
    CHECK_THROWS_WITH(load_dataset(dir / "nope.h5"), Catch::Contains("nope.h5: file not found"));
  }
  SECTION("not HDF5") {
    write_file(dir / "text.h5", "just text\n");
    CHECK_THROWS_WITH(load_dataset(dir / "text.h5"), Catch::Contains("text.h5: not an HDF5 file"));
  }
  SECTION("truncated") {
    const std::string bytes = read_bytes(good);
    write_file(dir / "cut.h5", bytes.substr(0, bytes.size() / 2));
    CHECK_THROWS_WITH(load_dataset(dir / "cut.h5"), Catch::Contains("cut.h5") && Catch::Contains("truncated"));
  }
  SECTION("flipped byte in the token data fails its checksum") {
    std::string bytes = read_bytes(good);
    const std::string needle(reinterpret_cast<const char*>(tokens.data() + 100), 64);
    const size_t at = bytes.find(needle);
    REQUIRE(at != std::string::npos);
    bytes[at + 10] ^= 0x01;
    write_file(dir / "flip.h5", bytes);
    CHECK_THROWS_WITH(load_dataset(dir / "flip.h5"),
                      Catch::Contains("flip.h5") && Catch::Contains("/train/tokens") && Catch::Contains("checksum"));
  }
  SECTION("another format") {
    write_manual(dir / "ckpt.h5", tokens, "qkv-checkpoint");
    CHECK_THROWS_WITH(load_dataset(dir / "ckpt.h5"), Catch::Contains("not a qkv dataset (format is 'qkv-checkpoint'"));
  }
  SECTION("missing dataset") {
    write_manual(dir / "noval.h5", tokens, "qkv-dataset", false);
    CHECK_THROWS_WITH(load_dataset(dir / "noval.h5"), Catch::Contains("noval.h5: dataset /val/tokens is missing"));
  }
  SECTION("wrong type") {
    write_manual(dir / "float.h5", tokens, "qkv-dataset", true, true);
    CHECK_THROWS_WITH(load_dataset(dir / "float.h5"),
                      Catch::Contains("/train/tokens has type float32, expected int32"));
  }
  SECTION("id outside the vocabulary") {
    write_manual(dir / "oov.h5", {5, 6, 300, 7});
    CHECK_THROWS_WITH(
        load_dataset(dir / "oov.h5"),
        Catch::Contains("oov.h5") &&
            Catch::Contains("token 300 at position 2 of /train/tokens is outside the vocabulary [0, 256)"));
  }
}

TEST_CASE("load_or_prepare caches a text file and prepares again when it changes", "[data][dataset]") {
  TempDir dir;
  const std::string txt = dir / "corpus.txt";
  write_file(txt, fortune_text(30));
  PrepareOptions o;
  o.separator = DocSeparator::percent_line;
  const Dataset a = load_or_prepare(txt, o);
  CHECK(a.prepared_now);
  const std::string cache = dir / "corpus.txt.byte.h5";
  CHECK(a.path == cache);
  CHECK(fs::exists(cache));
  const Dataset b = load_or_prepare(txt, o);
  CHECK_FALSE(b.prepared_now);
  CHECK(b.train->tokens == a.train->tokens);

  // Newer text of the same size (the cache made two seconds before it): prepared again.
  std::string upper = fortune_text(30);
  for (size_t p = upper.find("doc"); p != std::string::npos; p = upper.find("doc", p)) upper.replace(p, 3, "DOC");
  write_file(txt, upper);
  fs::last_write_time(cache, fs::last_write_time(txt) - std::chrono::seconds(2));
  const Dataset c = load_or_prepare(txt, o);
  CHECK(c.prepared_now);
  CHECK(c.tokenizer->decode(c.train->doc(0)).substr(0, 3) == "DOC");
  // A different size is noticed even when the cache looks newer.
  write_file(txt, fortune_text(40));
  fs::last_write_time(cache, fs::last_write_time(txt) + std::chrono::seconds(2));
  const Dataset c2 = load_or_prepare(txt, o);
  CHECK(c2.prepared_now);
  CHECK(c2.train->n_docs() + c2.val->n_docs() == 40);
  // Different options: prepared again; same options: cached.
  o.val_fraction = 0.5;
  CHECK(load_or_prepare(txt, o).prepared_now);
  CHECK_FALSE(load_or_prepare(txt, o).prepared_now);

  // A prepared file is used as it is, and must match the requested tokenizer.
  CHECK(load_or_prepare(cache, o).train->tokens == load_dataset(cache).train->tokens);
  o.tokenizer = TokenizerKind::character;
  CHECK_THROWS_WITH(load_or_prepare(cache, o),
                    Catch::Contains("prepared with the byte tokenizer, but data.tokenizer is char"));
  // An explicit cache directory.
  fs::create_directories(dir.path / "cache");
  const Dataset d = load_or_prepare(txt, o, dir / "cache");
  CHECK(d.path == dir / "cache/corpus.txt.char.h5");
  CHECK(d.tokenizer->kind() == std::string("char"));
  // No tokenizer asked for: a prepared file is taken with whichever it holds, and a text file is
  // tokenized (here: found cached) with byte.
  PrepareOptions any = o;
  any.tokenizer.reset();
  CHECK(load_or_prepare(d.path, any).tokenizer->kind() == std::string("char"));
  CHECK(load_or_prepare(cache, any).tokenizer->kind() == std::string("byte"));
  const Dataset e = load_or_prepare(txt, any);
  CHECK(e.path == cache);
  CHECK_FALSE(e.prepared_now);
  CHECK_THROWS_WITH(load_or_prepare(dir / "missing.txt", o),
                    Catch::Contains("data file not found") && Catch::Contains("missing.txt"));
}

TEST_CASE("eval tokens come from a whole text file or a prepared file with the same tokenizer", "[data][dataset]") {
  TempDir dir;
  const std::string txt = dir / "e.txt";
  write_file(txt, "hello eval\n");
  ByteTokenizer byte;
  const std::vector<int32_t> ids = load_eval_tokens(txt, byte);
  CHECK(byte.decode(ids) == "hello eval\n");
  const Dataset ds = prepare_dataset(txt, dir / "e.h5", PrepareOptions{});
  std::vector<int32_t> both = ds.train->tokens;
  both.insert(both.end(), ds.val->tokens.begin(), ds.val->tokens.end());
  CHECK(load_eval_tokens(dir / "e.h5", byte) == both);
  auto chr = CharTokenizer::train("hello eval\n");
  CHECK_THROWS_WITH(load_eval_tokens(dir / "e.h5", *chr), Catch::Contains("different"));
  auto small = CharTokenizer::train("helo");
  CHECK_THROWS_WITH(load_eval_tokens(txt, *small), Catch::Contains("e.txt") && Catch::Contains("' ' (U+0020)"));
}

TEST_CASE("the HDF5 helper round-trips tensors, strings and attributes and names mismatches", "[data][h5]") {
  TempDir dir;
  const std::string path = dir / "t.h5";
  Tensor a = Tensor::empty({2, 3, 4}, DType::f32);
  for (int i = 0; i < 24; ++i) a.data<float>()[i] = 0.5f * static_cast<float>(i) - 3.0f;
  Tensor s = Tensor::empty({}, DType::f64);
  s.data<double>()[0] = 2.718281828459045;
  {
    h5::File f = h5::File::create(path);
    f.write_tensor("/model/w", a);
    f.write_tensor("/model/t", a.transpose(0, 2));  // written contiguous, shape [4,3,2]
    f.write_tensor("/scalar", s);
    f.write("/ids", std::vector<int64_t>{1, -2, 3});
    f.write("/empty", std::vector<float>{});
    f.write_string("/config", "[model]\nname = \"ünï\"\n");
    f.set_attr("/", "step", int64_t{42});
    f.set_attr("/model", "lr", 3e-4);
    f.set_attr("/model", "family", "gpt2");
    f.close();
  }
  const h5::File f = h5::File::open(path);
  const Tensor w = f.read_tensor("model/w");
  REQUIRE(w.shape() == Shape{2, 3, 4});
  for (int i = 0; i < 24; ++i) CHECK(w.data<float>()[i] == a.data<float>()[i]);
  const Tensor t = f.read_tensor("/model/t");
  REQUIRE(t.shape() == Shape{4, 3, 2});
  CHECK(t.at({3, 1, 0}) == a.at({0, 1, 3}));
  CHECK(f.read_tensor("/scalar").item() == 2.718281828459045);
  CHECK(f.read<int64_t>("/ids") == std::vector<int64_t>{1, -2, 3});
  CHECK(f.read<float>("/empty").empty());
  CHECK(f.read_string("/config") == "[model]\nname = \"ünï\"\n");
  CHECK(f.attr_int("/", "step") == 42);
  CHECK(f.attr_double("/model", "lr") == 3e-4);
  CHECK(f.attr_string("/model", "family") == "gpt2");
  CHECK(f.children("/model") == std::vector<std::string>{"t", "w"});
  CHECK(f.has("/model/w"));
  CHECK_FALSE(f.has("/model/w/x"));
  CHECK_FALSE(f.has("/nothing/here"));
  CHECK_THROWS_WITH(f.read<int32_t>("/model/w"),
                    Catch::Contains("t.h5: dataset /model/w has type float32, expected int32"));
  CHECK_THROWS_WITH(f.read_shaped<float>("/model/w", {3, 2, 4}),
                    Catch::Contains("has shape [2,3,4], expected [3,2,4]"));
  CHECK_THROWS_WITH(f.read_tensor("/model/missing"), Catch::Contains("dataset /model/missing is missing"));
  CHECK_THROWS_WITH(f.attr_int("/model", "family"), Catch::Contains("attribute 'family' of /model has type string"));
  CHECK_THROWS_WITH(f.attr_string("/", "nope"), Catch::Contains("attribute 'nope' is missing on /"));
  CHECK_THROWS_WITH(f.info("/model"), Catch::Contains("/model is not a dataset"));
}

TEST_CASE("an atomic write that fails midway leaves the previous file intact", "[data][h5]") {
  TempDir dir;
  const std::string path = dir / "ckpt.h5";
  {
    h5::AtomicWriter w(path);
    w.file().write("/v", std::vector<int32_t>{1, 2, 3});
    w.commit();
  }
  std::string tmp;
  try {
    h5::AtomicWriter w(path);
    w.file().write("/v", std::vector<int32_t>{9, 9, 9, 9});
    tmp = w.temp_path();
    CHECK(fs::exists(tmp));
    throw Error("simulated crash before commit");
  } catch (const Error&) {}
  CHECK_FALSE(fs::exists(tmp));
  CHECK(h5::File::open(path).read<int32_t>("/v") == std::vector<int32_t>{1, 2, 3});
  CHECK_THROWS_WITH(h5::File::create(dir / "no/such/dir/x.h5"), Catch::Contains("does not exist"));
}

TEST_CASE("Debian's fortunes file prepares into one document per fortune", "[data][dataset][fortunes]") {
  const std::string path = "/usr/share/games/fortunes/fortunes";
  if (!fs::exists(path)) {
    WARN("skipped: " << path << " is not installed (package fortunes-min)");
    return;
  }
  const std::string text = read_bytes(path);
  int64_t percent_lines = 0;
  for (size_t p = 0; (p = text.find("\n%\n", p)) != std::string::npos; ++p) ++percent_lines;
  REQUIRE(text.size() >= 2);
  REQUIRE(text.substr(text.size() - 2) == "%\n");  // every fortune, the last too, ends with a % line
  PrepareOptions o;
  o.separator = DocSeparator::percent_line;
  o.dedupe = false;
  const Dataset ds = prepare_text(text, "fortunes", o);
  CHECK(ds.train->n_docs() + ds.val->n_docs() == percent_lines);
  CHECK(ds.val->n_docs() == std::llround(0.1 * static_cast<double>(percent_lines)));
  CHECK(ds.train->size() + ds.val->size() == static_cast<int64_t>(text.size()));  // byte tokens: the file itself
  for (const TokenSplit* s : {ds.train.get(), ds.val.get()})
    for (int64_t d = 0; d < s->n_docs(); ++d) {
      const std::string doc = ds.tokenizer->decode(s->doc(d));
      CHECK(doc.substr(doc.size() - 3) == "\n%\n");
      CHECK(doc.find("\n%\n") == doc.size() - 3);
    }
}
