// Document splitting, train/val splitting, and the prepared-dataset file (see data/dataset.h).
#include "data/dataset.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <unordered_set>

#include "data/h5.h"
#include "data/h5_atomic.h"
#include "data/input_file.h"
#include "data/utf8.h"
#include "tensor/error.h"
#include "tensor/philox.h"

namespace qkv {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "qkv-dataset";
constexpr int64_t kFormatVersion = 1;
constexpr uint32_t kSplitStream = 0x73706c74u;  // "splt": keeps these draws apart from other Philox uses

bool only_whitespace(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; });
}

// Calls fn(line_begin, line_end_without_newline, next_line_begin) for every line of `text`.
template <class Fn>
void for_each_line(std::string_view text, Fn&& fn) {
  size_t i = 0;
  while (i < text.size()) {
    const size_t nl = text.find('\n', i);
    const size_t end = nl == std::string_view::npos ? text.size() : nl;
    const size_t next = nl == std::string_view::npos ? text.size() : nl + 1;
    fn(i, end, next);
    i = next;
  }
}

std::string absolute_path(const std::string& p) {
  std::error_code ec;
  const fs::path abs = fs::weakly_canonical(fs::absolute(p), ec);
  return ec ? p : abs.string();
}

}  // namespace

DocSeparator parse_separator(std::string_view name) {
  if (const DocSeparator* sep = find_choice(kDocSeparators, name)) return *sep;
  fail("[data] unknown document separator '", name, "' (expected ", names_or(kDocSeparators), ")");
}

const char* separator_name(DocSeparator sep) { return choice_name(kDocSeparators, sep).data(); }

std::vector<std::string_view> split_documents(std::string_view text, DocSeparator sep) {
  std::vector<std::string_view> docs;
  const auto push = [&](size_t b, size_t e) {
    if (e > b && !only_whitespace(text.substr(b, e - b))) docs.push_back(text.substr(b, e - b));
  };
  if (sep == DocSeparator::none) {
    push(0, text.size());
  } else if (sep == DocSeparator::blank_line) {
    size_t start = 0;
    bool open = false;
    for_each_line(text, [&](size_t b, size_t e, size_t) {
      const bool blank = only_whitespace(text.substr(b, e - b));
      if (blank && open) push(start, b);
      if (!blank && !open) start = b;
      open = !blank;
    });
    if (open) push(start, text.size());
  } else {
    size_t start = 0;
    for_each_line(text, [&](size_t b, size_t e, size_t next) {
      const std::string_view line = text.substr(b, e - b);
      if (line == "%" || line == "%\r") {
        push(start, b);
        start = next;
      }
    });
    push(start, text.size());
  }
  return docs;
}

std::string document_text(std::string_view body, DocSeparator sep, bool keep_separator) {
  std::string s(body);
  if (!keep_separator || sep == DocSeparator::none) return s;
  if (s.empty() || s.back() != '\n') s.push_back('\n');
  s += sep == DocSeparator::blank_line ? "\n" : "%\n";
  return s;
}

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("[data] file not found: ", path);
  return read_input_file(path, kTextCorpusCap, "a text corpus");
}

Dataset prepare_text(std::string_view text, const std::string& name, const PrepareOptions& opts) {
  QKV_CHECK(opts.val_fraction >= 0.0 && opts.val_fraction < 1.0, "[prepare] val_fraction ", opts.val_fraction,
            " is outside [0, 1)");
  QKV_CHECK(!text.empty(), "[prepare] ", name, " is empty");
  const std::vector<std::string_view> bodies = split_documents(text, opts.separator);
  QKV_CHECK(!bodies.empty(), "[prepare] ", name, " has no documents (only whitespace)");

  std::vector<std::string> docs;
  docs.reserve(bodies.size());
  size_t total = 0;
  std::unordered_set<std::string_view> seen;
  int64_t dropped = 0;
  for (std::string_view b : bodies) {
    if (opts.dedupe && !seen.insert(b).second) {
      ++dropped;
      continue;
    }
    docs.push_back(document_text(b, opts.separator, opts.keep_separator));
    total += docs.back().size();
  }
  std::string corpus;
  corpus.reserve(total);
  for (const std::string& d : docs) corpus += d;
  std::shared_ptr<const Tokenizer> tok = opts.given ? opts.given
                                                    : make_tokenizer(opts.tokenizer.value_or(TokenizerKind::byte),
                                                                     corpus, TokenizerOptions{opts.bpe_vocab_size});

  const std::vector<std::vector<int32_t>> ids = tok->encode_each(docs);

  auto train = std::make_shared<TokenSplit>();
  auto val = std::make_shared<TokenSplit>();
  train->name = name + ":train";
  val->name = name + ":val";
  train->doc_offsets = {0};
  val->doc_offsets = {0};
  const auto append = [](TokenSplit& s, std::span<const int32_t> t) {
    s.tokens.insert(s.tokens.end(), t.begin(), t.end());
    s.doc_offsets.push_back(s.size());
  };

  const auto n_docs = static_cast<int64_t>(docs.size());
  const int64_t val_docs = std::llround(opts.val_fraction * static_cast<double>(n_docs));
  const bool by_documents = n_docs >= 2 && val_docs >= 1;
  if (by_documents) {
    // Documents ranked by a keyed hash of their index: the first val_docs of that order are val.
    std::vector<std::pair<uint64_t, int64_t>> rank(docs.size());
    const auto k0 = static_cast<uint32_t>(opts.split_seed), k1 = static_cast<uint32_t>(opts.split_seed >> 32);
    for (int64_t d = 0; d < n_docs; ++d) {
      const Philox4 r =
          philox4x32_10(static_cast<uint32_t>(d), static_cast<uint32_t>(d >> 32), 0, kSplitStream, k0, k1);
      rank[d] = {(static_cast<uint64_t>(r.v[0]) << 32) | r.v[1], d};
    }
    std::sort(rank.begin(), rank.end());
    std::vector<char> is_val(docs.size(), 0);
    for (int64_t i = 0; i < std::min(val_docs, n_docs - 1); ++i) is_val[rank[i].second] = 1;
    for (int64_t d = 0; d < n_docs; ++d) append(is_val[d] ? *val : *train, ids[d]);
  } else {
    // Too few documents: the last val_fraction of the token stream is val; a document crossing
    // the cut is split in two.
    int64_t n = 0;
    for (const auto& v : ids) n += static_cast<int64_t>(v.size());
    const int64_t cut = n - std::llround(opts.val_fraction * static_cast<double>(n));
    int64_t pos = 0;
    for (const auto& v : ids) {
      const auto len = static_cast<int64_t>(v.size());
      const std::span<const int32_t> all(v);
      if (pos + len <= cut) {
        append(*train, all);
      } else if (pos >= cut) {
        append(*val, all);
      } else {
        append(*train, all.subspan(0, static_cast<size_t>(cut - pos)));
        append(*val, all.subspan(static_cast<size_t>(cut - pos)));
      }
      pos += len;
    }
  }
  Dataset ds;
  ds.source = name;
  ds.source_bytes = static_cast<int64_t>(text.size());
  ds.split = by_documents ? "documents" : "tokens";
  ds.duplicates_dropped = dropped;
  ds.tokenizer = std::move(tok);
  ds.train = std::move(train);
  ds.val = std::move(val);
  return ds;
}

void save_dataset(const Dataset& ds, const std::string& out_h5, const PrepareOptions& opts) {
  h5::AtomicWriter w(out_h5);
  h5::File& f = w.file();
  f.set_attr("/", "format", kFormat);
  f.set_attr("/", "format_version", kFormatVersion);
  f.set_attr("/", "tokenizer", std::string(ds.tokenizer->kind()));
  f.set_attr("/", "vocab_size", static_cast<int64_t>(ds.tokenizer->vocab_size()));
  f.set_attr("/", "source", ds.source);
  f.set_attr("/", "source_bytes", ds.source_bytes);
  f.set_attr("/", "separator", std::string(separator_name(opts.separator)));
  f.set_attr("/", "keep_separator", static_cast<int64_t>(opts.keep_separator));
  f.set_attr("/", "val_fraction", opts.val_fraction);
  f.set_attr("/", "split_seed", static_cast<int64_t>(opts.split_seed));
  f.set_attr("/", "bpe_vocab_size", static_cast<int64_t>(opts.bpe_vocab_size));
  // Whether bpe_vocab_size built the tokenizer (a given one, `prepare --tokenizer-from`, ignores it).
  f.set_attr("/", "bpe_trained", static_cast<int64_t>(!opts.given && ds.tokenizer->kind() == std::string_view("bpe")));
  f.set_attr("/", "split", ds.split);
  f.set_attr("/", "dedupe", static_cast<int64_t>(opts.dedupe));
  f.set_attr("/", "duplicates_dropped", ds.duplicates_dropped);
  f.set_attr("/", "source_path", ds.source_path);
  for (const TokenSplit* s : {ds.train.get(), ds.val.get()}) {
    const std::string g = s == ds.train.get() ? "/train" : "/val";
    f.write(g + "/tokens", s->tokens);
    f.write(g + "/doc_offsets", s->doc_offsets);
  }
  save_tokenizer(f, "/tokenizer", *ds.tokenizer);
  w.commit();
}

Dataset prepare_dataset(const std::string& text_path, const std::string& out_h5, const PrepareOptions& opts) {
  const std::string text = read_text_file(text_path);
  QKV_CHECK(!text.empty(), "[prepare] ", text_path, " is empty");
  Dataset ds = prepare_text(text, fs::path(text_path).filename().string(), opts);
  // Both said on stderr, since each is a result other than the one asked for or expected.
  const TokenizerKind kind = opts.tokenizer.value_or(TokenizerKind::byte);
  if (!opts.given && kind == TokenizerKind::character)
    if (const size_t at = first_non_text_byte(text); at != std::string_view::npos)
      std::fprintf(stderr,
                   "qkv: note: %s is not UTF-8 text: byte 0x%02X at byte offset %zu; the char tokenizer keeps each "
                   "byte outside a UTF-8 character as a token of its own, so the file round-trips exactly\n",
                   text_path.c_str(), static_cast<unsigned char>(text[at]), at);
  const int32_t reached = ds.tokenizer->vocab_size();
  if (!opts.given && kind == TokenizerKind::bpe && reached < opts.bpe_vocab_size)
    std::fprintf(stderr,
                 "qkv: warning: %s: asked for a BPE vocabulary of %d tokens, the corpus gives %d (no pair of tokens "
                 "occurs twice past that); the vocabulary has %d tokens\n",
                 text_path.c_str(), opts.bpe_vocab_size, reached, reached);
  ds.source_path = absolute_path(text_path);
  ds.source_bytes = static_cast<int64_t>(text.size());
  save_dataset(ds, out_h5, opts);
  Dataset loaded = load_dataset(out_h5);
  loaded.prepared_now = true;
  return loaded;
}

namespace {

void read_split(const h5::File& f, const std::string& group, int32_t vocab, TokenSplit& s) {
  Shape shape;
  s.name = f.path() + ":" + group.substr(1);
  s.tokens = f.read<int32_t>(group + "/tokens", &shape);
  if (shape.size() != 1) f.fail("dataset ", group, "/tokens has shape ", shape_str(shape), ", expected 1-d");
  s.doc_offsets = f.read<int64_t>(group + "/doc_offsets", &shape);
  if (shape.size() != 1 || shape[0] < 1)
    f.fail("dataset ", group, "/doc_offsets has shape ", shape_str(shape), ", expected [docs+1]");
  const auto& off = s.doc_offsets;
  if (off.front() != 0 || off.back() != s.size())
    f.fail(group, "/doc_offsets runs from ", off.front(), " to ", off.back(), " but ", group, "/tokens has ", s.size(),
           " tokens");
  for (size_t i = 1; i < off.size(); ++i)
    if (off[i] < off[i - 1]) f.fail(group, "/doc_offsets decreases at entry ", i);
  for (size_t i = 0; i < s.tokens.size(); ++i)
    if (s.tokens[i] < 0 || s.tokens[i] >= vocab)
      f.fail("token ", s.tokens[i], " at position ", i, " of ", group, "/tokens is outside the vocabulary [0, ", vocab,
             ")");
}

}  // namespace

Dataset load_dataset(const std::string& h5_path) {
  const h5::File f = h5::File::open(h5_path);
  if (!f.has_attr("/", "format")) f.fail("not a qkv dataset (root attribute 'format' is missing)");
  const std::string format = f.attr_string("/", "format");
  if (format != kFormat) f.fail("not a qkv dataset (format is '", format, "', expected '", kFormat, "')");
  const int64_t version = f.attr_int("/", "format_version");
  if (version != kFormatVersion)
    f.fail("dataset format_version ", version, " is not supported (this build reads ", kFormatVersion, ")");
  Dataset ds;
  ds.path = h5_path;
  ds.source = f.attr_string("/", "source");
  ds.source_path = f.has_attr("/", "source_path") ? f.attr_string("/", "source_path") : "";
  ds.source_bytes = f.has_attr("/", "source_bytes") ? f.attr_int("/", "source_bytes") : 0;
  ds.split = f.has_attr("/", "split") ? f.attr_string("/", "split") : "";
  ds.duplicates_dropped = f.has_attr("/", "duplicates_dropped") ? f.attr_int("/", "duplicates_dropped") : 0;
  ds.val_fraction = f.has_attr("/", "val_fraction") ? f.attr_double("/", "val_fraction") : -1;
  ds.bpe_vocab_size =
      f.has_attr("/", "bpe_trained") && f.attr_int("/", "bpe_trained") == 1 ? f.attr_int("/", "bpe_vocab_size") : 0;
  ds.tokenizer = load_tokenizer(f, "/tokenizer");
  const std::string kind = f.attr_string("/", "tokenizer");
  if (kind != ds.tokenizer->kind())
    f.fail("root attribute tokenizer='", kind, "' but /tokenizer holds a ", ds.tokenizer->kind(), " tokenizer");
  const int64_t vocab = f.attr_int("/", "vocab_size");
  if (vocab != ds.tokenizer->vocab_size())
    f.fail("root attribute vocab_size=", vocab, " but the tokenizer has ", ds.tokenizer->vocab_size(), " tokens");
  auto train = std::make_shared<TokenSplit>();
  auto val = std::make_shared<TokenSplit>();
  read_split(f, "/train", ds.tokenizer->vocab_size(), *train);
  read_split(f, "/val", ds.tokenizer->vocab_size(), *val);
  ds.train = std::move(train);
  ds.val = std::move(val);
  return ds;
}

std::string dataset_cache_path(const std::string& text_path, TokenizerKind tokenizer, const std::string& cache_dir) {
  const fs::path text(text_path);
  const std::string name = text.filename().string() + "." + tokenizer_kind_name(tokenizer) + ".h5";
  if (!cache_dir.empty()) return (fs::path(cache_dir) / name).string();
  const fs::path dir = text.parent_path().empty() ? fs::path(".") : text.parent_path();
  if (::access(dir.c_str(), W_OK) == 0) return (dir / name).string();
  fs::path home;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) home = fs::path(x) / "qkv";
  else if (const char* h = std::getenv("HOME"); h && *h) home = fs::path(h) / ".cache" / "qkv";
  else home = fs::temp_directory_path() / "qkv-cache";
  return (home / name).string();
}

namespace {

// True when the cached preparation at `cache` was made from this text with these options
// (`opts.tokenizer` is set).
bool cache_is_fresh(const std::string& cache, const std::string& text_path, const PrepareOptions& opts) {
  std::error_code ec;
  if (!fs::exists(cache, ec)) return false;
  if (fs::last_write_time(cache, ec) < fs::last_write_time(text_path, ec) || ec) return false;
  try {
    const h5::File f = h5::File::open(cache);
    return f.attr_string("/", "format") == kFormat && f.attr_int("/", "format_version") == kFormatVersion &&
           f.attr_string("/", "tokenizer") == tokenizer_kind_name(*opts.tokenizer) &&
           f.attr_int("/", "source_bytes") == static_cast<int64_t>(fs::file_size(text_path, ec)) && !ec &&
           f.attr_string("/", "source_path") == absolute_path(text_path) &&
           f.attr_string("/", "separator") == separator_name(opts.separator) &&
           f.attr_int("/", "keep_separator") == static_cast<int64_t>(opts.keep_separator) &&
           f.attr_int("/", "dedupe") == static_cast<int64_t>(opts.dedupe) &&
           f.attr_double("/", "val_fraction") == opts.val_fraction &&
           f.attr_int("/", "split_seed") == static_cast<int64_t>(opts.split_seed) &&
           (*opts.tokenizer != TokenizerKind::bpe || f.attr_int("/", "bpe_vocab_size") == opts.bpe_vocab_size);
  } catch (const Error&) {
    return false;  // unreadable or incomplete cache: prepare again
  }
}

}  // namespace

Dataset load_or_prepare(const std::string& path, const PrepareOptions& opts, const std::string& cache_dir) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("[data] data file not found: ", path);
  // A FIFO, device or directory is refused before anything opens it (a FIFO nobody writes to
  // would block the reader; a device never ends).
  require_regular_file(path, "a data file");
  if (h5::is_hdf5(path)) {
    Dataset ds = load_dataset(path);
    if (opts.tokenizer && tokenizer_kind_name(*opts.tokenizer) != std::string_view(ds.tokenizer->kind()))
      fail("[data] ", path, " was prepared with the ", ds.tokenizer->kind(), " tokenizer, but data.tokenizer is ",
           tokenizer_kind_name(*opts.tokenizer));
    // The file's split and vocabulary are fixed: a run that asks for others would record settings
    // it did not train with.
    if (opts.tokenizer && ds.val_fraction >= 0 && ds.val_fraction != opts.val_fraction)
      fail("[data] ", path, " was prepared with val_fraction ", ds.val_fraction, ", but data.val_fraction is ",
           opts.val_fraction, " (a prepared file's split is fixed: set it to ", ds.val_fraction, " or prepare again)");
    if (opts.tokenizer == TokenizerKind::bpe && ds.bpe_vocab_size > 0 && ds.bpe_vocab_size != opts.bpe_vocab_size)
      fail("[data] ", path, " was prepared with bpe_vocab_size ", ds.bpe_vocab_size, ", but data.bpe_vocab_size is ",
           opts.bpe_vocab_size, " (set it to ", ds.bpe_vocab_size, " or prepare again)");
    return ds;
  }
  PrepareOptions o = opts;
  o.tokenizer = o.tokenizer.value_or(TokenizerKind::byte);
  const std::string cache = dataset_cache_path(path, *o.tokenizer, cache_dir);
  if (cache_is_fresh(cache, path, o)) {
    try {
      return load_dataset(cache);
    } catch (const Error&) {
      // a damaged cache is rebuilt below
    }
  }
  const fs::path dir = fs::path(cache).parent_path();
  if (!dir.empty()) fs::create_directories(dir, ec);
  return prepare_dataset(path, cache, o);
}

std::vector<int32_t> load_eval_tokens(const std::string& path, const Tokenizer& tok) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("[data] file not found: ", path);
  require_regular_file(path, "a data file");
  if (h5::is_hdf5(path)) {
    const Dataset ds = load_dataset(path);
    if (ds.tokenizer->serialize() != tok.serialize())
      fail("[data] ", path, " was tokenized with a different ", ds.tokenizer->kind(), " tokenizer (",
           ds.tokenizer->vocab_size(), " tokens) than the model's ", tok.kind(), " tokenizer (", tok.vocab_size(),
           " tokens)");
    std::vector<int32_t> out = ds.train->tokens;
    out.insert(out.end(), ds.val->tokens.begin(), ds.val->tokens.end());
    return out;
  }
  const std::string text = read_text_file(path);
  QKV_CHECK(!text.empty(), "[data] ", path, " is empty");
  try {
    return tok.encode(text);
  } catch (const Error& e) { fail("[data] ", path, ": ", e.what()); }
}

}  // namespace qkv
