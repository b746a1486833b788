// The one way qkv reads an input file (a text corpus, a config.json or tokenizer file, a
// safetensors file, a block_sparse layout): the file must be a regular file after following
// links, and no larger than a cap its caller states, so no input can hang a reader (a FIFO
// nobody writes to), feed it without end (a link to /dev/zero) or make it allocate without bound.
// Every refusal is one qkv::Error line naming the file:
//   "x.fifo: is a pipe or FIFO, not a regular file (a text corpus is read from a file on disk)"
//   "big.txt: is 5368709120 bytes, over the 4294967296-byte limit for a text corpus"
//
// The file is opened non-blocking and checked with fstat on the open descriptor, so a FIFO is
// refused without waiting for a writer, and the file checked is the file read.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace qkv {

// Caps on what one reader will read. Each is far above any real input of its kind.
// config.json, vocab.json, merges.txt, tokenizer.json, qkv_tokenizer.json, a sharded index:
// GPT-2's tokenizer.json is 1.4 MB, 250k-token vocabularies about 20 MB.
inline constexpr uint64_t kJsonFileCap = uint64_t(256) << 20;
// A config's TOML (train, cost, study, ...): the shipped ones are under 2 kB.
inline constexpr uint64_t kConfigFileCap = uint64_t(16) << 20;
// A text corpus (prepare, train, eval, heads) is held whole in memory with its tokens.
inline constexpr uint64_t kTextCorpusCap = uint64_t(4) << 30;
// A block_sparse layout: one 0/1 character per block pair.
inline constexpr uint64_t kLayoutFileCap = uint64_t(64) << 20;
// A run's metrics.jsonl, read on --resume to drop the rows past the checkpoint: about 200 bytes a
// logged step, so 5 million logged steps.
inline constexpr uint64_t kMetricsLogCap = uint64_t(1) << 30;
// A safetensors file: the format's 64-bit offsets; its header has its own cap
// (safetensors::kMaxHeaderBytes).
inline constexpr uint64_t kSafetensorsFileCap = uint64_t(1) << 40;

// What kind of thing `mode` (st_mode) is, for messages: "a pipe or FIFO", "a directory", ...
std::string_view file_kind(unsigned mode);

// Refuses `path` unless it is a regular file after following links (missing, a directory, a
// FIFO, a device, a socket), without opening it. `what` says what the file is for.
void require_regular_file(const std::string& path, std::string_view what);

// An open regular input file, read by position.
class InputFile {
 public:
  // Opens `path`; refuses anything but a regular file of at most `max_bytes` bytes.
  static InputFile open(const std::string& path, uint64_t max_bytes, std::string_view what);

  InputFile() = default;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  InputFile(InputFile&& o) noexcept;
  InputFile& operator=(InputFile&& o) noexcept;
  ~InputFile();

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  // Exactly `n` bytes at `offset`; a short read (the file shrank) names the file.
  void read_at(uint64_t offset, void* out, size_t n) const;
  std::string read_all() const;

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string path_;
};

// The whole content of `path`, through InputFile::open.
std::string read_input_file(const std::string& path, uint64_t max_bytes, std::string_view what);

// Parses JSON `text` read from `where` (a file name, or "file: object"); a syntax error is one
// line naming `where` and the position: "x/config.json: not valid JSON at line 3, column 5".
// `cb` as in nlohmann::json::parse; a qkv::Error it throws passes through unchanged.
nlohmann::json parse_json(std::string_view text, std::string_view where,
                          const nlohmann::json::parser_callback_t& cb = nullptr);

// One line for a nlohmann exception raised while parsing or reading `text`, without the
// library's own text: "not valid JSON at line 3, column 5" for a syntax error, or what kind of
// mistake the content has ("a value has the wrong JSON type", ...).
std::string json_error(const nlohmann::json::exception& e, std::string_view text);

}  // namespace qkv
