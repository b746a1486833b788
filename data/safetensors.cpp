// safetensors reader and writer (format and rules: data/safetensors.h).
#include "data/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>

#include "data/input_file.h"
#include "tensor/error.h"

namespace qkv::safetensors {

static_assert(std::endian::native == std::endian::little, "safetensors bytes are little-endian, as is this host");

namespace {

using nlohmann::json;

struct DTypeName {
  DType type;
  const char* name;
  int size;
};
constexpr DTypeName kDTypes[] = {
    {DType::BOOL, "BOOL", 1},       {DType::U8, "U8", 1},   {DType::I8, "I8", 1},   {DType::F8_E5M2, "F8_E5M2", 1},
    {DType::F8_E4M3, "F8_E4M3", 1}, {DType::I16, "I16", 2}, {DType::U16, "U16", 2}, {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},       {DType::I32, "I32", 4}, {DType::U32, "U32", 4}, {DType::F32, "F32", 4},
    {DType::F64, "F64", 8},         {DType::I64, "I64", 8}, {DType::U64, "U64", 8},
};

// A name as it appears in a one-line message: JSON-quoted, so a newline or control byte in an
// untrusted name cannot break the line.
std::string q(std::string_view s) { return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace); }

// bfloat16 <-> float32: the upper half of the float32 bits (rounded to nearest even on the way in).
// Written here rather than taken from tensor/dtype.h so this file builds alone with any compiler
// (the fuzz target, tests/fuzz/, is built by clang 14, which lacks _Float16 on x86-64).
float bf16_bits_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // a quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
// IEEE half -> float32, exactly: sign, 5-bit exponent (bias 15), 10-bit fraction; subnormals are
// fraction * 2^-24; exponent 31 is inf/NaN.
float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, frac = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    float v = std::ldexp(static_cast<float>(frac), -24);
    std::memcpy(&u, &v, 4);
    u |= sign;
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (frac << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (frac << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint64_t read_u64_le(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// Parses `text` refusing a key repeated inside one object (at any depth): nlohmann keeps the last
// value silently, and two readers that disagree on which one counts is how a file hides content.
json parse_json_no_duplicates(std::string_view file, std::string_view text) {
  std::vector<std::set<std::string>> open;  // the keys seen in each object being parsed
  const json::parser_callback_t cb = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) {
      open.emplace_back();
    } else if (ev == json::parse_event_t::object_end) {
      if (!open.empty()) open.pop_back();
    } else if (ev == json::parse_event_t::key) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!open.empty() && !open.back().insert(k).second) fail(file, ": safetensors header repeats the key ", q(k));
    }
    return true;
  };
  return parse_json(text, cat(file, ": safetensors header"), cb);
}

// A JSON integer in [0, limit] (nlohmann keeps non-negative integers as number_unsigned; a
// negative one is number_integer and a fraction or an out-of-range one a float).
bool as_count(const json& v, uint64_t limit, uint64_t& out) {
  if (!v.is_number_unsigned()) return false;
  out = v.get<uint64_t>();
  return out <= limit;
}

}  // namespace

const char* dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.name;
  return "?";
}
int dtype_size(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.size;
  return 0;
}
bool parse_dtype(std::string_view name, DType& out) {
  for (const auto& d : kDTypes)
    if (name == d.name) {
      out = d.type;
      return true;
    }
  return false;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const TensorInfo* Header::find(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

Header parse_header(std::string_view file, std::string_view head, uint64_t file_size) {
  QKV_CHECK(file_size >= 8 && head.size() >= 8, file, ": not a safetensors file: ", file_size,
            " bytes, shorter than the 8-byte header length");
  const uint64_t n = read_u64_le(head.data());
  QKV_CHECK(n > 0, file, ": safetensors header length is 0");
  QKV_CHECK(n <= kMaxHeaderBytes, file, ": safetensors header length ", n, " exceeds the limit of ", kMaxHeaderBytes,
            " bytes");
  QKV_CHECK(n <= file_size - 8, file, ": safetensors header length ", n, " runs past the end of the file (", file_size,
            " bytes)");
  QKV_CHECK(head.size() >= 8 + n, file, ": safetensors header is truncated (", head.size() - 8, " of ", n,
            " bytes read)");
  const std::string_view text = head.substr(8, n);
  QKV_CHECK(text[0] == '{', file, ": safetensors header does not start with '{'");

  const json j = parse_json_no_duplicates(file, text);
  QKV_CHECK(j.is_object(), file, ": safetensors header is not a JSON object");

  Header h;
  h.buffer_offset = 8 + n;
  const uint64_t buffer_size = file_size - h.buffer_offset;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (v.is_null()) continue;
      QKV_CHECK(v.is_object(), file, ": safetensors __metadata__ is not an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        QKV_CHECK(m.value().is_string(), file, ": safetensors __metadata__ value of ", q(m.key()), " is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = cat(file, ": safetensors tensor ", q(name));
    QKV_CHECK(!name.empty(), file, ": safetensors tensor with an empty name");
    QKV_CHECK(v.is_object(), where, " is not an object");
    for (auto f = v.begin(); f != v.end(); ++f)
      QKV_CHECK(f.key() == "dtype" || f.key() == "shape" || f.key() == "data_offsets", where, " has the unknown field ",
                q(f.key()));
    QKV_CHECK(v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"), where, " lacks ",
              !v.contains("dtype")   ? "dtype"
              : !v.contains("shape") ? "shape"
                                     : "data_offsets");
    TensorInfo t;
    t.name = name;
    const json& dt = v["dtype"];
    QKV_CHECK(dt.is_string() && parse_dtype(dt.get_ref<const std::string&>(), t.dtype), where, ": dtype ",
              dt.dump(-1, ' ', false, json::error_handler_t::replace), " is not a safetensors dtype");
    const json& shape = v["shape"];
    QKV_CHECK(shape.is_array(), where, ": shape is not a list");
    // The byte size prod(shape) * itemsize, refusing any step that would overflow 64 bits.
    uint64_t bytes = static_cast<uint64_t>(dtype_size(t.dtype));
    for (const json& d : shape) {
      uint64_t dim = 0;
      QKV_CHECK(as_count(d, static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), dim), where, ": shape ",
                shape.dump(), " has an entry that is not a non-negative integer");
      QKV_CHECK(dim == 0 || bytes <= std::numeric_limits<uint64_t>::max() / dim, where, ": shape ", shape.dump(),
                " is too large (its byte size overflows 64 bits)");
      bytes *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const json& off = v["data_offsets"];
    QKV_CHECK(off.is_array() && off.size() == 2 && as_count(off[0], std::numeric_limits<uint64_t>::max(), t.begin) &&
                  as_count(off[1], std::numeric_limits<uint64_t>::max(), t.end),
              where, ": data_offsets ", off.dump(), " is not a pair of non-negative integers");
    QKV_CHECK(t.begin <= t.end, where, ": data_offsets [", t.begin, ", ", t.end, "] end before they begin");
    QKV_CHECK(t.end <= buffer_size, where, ": data_offsets [", t.begin, ", ", t.end, "] run past the end of the data (",
              buffer_size, " bytes)");
    QKV_CHECK(t.end - t.begin == bytes, where, ": data_offsets [", t.begin, ", ", t.end, "] hold ", t.end - t.begin,
              " bytes but ", dtype_name(t.dtype), " shape ", shape.dump(), " needs ", bytes);
    h.tensors.push_back(std::move(t));
  }

  // The tensors must tile the buffer: sorted by offset, each starts where the previous ended.
  std::vector<size_t> order(h.tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto &x = h.tensors[a], &y = h.tensors[b];
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  uint64_t cursor = 0;
  const TensorInfo* prev = nullptr;
  for (size_t i : order) {
    const TensorInfo& t = h.tensors[i];
    QKV_CHECK(t.begin >= cursor, file, ": safetensors tensor ", q(t.name), " (bytes [", t.begin, ", ", t.end,
              ")) overlaps tensor ", q(prev ? prev->name : ""), " (bytes [", prev ? prev->begin : 0, ", ", cursor,
              "))");
    QKV_CHECK(t.begin == cursor, file, ": safetensors data has a gap: bytes [", cursor, ", ", t.begin,
              ") belong to no tensor");
    cursor = t.end;
    prev = &t;
  }
  QKV_CHECK(cursor == buffer_size, file, ": safetensors data has ", buffer_size - cursor,
            " bytes after the last tensor", " (bytes [", cursor, ", ", buffer_size, ") belong to no tensor)");
  return h;
}

Reader::Reader(const std::string& path)
    : path_(path), in_(InputFile::open(path, kSafetensorsFileCap, "a safetensors file")) {
  const uint64_t size = in_.size();
  std::string head(8, '\0');
  if (size >= 8) {
    in_.read_at(0, head.data(), 8);
    const uint64_t n = read_u64_le(head.data());
    // Bounds first: the length is read from the file, so it decides no allocation unchecked.
    if (n > 0 && n <= kMaxHeaderBytes && n <= size - 8) {
      head.resize(8 + n);
      in_.read_at(8, head.data() + 8, n);
    }
  }
  header_ = parse_header(path, head, size);
}

std::string Reader::read_bytes(const TensorInfo& t) {
  std::string bytes(t.end - t.begin, '\0');
  in_.read_at(header_.buffer_offset + t.begin, bytes.data(), bytes.size());
  return bytes;
}

std::vector<float> Reader::read_f32(const TensorInfo& t) {
  QKV_CHECK(t.dtype == DType::F32 || t.dtype == DType::F16 || t.dtype == DType::BF16 || t.dtype == DType::F64, path_,
            ": safetensors tensor ", q(t.name), " has dtype ", dtype_name(t.dtype),
            " (expected F32, F16, BF16 or F64)");
  const std::string b = read_bytes(t);
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> out(n);
  const char* p = b.data();
  switch (t.dtype) {
    case DType::F32:
      std::memcpy(out.data(), p, n * 4);
      break;
    case DType::F64:
      for (size_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, p + 8 * i, 8);
        out[i] = static_cast<float>(d);
      }
      break;
    default:
      for (size_t i = 0; i < n; ++i) {
        uint16_t u;
        std::memcpy(&u, p + 2 * i, 2);
        out[i] = t.dtype == DType::F16 ? f16_bits_to_float(u) : bf16_bits_to_float(u);
      }
  }
  return out;
}

std::string encode_f32(const float* values, int64_t n, DType dtype) {
  std::string out;
  if (dtype == DType::F32) {
    out.assign(reinterpret_cast<const char*>(values), static_cast<size_t>(n) * 4);
    return out;
  }
  QKV_CHECK(dtype == DType::BF16, "safetensors: cannot encode float32 values as ", dtype_name(dtype), " (F32 or BF16)");
  out.resize(static_cast<size_t>(n) * 2);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t u = float_to_bf16_bits(values[i]);
    std::memcpy(out.data() + 2 * i, &u, 2);
  }
  return out;
}

std::string serialize(const std::vector<WriteTensor>& tensors, const std::map<std::string, std::string>& metadata) {
  std::vector<const WriteTensor*> order;
  for (const auto& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const WriteTensor* a, const WriteTensor* b) {
    const int sa = dtype_size(a->dtype), sb = dtype_size(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const WriteTensor* t : order) {
    QKV_CHECK(!t->name.empty() && t->name != "__metadata__", "safetensors: cannot write a tensor named ", q(t->name));
    QKV_CHECK(!header.contains(t->name), "safetensors: two tensors named ", q(t->name));
    uint64_t bytes = static_cast<uint64_t>(dtype_size(t->dtype));
    for (int64_t d : t->shape) {
      QKV_CHECK(d >= 0, "safetensors: tensor ", q(t->name), " has a negative dimension");
      bytes *= static_cast<uint64_t>(d);
    }
    QKV_CHECK(bytes == t->data.size(), "safetensors: tensor ", q(t->name), " has ", t->data.size(),
              " bytes of data but its shape needs ", bytes);
    header[t->name] = {
        {"dtype", dtype_name(t->dtype)}, {"shape", t->shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the buffer starts 8-byte aligned
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.reserve(8 + text.size() + offset);
  out += text;
  for (const WriteTensor* t : order) out += t->data;
  return out;
}

}  // namespace qkv::safetensors
