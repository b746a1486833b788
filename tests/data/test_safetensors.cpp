// data/safetensors.h: the writer's bytes against the specification (hand-built expected bytes),
// a round trip through a file, and every rule of the untrusted-file reader on a hand-corrupted
// file, each refused with one line naming the file and the tensor or field at fault.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>

#include "checkpoint_test_util.h"
#include "data/safetensors.h"
#include "tensor/error.h"

using namespace qkv::safetensors;
using qkv::ckpt_test::error_of;
using qkv::ckpt_test::TempDir;

namespace {

// A file from its header text and buffer, with the 8-byte little-endian length.
std::string file_of(const std::string& header, const std::string& buffer = "", uint64_t length = UINT64_MAX) {
  if (length == UINT64_MAX) length = header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return out + header + buffer;
}

std::string parse_error(const std::string& bytes) {
  return error_of([&] { parse_header("m.safetensors", bytes, bytes.size()); });
}

// A valid two-tensor header: a F32 [2] at [0, 8) and a BF16 [2, 1] at [8, 12).
const std::string kGood =
    R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[2,1],"data_offsets":[8,12]}})";

}  // namespace

TEST_CASE("safetensors writer lays out bytes as the specification says", "[safetensors]") {
  const float a[2] = {1.0f, -2.5f};
  const float b[3] = {0.5f, 3.0f, -1.0f};
  std::vector<WriteTensor> ts = {{"x.bias", DType::BF16, {3}, encode_f32(b, 3, DType::BF16)},
                                 {"w", DType::F32, {1, 2}, encode_f32(a, 2, DType::F32)}};
  const std::string bytes = serialize(ts, {{"format", "pt"}});
  // F32 (item size 4) before BF16 (2); keys sorted in the JSON; padded with spaces to 8 bytes.
  std::string header = R"({"__metadata__":{"format":"pt"},"w":{"data_offsets":[0,8],"dtype":"F32","shape":[1,2]},)"
                       R"("x.bias":{"data_offsets":[8,14],"dtype":"BF16","shape":[3]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string buffer(reinterpret_cast<const char*>(a), 8);
  // bfloat16 of 0.5, 3.0, -1.0 = the upper halves of 0x3F000000, 0x40400000, 0xBF800000.
  const unsigned char bf[6] = {0x00, 0x3F, 0x40, 0x40, 0x80, 0xBF};
  buffer.append(reinterpret_cast<const char*>(bf), 6);
  CHECK(bytes == file_of(header, buffer));
  CHECK((bytes.size() - buffer.size()) % 8 == 0);

  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  std::ofstream(path, std::ios::binary) << bytes;
  Reader r(path);
  REQUIRE(r.header().tensors.size() == 2);
  CHECK(r.header().metadata.at("format") == "pt");
  const TensorInfo* w = r.header().find("w");
  REQUIRE(w);
  CHECK(w->shape == std::vector<int64_t>{1, 2});
  CHECK(r.read_f32(*w) == std::vector<float>{1.0f, -2.5f});
  CHECK(r.read_f32(*r.header().find("x.bias")) == std::vector<float>{0.5f, 3.0f, -1.0f});
}

TEST_CASE("safetensors reader widens F16, BF16 and F64 and refuses integer dtypes by name", "[safetensors]") {
  // 1.0, -2.5, the smallest and largest subnormals 2^-24 and 1023 * 2^-24, the largest normal 65504, +inf
  const unsigned char f16[12] = {0x00, 0x3C, 0x00, 0xC1, 0x01, 0x00, 0xFF, 0x03, 0xFF, 0x7B, 0x00, 0x7C};
  double f64[2] = {0.1, -3.0};
  const unsigned char i32[4] = {7, 0, 0, 0};
  std::string buf(reinterpret_cast<const char*>(f64), 16);
  buf.append(reinterpret_cast<const char*>(f16), 12);
  buf.append(reinterpret_cast<const char*>(i32), 4);
  const std::string h = R"({"d":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},)"
                        R"("h":{"dtype":"F16","shape":[6],"data_offsets":[16,28]},)"
                        R"("i":{"dtype":"I32","shape":[],"data_offsets":[28,32]}})";
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  std::ofstream(path, std::ios::binary) << file_of(h, buf);
  Reader r(path);
  CHECK(r.read_f32(*r.header().find("h")) ==
        std::vector<float>{1.0f, -2.5f, std::ldexp(1.0f, -24), std::ldexp(1023.0f, -24), 65504.0f, INFINITY});
  CHECK(r.read_f32(*r.header().find("d")) == std::vector<float>{0.1f, -3.0f});
  CHECK(r.header().find("i")->numel() == 1);  // shape [] is a scalar
  CHECK_THAT(error_of([&] { r.read_f32(*r.header().find("i")); }),
             Catch::Contains("m.safetensors") && Catch::Contains("\"i\"") && Catch::Contains("I32"));
}

TEST_CASE("safetensors reader accepts valid edge cases", "[safetensors]") {
  CHECK(parse_header("m", file_of(kGood, std::string(12, 'x')), 20 + kGood.size()).tensors.size() == 2);
  // space padding after the JSON, an empty tensor, no tensors at all, a null __metadata__
  CHECK_NOTHROW(parse_header("m", file_of(kGood + "      ", std::string(12, 'x')), 26 + kGood.size()));
  const std::string empty = R"({"e":{"dtype":"F32","shape":[0,5],"data_offsets":[0,0]}})";
  CHECK(parse_header("m", file_of(empty), 8 + empty.size()).tensors.at(0).numel() == 0);
  CHECK(parse_header("m", file_of("{}"), 10).tensors.empty());
  CHECK(parse_header("m", file_of(R"({"__metadata__":null})"), 29).metadata.empty());
}

TEST_CASE("safetensors reader refuses each corruption by name", "[safetensors]") {
  const std::string buf12(12, 'x');
  struct Case {
    const char* rule;
    std::string bytes;
    std::vector<std::string> expect;  // substrings of the one-line error
  };
  const std::string long_name = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::vector<Case> cases = {
      {"shorter than 8 bytes", std::string(5, '\0'), {"shorter than the 8-byte"}},
      {"header length 0", file_of("", buf12), {"header length is 0"}},
      {"header length over the bound", file_of("{}", "", 200'000'000), {"exceeds the limit"}},
      {"header length past the end", file_of(kGood, buf12, kGood.size() + 100), {"runs past the end of the file"}},
      {"not starting with {", file_of(" " + kGood, buf12), {"does not start with '{'"}},
      {"not JSON", file_of(R"({"a":{"dtype":"F32",)", buf12), {"not valid JSON"}},
      {"duplicate tensor name",
       file_of(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
           buf12),
       {"repeats the key", "\"a\""}},
      {"duplicate field",
       file_of(R"({"a":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}})", std::string(8, 'x')),
       {"repeats the key", "\"dtype\""}},
      {"metadata not strings", file_of(R"({"__metadata__":{"k":1}})"), {"__metadata__", "\"k\""}},
      {"entry not an object", file_of(R"({"a":[1]})"), {"tensor \"a\"", "not an object"}},
      {"unknown field",
       file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", std::string(8, 'x')),
       {"\"a\"", "unknown field \"x\""}},
      {"missing field", file_of(R"({"a":{"dtype":"F32","shape":[2]}})"), {"\"a\"", "lacks data_offsets"}},
      {"unknown dtype",
       file_of(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", std::string(8, 'x')),
       {"\"a\"", "dtype \"F33\""}},
      {"negative dim",
       file_of(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, 'x')),
       {"\"a\"", "shape [-2]"}},
      {"fractional dim",
       file_of(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", std::string(8, 'x')),
       {"\"a\"", "not a non-negative integer"}},
      {"shape overflow",
       file_of(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", std::string(8, 'x')),
       {"\"a\"", "overflows 64 bits"}},
      {"offsets not a pair",
       file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", std::string(8, 'x')),
       {"\"a\"", "data_offsets [0]"}},
      {"offsets reversed",
       file_of(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", std::string(8, 'x')),
       {"\"a\"", "end before they begin"}},
      {"offset past the file",
       file_of(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(8, 'x')),
       {"\"a\"", "run past the end of the data (8 bytes)"}},
      {"extent differs from shape",
       file_of(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, 'x')),
       {"\"a\"", "hold 8 bytes but F32 shape [3] needs 12"}},
      {"overlap",
       file_of(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
           buf12),
       {"\"b\"", "overlaps tensor \"a\""}},
      {"gap",
       file_of(
           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
           buf12),
       {"gap: bytes [4, 8)"}},
      {"trailing bytes", file_of(kGood, buf12 + "hidden"), {"6 bytes after the last tensor"}},
      {"gap at the start",
       file_of(R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, 'x')),
       {"gap: bytes [0, 4)"}},
  };
  for (const auto& c : cases) {
    INFO(c.rule);
    const std::string msg = parse_error(c.bytes);
    CHECK(msg.find('\n') == std::string::npos);
    CHECK_THAT(msg, Catch::StartsWith("m.safetensors: "));
    for (const auto& e : c.expect) CHECK_THAT(msg, Catch::Contains(e));
  }
  // JSON that is not an object cannot start with '{': the first rule refuses it.
  CHECK_THAT(parse_error(file_of("[1, 2]")), Catch::Contains("does not start with '{'"));
  // A name with a newline is quoted, keeping the error on one line.
  const std::string msg = parse_error(file_of("{\"a\\nb\":{\"dtype\":\"X\",\"shape\":[],\"data_offsets\":[0,0]}}"));
  CHECK_THAT(msg, Catch::Contains("\"a\\nb\""));
  CHECK(msg.find('\n') == std::string::npos);
}

TEST_CASE("safetensors Reader refuses a file truncated or with a huge header length without allocating it",
          "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  std::ofstream(path, std::ios::binary) << file_of(kGood, std::string(12, 'x'), 0x7fffffffffffffffULL);
  CHECK_THAT(error_of([&] { Reader r(path); }),
             Catch::Contains("t.safetensors") && Catch::Contains("exceeds the limit"));
  std::ofstream(path, std::ios::binary) << file_of(kGood, std::string(11, 'x'));
  CHECK_THAT(error_of([&] { Reader r(path); }), Catch::Contains("\"b\"") && Catch::Contains("run past the end"));
  CHECK_THAT(error_of([&] { Reader r(dir.file("absent.safetensors")); }),
             Catch::Contains("absent.safetensors: cannot open"));
}
