// safetensors: the tensor file format of the Hugging Face ecosystem (model.safetensors), written
// and read here from its specification (github.com/huggingface/safetensors, "Format"):
//   bytes [0, 8)        N, unsigned 64-bit little-endian: the header's length
//   bytes [8, 8 + N)    the header, UTF-8 JSON starting with '{', optionally padded with spaces:
//                         {"<name>": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [b, e]},
//                          ..., "__metadata__": {"<key>": "<string value>", ...}}
//   bytes [8 + N, end)  the byte buffer; tensor <name> is bytes [b, e) of it, little-endian,
//                       row-major, e - b = prod(shape) * itemsize(dtype) (shape [] is a scalar).
// The writer pads the header with spaces so the buffer starts at a multiple of 8 (as the
// reference writer does) and lays tensors out back to back, largest item size first, then by
// name, so the same tensors always give the same bytes.
//
// The reader treats a file as untrusted and refuses, with one line naming the file and the
// tensor or field at fault: a file shorter than 8 bytes; N = 0, N > kMaxHeaderBytes or beyond the
// file; a header that does not start with '{', is not JSON, is not an object, or repeats a key
// at any depth; a __metadata__ that is not an object of strings; an entry that is not an object
// with exactly dtype, shape and data_offsets; an unknown dtype; a shape that is not a list of
// non-negative integers, or whose byte size overflows 64 bits; data_offsets that are not two
// integers begin <= end inside the buffer, or whose extent differs from the shape's byte size;
// two tensors' bytes overlapping; and a buffer not covered entirely (a gap, or bytes after the
// last tensor), which the format forbids so no other content can hide in the file.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "data/input_file.h"

namespace qkv::safetensors {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference reader's bound

// The element types the format names. itemsize() of each; F8 kinds are 1 byte.
enum class DType { BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64 };
const char* dtype_name(DType t);
int dtype_size(DType t);
// The dtype spelled `name` ("F32", ...); false when the format has no such dtype.
bool parse_dtype(std::string_view name, DType& out);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // relative to the byte buffer
  int64_t numel() const;
};

struct Header {
  std::vector<TensorInfo> tensors;  // in header (key) order
  std::map<std::string, std::string> metadata;
  uint64_t buffer_offset = 0;  // 8 + N: where the byte buffer starts in the file
  const TensorInfo* find(std::string_view name) const;
};

// Parses and validates the header of a file of `file_size` bytes whose first bytes are `head`
// (at least the 8 + N header bytes; more is ignored). `file` names the file in error messages.
// Every rule above is checked here; the buffer's bytes are not read.
Header parse_header(std::string_view file, std::string_view head, uint64_t file_size);

// An open, validated safetensors file; tensors are read on demand.
class Reader {
 public:
  // Opens `path` through InputFile (a regular file only, at most kSafetensorsFileCap bytes).
  explicit Reader(const std::string& path);
  const Header& header() const { return header_; }
  const std::string& path() const { return path_; }
  // The tensor's values as float32: F32 as is, F16 and BF16 widened exactly, F64 rounded to
  // nearest. Any other dtype is refused naming the tensor.
  std::vector<float> read_f32(const TensorInfo& t);
  // The tensor's raw bytes.
  std::string read_bytes(const TensorInfo& t);

 private:
  std::string path_;
  InputFile in_;
  Header header_;
};

// One tensor to write: `data` holds prod(shape) * dtype_size(dtype) little-endian bytes.
struct WriteTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::string data;
};
// The file's bytes (header + buffer), as described above (callers write them atomically:
// train/atomic_file.h).
std::string serialize(const std::vector<WriteTensor>& tensors, const std::map<std::string, std::string>& metadata);

// float32 values as the bytes of dtype F32 or BF16 (rounded to nearest even).
std::string encode_f32(const float* values, int64_t n, DType dtype);

}  // namespace qkv::safetensors
