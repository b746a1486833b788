// Corpora as token streams: document splitting, the prepared-dataset HDF5 file, and loading.
//
// A prepared dataset (`qkv prepare`, or `data.path` pointing at a text file) is one HDF5 file:
//   root attributes  format = "qkv-dataset", format_version, tokenizer (kind), vocab_size,
//                    source (text file name), source_bytes, separator, keep_separator,
//                    val_fraction, split_seed, split ("documents" | "tokens"), bpe_vocab_size,
//                    dedupe, duplicates_dropped, source_path
//   /train/tokens        int32 [n]        token ids of the training split, documents back to back
//   /train/doc_offsets   int64 [docs+1]   document d is tokens[doc_offsets[d] : doc_offsets[d+1]]
//   /val/tokens, /val/doc_offsets         the same for the validation split
//   /tokenizer           the tokenizer (data/tokenizer.h: save_tokenizer)
// Files are written atomically (a unique temporary, flush, rename) and checked on load: a wrong format
// attribute, a missing or mistyped dataset, inconsistent offsets, an id outside the vocabulary,
// or a truncated/corrupt file each give one line naming the file and the item.
//
// Train/val split: with several documents, a seeded random choice of round(val_fraction · docs)
// whole documents goes to val (the rest, in file order, to train), so no document straddles the
// split; with a single document (or too few to give val one), the last val_fraction of the
// tokens is val, as nanoGPT does. Tokenizers (char vocabulary, BPE merges) are built from the
// whole corpus, so val text always encodes.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"
#include "tensor/choice.h"

namespace qkv {

// How a corpus is cut into documents:
//   blank_line    documents are separated by one or more blank lines (empty or only spaces/tabs)
//   percent_line  documents are separated by lines that are exactly "%" (fortune files)
//   none          the whole text is one document
enum class DocSeparator { blank_line, percent_line, none };
// The one table of their spellings: `qkv prepare --separator`, the config key data.separator and
// the "separator" attribute of a prepared dataset all read and write these names.
inline constexpr std::array kDocSeparators = {Choice<DocSeparator>{"blank_line", DocSeparator::blank_line},
                                              Choice<DocSeparator>{"percent_line", DocSeparator::percent_line},
                                              Choice<DocSeparator>{"none", DocSeparator::none}};
DocSeparator parse_separator(std::string_view name);  // a name in kDocSeparators
const char* separator_name(DocSeparator sep);

// The documents of `text`, each a view of its lines with their line ends (separator lines and
// blank lines left out; documents of only whitespace dropped).
std::vector<std::string_view> split_documents(std::string_view text, DocSeparator sep);

// The text a document is tokenized as: with keep_separator, the body gets a final newline (if it
// lacks one) and the separator's own text ("\n" for blank_line, "%\n" for percent_line), so the
// token stream reads like the original file and every document ends the same way (an end marker
// the model can learn and padded/packed rows can show).
std::string document_text(std::string_view body, DocSeparator sep, bool keep_separator);

struct TokenSplit {
  std::string name;  // "PATH:train", for messages
  std::vector<int32_t> tokens;
  std::vector<int64_t> doc_offsets;  // n_docs()+1 entries from 0 to tokens.size()
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  int64_t n_docs() const { return static_cast<int64_t>(doc_offsets.size()) - 1; }
  std::span<const int32_t> doc(int64_t d) const {
    return {tokens.data() + doc_offsets[d], static_cast<size_t>(doc_offsets[d + 1] - doc_offsets[d])};
  }
};

struct Dataset {
  std::string path;         // the .h5 file
  std::string source;       // the text file it was prepared from (file name only)
  std::string source_path;  // ... its absolute path, and its size in bytes
  int64_t source_bytes = 0;
  std::string split;               // how train/val were split: "documents" or "tokens"
  int64_t duplicates_dropped = 0;  // documents removed by PrepareOptions::dedupe
  double val_fraction = -1;        // PrepareOptions::val_fraction it was prepared with (-1: not recorded)
  int64_t bpe_vocab_size = 0;  // PrepareOptions::bpe_vocab_size that built its bpe tokenizer (0: none, or not recorded)
  std::shared_ptr<const Tokenizer> tokenizer;
  std::shared_ptr<const TokenSplit> train, val;
  bool prepared_now = false;  // load_or_prepare: true when the text was (re)tokenized by this call
};

struct PrepareOptions {
  // The kind to build from the corpus (gpt2_bpe is refused: use `given`). Unset: a prepared .h5
  // may hold any tokenizer, and text is tokenized with byte.
  std::optional<TokenizerKind> tokenizer = TokenizerKind::byte;
  int32_t bpe_vocab_size = 512;
  DocSeparator separator = DocSeparator::none;
  bool keep_separator = true;
  bool dedupe = true;          // drop documents whose text repeats an earlier one (fortune
                               // files repeat some), so no val document is also in train
  double val_fraction = 0.1;   // in [0, 1)
  uint64_t split_seed = 1337;  // which documents go to val
  // When set, text is tokenized with this tokenizer instead of one built from the corpus (a
  // gpt2_bpe tokenizer from `qkv import`: `qkv prepare --tokenizer-from`); `tokenizer` is ignored.
  std::shared_ptr<const Tokenizer> given;
};

// Tokenizes `text_path` into a prepared dataset at `out_h5` (atomically) and returns it loaded.
Dataset prepare_dataset(const std::string& text_path, const std::string& out_h5, const PrepareOptions& opts);
// Builds a dataset in memory from text (what prepare_dataset writes); `name` labels messages.
Dataset prepare_text(std::string_view text, const std::string& name, const PrepareOptions& opts);
// Writes a dataset to `out_h5` atomically (the attributes record `opts`).
void save_dataset(const Dataset& ds, const std::string& out_h5, const PrepareOptions& opts);
// Reads and verifies a prepared dataset.
Dataset load_dataset(const std::string& h5_path);

// `path` is a prepared .h5 (recognised by its HDF5 signature) or a text file. A text file is
// prepared once and cached as `<name>.<tokenizer>.h5` in `cache_dir`, or when that is empty next
// to the text, or (if that directory is not writable) in $XDG_CACHE_HOME/qkv or ~/.cache/qkv.
// The cache is rebuilt when the text is newer, its size changed, or the options differ.
// Anything but a regular file (a FIFO, a pipe such as `<(zcat corpus.gz)`, a device, a
// directory) is refused before it is opened: save a stream to a file first.
// A prepared .h5 must hold an `opts.tokenizer` tokenizer unless opts.tokenizer is unset.
Dataset load_or_prepare(const std::string& path, const PrepareOptions& opts, const std::string& cache_dir = "");
// Where load_or_prepare caches a text file's preparation (`<tokenizer>` is its kTokenizerKinds spelling).
std::string dataset_cache_path(const std::string& text_path, TokenizerKind tokenizer, const std::string& cache_dir);

// All tokens of a file for `qkv eval` (no split): a text file is encoded whole with `tok`; a
// prepared .h5 gives its train tokens then its val tokens and must have been made with the same
// tokenizer. Anything but a regular file (a FIFO, a pipe such as `<(cat f)`, a device, a
// directory) is refused before it is opened.
std::vector<int32_t> load_eval_tokens(const std::string& path, const Tokenizer& tok);

// Reads a whole text corpus (at most kTextCorpusCap bytes; a regular file only, see
// data/input_file.h); names it when missing, unreadable, not a regular file or too large.
std::string read_text_file(const std::string& path);

}  // namespace qkv
