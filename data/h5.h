// A small RAII layer over the HDF5 C API, shared by prepared datasets (data/) and checkpoints
// (train/). Every failure becomes one qkv::Error line naming the file and the object:
//   "[h5] run/ckpt.h5: dataset /model/wte.weight has type int32, expected float32".
//
// Files are written in the 1.10+ object format (object headers, chunk indexes and the superblock carry
// checksums) and numeric datasets are chunked with the Fletcher-32 filter, so a flipped byte in
// metadata or in the numbers is reported on read instead of returning wrong values. String
// datasets (JSON, TOML) carry their own 64-bit checksum attribute. Modification times are not
// recorded, so the same content gives the same bytes. HDF5's own error-stack printing is off.
//
// Files are written through qkv's own small file driver (plain POSIX I/O) that never reports a
// failed write to HDF5: it records the first error (disk full, quota, I/O error) and the next
// File call throws it. HDF5 reacts to a write error by leaving the file half-closed in its
// tables, and its exit-time cleanup then crashed (SIGSEGV); recorded this way, HDF5's state stays
// consistent and the file closes normally. Tests can make that driver fail on purpose
// (fail_writes_after(), data/h5_atomic.h).
//
// Reading accepts only regular files and only objects stored in the file itself, each under one
// name: a soft link, an external link (into another file) or a second hard link to one object is
// refused by name, so a file can never pull its content from elsewhere or give two names the
// same numbers.
//
// Replacing a file atomically (AtomicWriter) and temporary names live in data/h5_atomic.h.
//
// Everything is readable by h5py: numbers as numpy arrays with their shapes, strings as bytes
// (`f["tokenizer/json"][()].decode()`), attributes as str / int / float.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace qkv::h5 {

// Turns off HDF5's printing of its error stack (we report errors ourselves). Idempotent.
void quiet();

// True when `path` is a regular file that starts with the HDF5 signature (a pipe, FIFO or
// device is never opened here: reading it would consume what the real reader needs).
bool is_hdf5(const std::string& path);
// True when `bytes` starts with the HDF5 signature.
bool has_hdf5_signature(std::string_view bytes);

// An owned hid_t, released with the close function that matches its kind (file, group, ...).
class Id {
 public:
  Id() = default;
  explicit Id(hid_t id) : id_(id) {}
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  Id(Id&& o) noexcept : id_(o.id_) { o.id_ = -1; }
  Id& operator=(Id&& o) noexcept;
  ~Id() { reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();
  hid_t release() {  // gives up ownership without closing
    const hid_t id = id_;
    id_ = -1;
    return id;
  }

 private:
  hid_t id_ = -1;
};

// Stored element type and shape of a dataset. `type` is one of "float32", "float64", "int32",
// "int64", "uint8", "string", or a short description of anything else (for messages).
struct DatasetInfo {
  std::string type;
  Shape shape;
  int64_t numel() const;
};

class File {
 public:
  // Creates (truncating) a file for writing; with `exclusive`, an existing file is an error.
  static File create(const std::string& path, bool exclusive = false);
  // Opens an existing file; names the file when it is missing, not HDF5, or truncated.
  static File open(const std::string& path, bool writable = false);

  File() = default;
  File(File&&) noexcept = default;
  // Closes the current file before its write status goes (the driver reports into it at close).
  File& operator=(File&& o) noexcept {
    if (this != &o) {
      file_.reset();
      path_ = std::move(o.path_);
      status_ = std::move(o.status_);
      file_ = std::move(o.file_);
    }
    return *this;
  }
  ~File() = default;  // file_ is destroyed (closed) before status_

  const std::string& path() const { return path_; }
  hid_t id() const { return file_.get(); }

  // Object names are absolute or relative to the root ("model/wte.weight" == "/model/wte.weight").
  // has() checks every component of the path; a component that is a soft or external link, or
  // an object reached by more than one hard link, is an error naming it (objects must be stored
  // in this file, each under exactly one name).
  bool has(const std::string& name) const;
  void create_group(const std::string& name);                         // with missing parents; no-op if present
  std::vector<std::string> children(const std::string& group) const;  // sorted names

  // Row-major contiguous host arrays; parent groups are created as needed.
  void write(const std::string& name, const float* data, const Shape& shape);
  void write(const std::string& name, const double* data, const Shape& shape);
  void write(const std::string& name, const int32_t* data, const Shape& shape);
  void write(const std::string& name, const int64_t* data, const Shape& shape);
  void write(const std::string& name, const uint8_t* data, const Shape& shape);
  template <class T>
  void write(const std::string& name, const std::vector<T>& v) {
    write(name, v.data(), Shape{static_cast<int64_t>(v.size())});
  }

  // Describes a dataset; throws naming it when it is missing or not a dataset.
  DatasetInfo info(const std::string& name) const;
  // Reads a whole dataset whose stored element type is exactly T (float, double, int32_t,
  // int64_t, uint8_t); a different stored type is an error, never a silent conversion.
  template <class T>
  std::vector<T> read(const std::string& name, Shape* shape = nullptr) const;
  // As read(), but also checks the stored shape.
  template <class T>
  std::vector<T> read_shaped(const std::string& name, const Shape& expected) const;

  // Tensors of dtype f32/f64/i32/i64 with their shapes (any layout; written contiguous, on CPU).
  void write_tensor(const std::string& name, const Tensor& t);
  Tensor read_tensor(const std::string& name) const;

  // A scalar UTF-8 string dataset (long text: JSON, TOML), with a checksum attribute.
  void write_string(const std::string& name, const std::string& text);
  std::string read_string(const std::string& name) const;

  // Attributes on any object (`obj` = "/" for the root). Strings are variable-length UTF-8,
  // integers int64, reals float64.
  void set_attr(const std::string& obj, const std::string& name, const std::string& value);
  void set_attr(const std::string& obj, const std::string& name, const char* value) {
    set_attr(obj, name, std::string(value));
  }
  void set_attr(const std::string& obj, const std::string& name, int64_t value);
  void set_attr(const std::string& obj, const std::string& name, double value);
  bool has_attr(const std::string& obj, const std::string& name) const;
  std::string attr_string(const std::string& obj, const std::string& name) const;
  int64_t attr_int(const std::string& obj, const std::string& name) const;
  double attr_double(const std::string& obj, const std::string& name) const;

  void flush();
  void close();  // also done by the destructor; errors surface here, not there

  // Every dataset in the file (full names, sorted), found by walking the groups from the root.
  std::vector<std::string> all_datasets() const;
  // Every group and dataset in the file (full names, sorted; true for a group), found by walking
  // the groups from the root. Anything else (a named datatype) is an error naming it.
  std::vector<std::pair<std::string, bool>> all_objects() const;
  // Reads dataset `name` whole, which verifies its Fletcher-32 checksums (numbers) or its
  // fnv1a64 attribute (strings); throws naming it when it fails.
  void verify(const std::string& name) const;

  // "[h5] PATH: " + parts, as a qkv::Error.
  template <class... Args>
  [[noreturn]] void fail(const Args&... parts) const {
    ::qkv::fail("[h5] ", path_, ": ", parts...);
  }

 private:
  Id open_object(const std::string& obj) const;
  Id open_dataset(const std::string& name) const;
  void write_raw(const std::string& name, hid_t mem_type, const void* data, const Shape& shape, size_t elem_size);
  void read_raw(const std::string& name, const char* want_type, hid_t mem_type, void* out) const;
  // Throws the driver's recorded write error, if any, naming `what` was being written.
  void check_writes(const std::string& what) const;

 public:
  struct WriteStatus;  // the first failed write of a file made by create() (see h5.cpp)

 private:
  std::string path_;
  std::shared_ptr<WriteStatus> status_;  // declared before file_: outlives the open file
  Id file_;
};

// 64-bit FNV-1a of a byte string (the string datasets' checksum; also handy for fingerprints).
uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull);

}  // namespace qkv::h5
