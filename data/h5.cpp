// HDF5 helper (see data/h5.h). Each C-API call is checked right where it happens, so the error
// names the object being touched; HDF5's own error stack is silenced and never printed.
#include "data/h5.h"
#include "data/h5_driver.h"
#include "data/input_file.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <utility>

namespace qkv::h5 {

namespace fs = std::filesystem;

void quiet() {
  static std::once_flag once;
  std::call_once(once, [] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
}

namespace {
constexpr char kSignature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};

bool is_regular(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
}  // namespace

bool has_hdf5_signature(std::string_view bytes) {
  return bytes.size() >= 8 && std::equal(kSignature, kSignature + 8, bytes.begin());
}

bool is_hdf5(const std::string& path) {
  if (!is_regular(path)) return false;
  std::ifstream in(path, std::ios::binary);
  char head[8] = {};
  if (!in.read(head, 8)) return false;
  return has_hdf5_signature(std::string_view(head, 8));
}

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

Id& Id::operator=(Id&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    o.id_ = -1;
  }
  return *this;
}

void Id::reset() {
  if (id_ < 0) return;
  switch (H5Iget_type(id_)) {
    case H5I_FILE:
      H5Fclose(id_);
      break;
    case H5I_GROUP:
      H5Gclose(id_);
      break;
    case H5I_DATASET:
      H5Dclose(id_);
      break;
    case H5I_DATASPACE:
      H5Sclose(id_);
      break;
    case H5I_DATATYPE:
      H5Tclose(id_);
      break;
    case H5I_ATTR:
      H5Aclose(id_);
      break;
    case H5I_GENPROP_LST:
      H5Pclose(id_);
      break;
    default:
      H5Idec_ref(id_);
      break;
  }
  id_ = -1;
}

int64_t DatasetInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

std::string normalize(const std::string& name) {
  if (name.empty() || name == "/") return "/";
  return name[0] == '/' ? name : "/" + name;
}

// Link-creation properties that create missing parent groups.
Id intermediate_lcpl() {
  Id lcpl(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  return lcpl;
}

Id file_access_plist() {
  Id fapl(H5Pcreate(H5P_FILE_ACCESS));
  // 1.10+ format: checksummed superblock and object headers, and chunk indexes that carry
  // checksums too (the 1.8 format indexes chunks with version-1 B-trees, which have none: a
  // flipped byte there silently turned a dataset into zeros).
  H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V110, H5F_LIBVER_LATEST);
  H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG);
  return fapl;
}

Id utf8_string_type() {
  Id t(H5Tcopy(H5T_C_S1));
  H5Tset_size(t.get(), H5T_VARIABLE);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  return t;
}

// Names a stored type the way DatasetInfo::type does.
std::string describe_type(hid_t type) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT) {
    if (size == 4) return "float32";
    if (size == 8) return "float64";
    return "float" + std::to_string(8 * size);
  }
  if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    return std::string(is_signed ? "int" : "uint") + std::to_string(8 * size);
  }
  if (cls == H5T_STRING) return "string";
  return "a non-numeric type";
}

// Chunks of at most ~4 MiB, splitting the outer dimensions first into equal parts: HDF5 stores
// edge chunks whole, so equal parts keep the padding below one row per chunk.
std::vector<hsize_t> chunk_dims(const Shape& shape, size_t elem_size) {
  constexpr uint64_t kLimit = 4u << 20;
  std::vector<hsize_t> chunk(shape.begin(), shape.end());
  for (size_t d = 0; d < shape.size(); ++d) {
    uint64_t inner = elem_size;
    for (size_t e = d + 1; e < shape.size(); ++e) inner *= static_cast<uint64_t>(shape[e]);
    if (inner <= kLimit) {
      const auto n = static_cast<uint64_t>(shape[d]);
      const uint64_t parts = (n * inner + kLimit - 1) / kLimit;
      chunk[d] = std::max<uint64_t>(1, (n + parts - 1) / parts);
      break;
    }
    chunk[d] = 1;
  }
  return chunk;
}

// Refuses `obj` (an attribute, or a dataset) unless it holds exactly one value: strings and
// scalar attributes are read into room for one, and HDF5 writes every element it holds there.
void require_one_value(hid_t obj, bool is_attr, const std::string& what, const File& f) {
  Id space(is_attr ? H5Aget_space(obj) : H5Dget_space(obj));
  const hssize_t n = space.valid() ? H5Sget_simple_extent_npoints(space.get()) : -1;
  if (n < 0) f.fail("cannot read the shape of ", what, " (corrupt file?)");
  if (n != 1) f.fail(what, " holds ", n, " values, expected one");
}

std::string read_string_value(hid_t obj, hid_t stored_type, bool is_attr, const std::string& what, const File& f) {
  if (H5Tget_class(stored_type) != H5T_STRING)
    f.fail(what, " has type ", describe_type(stored_type), ", expected string");
  require_one_value(obj, is_attr, what, f);
  std::string out;
  if (H5Tis_variable_str(stored_type) > 0) {
    Id mem = utf8_string_type();
    char* buf = nullptr;
    const herr_t rc =
        is_attr ? H5Aread(obj, mem.get(), &buf) : H5Dread(obj, mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &buf);
    if (rc < 0) f.fail("cannot read ", what, " (corrupt or truncated file)");
    if (buf) {
      out = buf;
      H5free_memory(buf);
    }
  } else {
    const size_t size = H5Tget_size(stored_type);
    Id mem(H5Tcopy(stored_type));
    std::vector<char> buf(size + 1, '\0');
    const herr_t rc = is_attr ? H5Aread(obj, mem.get(), buf.data())
                              : H5Dread(obj, mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data());
    if (rc < 0) f.fail("cannot read ", what, " (corrupt or truncated file)");
    out.assign(buf.data(), strnlen(buf.data(), size));
  }
  return out;
}

// How many hard links name the object at `name` (its reference count); 0 when it cannot be read.
unsigned link_count(hid_t file, const std::string& name) {
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t oi{};
  if (H5Oget_info_by_name3(file, name.c_str(), &oi, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return 0;
#else
  H5O_info_t oi{};
  if (H5Oget_info_by_name2(file, name.c_str(), &oi, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return 0;
#endif
  return oi.rc;
}

}  // namespace

File File::create(const std::string& path, bool exclusive) {
  quiet();
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty() && !fs::is_directory(parent))
    ::qkv::fail("[h5] ", path, ": cannot create file: directory ", parent.string(), " does not exist");
  File f;
  f.path_ = path;
  f.status_ = std::make_shared<WriteStatus>();
  Id fapl = file_access_plist();
  const DriverInfo info{f.status_.get()};
  if (H5Pset_driver(fapl.get(), guarded_driver(), &info) < 0)
    ::qkv::fail("[h5] ", path, ": cannot set up the HDF5 file driver");
  Id fcpl(H5Pcreate(H5P_FILE_CREATE));
  H5Pset_obj_track_times(fcpl.get(), 0);
  f.file_ = Id(H5Fcreate(path.c_str(), exclusive ? H5F_ACC_EXCL : H5F_ACC_TRUNC, fcpl.get(), fapl.get()));
  if (!f.file_.valid()) {
    const int e = f.status_->open_err;
    ::qkv::fail("[h5] ", path, ": cannot create file (", e ? std::strerror(e) : "directory not writable?", ")");
  }
  f.check_writes("the file header");
  return f;
}

void File::check_writes(const std::string& what) const {
  if (status_ && status_->err) fail("cannot write ", what, ": ", std::strerror(status_->err));
}

File File::open(const std::string& path, bool writable) {
  quiet();
  // Only a regular file (after following links) is opened: HDF5 needs to seek, opening a FIFO
  // waits for a writer, and a device such as /dev/zero never ends.
  // "" would otherwise read as a file not found, named by nothing.
  if (path.empty()) ::qkv::fail("[h5] the path is empty (\"\"); name an HDF5 file");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) ::qkv::fail("[h5] ", path, ": file not found");
    ::qkv::fail("[h5] ", path, ": cannot open (", std::strerror(errno), ")");
  }
  if (!S_ISREG(st.st_mode))
    ::qkv::fail("[h5] ", path, ": is ", file_kind(st.st_mode),
                ", not a regular file; HDF5 files must be stored on disk");
  if (!is_hdf5(path)) ::qkv::fail("[h5] ", path, ": not an HDF5 file");
  Id fapl(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG);
  File f;
  f.path_ = path;
  f.file_ = Id(H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, fapl.get()));
  if (!f.file_.valid()) ::qkv::fail("[h5] ", path, ": cannot open (truncated or corrupt HDF5 file)");
  return f;
}

bool File::has(const std::string& name) const {
  const std::string full = normalize(name);
  if (full == "/") return true;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = full.find('/', pos + 1);
    const std::string prefix = full.substr(0, pos);
    // A negative answer is an error (a damaged header), not "absent": callers skip what is absent.
    const htri_t exists = H5Lexists(file_.get(), prefix.c_str(), H5P_DEFAULT);
    if (exists < 0) fail("cannot read the link ", prefix, " (corrupt file?)");
    if (exists == 0) return false;
    // Only hard links: a soft link would alias another object of this file, an external link
    // would read from another file (neither is anything qkv writes).
    H5L_info_t li{};
    if (H5Lget_info(file_.get(), prefix.c_str(), &li, H5P_DEFAULT) < 0)
      fail("cannot read the link ", prefix, " (corrupt file?)");
    if (li.type == H5L_TYPE_HARD) {
      // One object, one name: a second hard link makes two names read the same numbers (a
      // checkpoint whose /model/a is /model/b), which nothing qkv writes ever does.
      const unsigned names = link_count(file_.get(), prefix);
      // (0: unreadable; a dangling or damaged link is reported by the checks below.)
      if (names > 1)
        fail("object ", prefix, " is reached by ", names,
             " names (hard links to one object); each object must have one");
      // A dataset has no members: "/a/b" under a dataset "/a" is absent (HDF5 would call the
      // lookup of "/a/b" an error, which is not a damaged file).
      if (pos != std::string::npos) {
        Id o(H5Oopen(file_.get(), prefix.c_str(), H5P_DEFAULT));
        if (!o.valid()) fail("cannot open ", prefix, " (corrupt file?)");
        if (H5Iget_type(o.get()) != H5I_GROUP) return false;
      }
      continue;
    }
    std::string target(li.type == H5L_TYPE_SOFT || li.type == H5L_TYPE_EXTERNAL ? li.u.val_size + 1 : 0, '\0');
    if (!target.empty() && H5Lget_val(file_.get(), prefix.c_str(), target.data(), target.size(), H5P_DEFAULT) < 0)
      target.clear();
    if (li.type == H5L_TYPE_SOFT)
      fail(prefix, " is a soft link to ", target.c_str(), ", not an object stored under that name (refused)");
    const char *ext_file = nullptr, *ext_obj = nullptr;
    if (li.type == H5L_TYPE_EXTERNAL && !target.empty() &&
        H5Lunpack_elink_val(target.data(), target.size(), nullptr, &ext_file, &ext_obj) >= 0 && ext_file && ext_obj)
      fail(prefix, " is an external link to ", ext_file, ":", ext_obj, ", not an object stored in this file (refused)");
    fail(prefix, " is a link of another kind (", static_cast<int>(li.type),
         "), not an object stored in this file (refused)");
  }
  // The final link may dangle (e.g. into a truncated region); make sure it resolves.
  return H5Oexists_by_name(file_.get(), full.c_str(), H5P_DEFAULT) > 0;
}

void File::create_group(const std::string& name) {
  const std::string full = normalize(name);
  if (has(full)) return;
  // Parents one by one rather than through HDF5's intermediate-group creation, which would use
  // the default group properties and so record timestamps (breaking same content = same bytes).
  const size_t slash = full.rfind('/');
  if (slash > 0) create_group(full.substr(0, slash));
  Id gcpl(H5Pcreate(H5P_GROUP_CREATE));
  H5Pset_obj_track_times(gcpl.get(), 0);
  Id g(H5Gcreate2(file_.get(), full.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT));
  check_writes("group " + full);
  if (!g.valid()) fail("cannot create group ", full);
}

std::vector<std::string> File::children(const std::string& group) const {
  const std::string full = normalize(group);
  if (!has(full)) fail("group ", full, " is missing");
  Id g(H5Gopen2(file_.get(), full.c_str(), H5P_DEFAULT));
  if (!g.valid()) fail(full, " is not a group");
  // One pass in HDF5's native order, sorted here. Asking for names by index instead makes HDF5
  // build a sorted table of the whole group per call (quadratic), and on a corrupt group 1.10
  // frees that half-built table's garbage pointers and aborts.
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
    static_cast<std::vector<std::string>*>(out)->emplace_back(name);
    return 0;
  };
  hsize_t idx = 0;
  if (H5Literate(g.get(), H5_INDEX_NAME, H5_ITER_NATIVE, &idx, collect, &names) < 0)
    fail("cannot list group ", full, " (corrupt file?)");
  std::sort(names.begin(), names.end());
  return names;
}

Id File::open_object(const std::string& obj) const {
  const std::string full = normalize(obj);
  if (!has(full)) fail("object ", full, " is missing");
  Id o(H5Oopen(file_.get(), full.c_str(), H5P_DEFAULT));
  if (!o.valid()) fail("cannot open object ", full, " (corrupt file?)");
  return o;
}

Id File::open_dataset(const std::string& name) const {
  const std::string full = normalize(name);
  if (!has(full)) fail("dataset ", full, " is missing");
  Id o(H5Oopen(file_.get(), full.c_str(), H5P_DEFAULT));
  if (!o.valid()) fail("cannot open dataset ", full, " (corrupt file?)");
  if (H5Iget_type(o.get()) != H5I_DATASET) fail(full, " is not a dataset");
  return o;
}

void File::write_raw(const std::string& name, hid_t mem_type, const void* data, const Shape& shape, size_t elem_size) {
  const std::string full = normalize(name);
  if (has(full)) fail("dataset ", full, " already exists");
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) fail("dataset ", full, " has negative shape ", shape_str(shape));
    numel *= d;
  }
  if (full.rfind('/') > 0) create_group(full.substr(0, full.rfind('/')));  // without timestamps
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Id space(shape.empty() ? H5Screate(H5S_SCALAR)
                         : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
  if (numel > 0 && !shape.empty()) {
    const std::vector<hsize_t> chunk = chunk_dims(shape, elem_size);
    H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data());
    H5Pset_fletcher32(dcpl.get());
  } else if (shape.empty()) {
    H5Pset_layout(dcpl.get(), H5D_COMPACT);  // a scalar: kept in the checksummed object header
  }
  H5Pset_obj_track_times(dcpl.get(), 0);
  // Little-endian file types of the same width as the native memory type.
  hid_t file_type = H5T_STD_U8LE;
  if (mem_type == H5T_NATIVE_FLOAT) file_type = H5T_IEEE_F32LE;
  else if (mem_type == H5T_NATIVE_DOUBLE) file_type = H5T_IEEE_F64LE;
  else if (mem_type == H5T_NATIVE_INT32) file_type = H5T_STD_I32LE;
  else if (mem_type == H5T_NATIVE_INT64) file_type = H5T_STD_I64LE;
  Id lcpl = intermediate_lcpl();
  Id ds(H5Dcreate2(file_.get(), full.c_str(), file_type, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT));
  check_writes("dataset " + full);
  if (!ds.valid()) fail("cannot create dataset ", full);
  const bool ok = numel == 0 || H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0;
  check_writes("dataset " + full);
  if (!ok) fail("cannot write dataset ", full);
}

void File::write(const std::string& name, const float* data, const Shape& shape) {
  write_raw(name, H5T_NATIVE_FLOAT, data, shape, 4);
}
void File::write(const std::string& name, const double* data, const Shape& shape) {
  write_raw(name, H5T_NATIVE_DOUBLE, data, shape, 8);
}
void File::write(const std::string& name, const int32_t* data, const Shape& shape) {
  write_raw(name, H5T_NATIVE_INT32, data, shape, 4);
}
void File::write(const std::string& name, const int64_t* data, const Shape& shape) {
  write_raw(name, H5T_NATIVE_INT64, data, shape, 8);
}
void File::write(const std::string& name, const uint8_t* data, const Shape& shape) {
  write_raw(name, H5T_NATIVE_UINT8, data, shape, 1);
}

DatasetInfo File::info(const std::string& name) const {
  Id ds = open_dataset(name);
  Id type(H5Dget_type(ds.get()));
  Id space(H5Dget_space(ds.get()));
  if (!type.valid() || !space.valid()) fail("cannot read the type of dataset ", normalize(name), " (corrupt file?)");
  DatasetInfo out;
  out.type = describe_type(type.get());
  const int nd = H5Sget_simple_extent_ndims(space.get());
  if (nd < 0) fail("cannot read the shape of dataset ", normalize(name));
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  out.shape.assign(dims.begin(), dims.end());
  return out;
}

void File::read_raw(const std::string& name, const char* want_type, hid_t mem_type, void* out) const {
  Id ds = open_dataset(name);
  if (H5Dread(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
    fail("cannot read dataset ", normalize(name), " (checksum mismatch: corrupt or truncated file)");
}

namespace {
template <class T>
struct TypeOf;
template <>
struct TypeOf<float> {
  static constexpr const char* name = "float32";
  static hid_t mem() { return H5T_NATIVE_FLOAT; }
};
template <>
struct TypeOf<double> {
  static constexpr const char* name = "float64";
  static hid_t mem() { return H5T_NATIVE_DOUBLE; }
};
template <>
struct TypeOf<int32_t> {
  static constexpr const char* name = "int32";
  static hid_t mem() { return H5T_NATIVE_INT32; }
};
template <>
struct TypeOf<int64_t> {
  static constexpr const char* name = "int64";
  static hid_t mem() { return H5T_NATIVE_INT64; }
};
template <>
struct TypeOf<uint8_t> {
  static constexpr const char* name = "uint8";
  static hid_t mem() { return H5T_NATIVE_UINT8; }
};
}  // namespace

template <class T>
std::vector<T> File::read(const std::string& name, Shape* shape) const {
  const DatasetInfo di = info(name);
  if (di.type != TypeOf<T>::name)
    fail("dataset ", normalize(name), " has type ", di.type, ", expected ", TypeOf<T>::name);
  std::vector<T> out(static_cast<size_t>(di.numel()));
  if (!out.empty()) read_raw(name, TypeOf<T>::name, TypeOf<T>::mem(), out.data());
  if (shape) *shape = di.shape;
  return out;
}

template <class T>
std::vector<T> File::read_shaped(const std::string& name, const Shape& expected) const {
  Shape got;
  std::vector<T> out = read<T>(name, &got);
  if (got != expected)
    fail("dataset ", normalize(name), " has shape ", shape_str(got), ", expected ", shape_str(expected));
  return out;
}

#define QKV_H5_INSTANTIATE(T)                                              \
  template std::vector<T> File::read<T>(const std::string&, Shape*) const; \
  template std::vector<T> File::read_shaped<T>(const std::string&, const Shape&) const;
QKV_H5_INSTANTIATE(float)
QKV_H5_INSTANTIATE(double)
QKV_H5_INSTANTIATE(int32_t)
QKV_H5_INSTANTIATE(int64_t)
QKV_H5_INSTANTIATE(uint8_t)
#undef QKV_H5_INSTANTIATE

void File::write_tensor(const std::string& name, const Tensor& t) {
  Tensor c = t.device() == Device::cpu ? t.contiguous() : t.to(Device::cpu).contiguous();
  switch (c.dtype()) {
    case DType::f32:
      write(name, c.data<float>(), c.shape());
      break;
    case DType::f64:
      write(name, c.data<double>(), c.shape());
      break;
    case DType::i32:
      write(name, c.data<int32_t>(), c.shape());
      break;
    case DType::i64:
      write(name, c.data<int64_t>(), c.shape());
      break;
    default:
      fail("cannot store a ", dtype_name(c.dtype()), " tensor as dataset ", normalize(name));
  }
}

Tensor File::read_tensor(const std::string& name) const {
  const DatasetInfo di = info(name);
  DType dt;
  hid_t mem;
  if (di.type == "float32") dt = DType::f32, mem = H5T_NATIVE_FLOAT;
  else if (di.type == "float64") dt = DType::f64, mem = H5T_NATIVE_DOUBLE;
  else if (di.type == "int32") dt = DType::i32, mem = H5T_NATIVE_INT32;
  else if (di.type == "int64") dt = DType::i64, mem = H5T_NATIVE_INT64;
  else fail("dataset ", normalize(name), " has type ", di.type, ", expected a float32/float64/int32/int64 tensor");
  Tensor t = Tensor::empty(di.shape, dt);
  if (t.numel() > 0) read_raw(name, di.type.c_str(), mem, t.raw_data());
  return t;
}

void File::write_string(const std::string& name, const std::string& text) {
  const std::string full = normalize(name);
  if (text.find('\0') != std::string::npos) fail("string dataset ", full, " cannot hold NUL bytes");
  if (has(full)) fail("dataset ", full, " already exists");
  if (full.rfind('/') > 0) create_group(full.substr(0, full.rfind('/')));  // without timestamps
  Id type = utf8_string_type();
  Id space(H5Screate(H5S_SCALAR));
  Id lcpl = intermediate_lcpl();
  Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_obj_track_times(dcpl.get(), 0);
  // Compact: the 16-byte reference to the text lives in the (checksummed) object header; stored
  // contiguously it would sit unprotected, and a corrupted reference crashes HDF5 1.10.
  H5Pset_layout(dcpl.get(), H5D_COMPACT);
  Id ds(H5Dcreate2(file_.get(), full.c_str(), type.get(), space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT));
  check_writes("dataset " + full);
  if (!ds.valid()) fail("cannot create dataset ", full);
  const char* p = text.c_str();
  const bool ok = H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &p) >= 0;
  check_writes("dataset " + full);
  if (!ok) fail("cannot write dataset ", full);
  ds.reset();
  set_attr(full, "fnv1a64", static_cast<int64_t>(fnv1a64(text.data(), text.size())));
}

std::string File::read_string(const std::string& name) const {
  const std::string full = normalize(name);
  Id ds = open_dataset(full);
  Id type(H5Dget_type(ds.get()));
  std::string out = read_string_value(ds.get(), type.get(), false, "dataset " + full, *this);
  if (has_attr(full, "fnv1a64")) {
    const auto want = static_cast<uint64_t>(attr_int(full, "fnv1a64"));
    if (fnv1a64(out.data(), out.size()) != want) fail("dataset ", full, " fails its checksum (corrupt file)");
  }
  return out;
}

namespace {
// Replaces attribute `name` on `o` with a new scalar of `type`.
Id fresh_attr(const File& f, hid_t o, const std::string& obj, const std::string& name, hid_t type) {
  if (H5Aexists(o, name.c_str()) > 0 && H5Adelete(o, name.c_str()) < 0)
    f.fail("cannot replace attribute ", name, " of ", obj);
  Id space(H5Screate(H5S_SCALAR));
  Id a(H5Acreate2(o, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!a.valid()) f.fail("cannot create attribute ", name, " on ", obj);
  return a;
}
}  // namespace

void File::set_attr(const std::string& obj, const std::string& name, const std::string& value) {
  if (value.find('\0') != std::string::npos) fail("attribute ", name, " cannot hold NUL bytes");
  Id o = open_object(obj);
  Id type = utf8_string_type();
  Id a = fresh_attr(*this, o.get(), normalize(obj), name, type.get());
  const char* p = value.c_str();
  const bool ok = H5Awrite(a.get(), type.get(), &p) >= 0;
  check_writes("attribute " + name + " of " + normalize(obj));
  if (!ok) fail("cannot write attribute ", name, " of ", normalize(obj));
}

void File::set_attr(const std::string& obj, const std::string& name, int64_t value) {
  Id o = open_object(obj);
  Id a = fresh_attr(*this, o.get(), normalize(obj), name, H5T_STD_I64LE);
  const bool ok = H5Awrite(a.get(), H5T_NATIVE_INT64, &value) >= 0;
  check_writes("attribute " + name + " of " + normalize(obj));
  if (!ok) fail("cannot write attribute ", name, " of ", normalize(obj));
}

void File::set_attr(const std::string& obj, const std::string& name, double value) {
  Id o = open_object(obj);
  Id a = fresh_attr(*this, o.get(), normalize(obj), name, H5T_IEEE_F64LE);
  const bool ok = H5Awrite(a.get(), H5T_NATIVE_DOUBLE, &value) >= 0;
  check_writes("attribute " + name + " of " + normalize(obj));
  if (!ok) fail("cannot write attribute ", name, " of ", normalize(obj));
}

bool File::has_attr(const std::string& obj, const std::string& name) const {
  if (!has(obj)) return false;
  // As in has(): an error is a damaged header, never "absent" (an absent checksum is not checked).
  const htri_t exists = H5Aexists_by_name(file_.get(), normalize(obj).c_str(), name.c_str(), H5P_DEFAULT);
  if (exists < 0) fail("cannot read the attributes of ", normalize(obj), " (corrupt file?)");
  return exists > 0;
}

namespace {
Id open_attr(const File& f, const std::string& obj, const std::string& name) {
  if (!f.has_attr(obj, name)) f.fail("attribute '", name, "' is missing on ", normalize(obj));
  Id a(H5Aopen_by_name(f.id(), normalize(obj).c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT));
  if (!a.valid()) f.fail("cannot open attribute '", name, "' on ", normalize(obj), " (corrupt file?)");
  return a;
}
}  // namespace

std::string File::attr_string(const std::string& obj, const std::string& name) const {
  Id a = open_attr(*this, obj, name);
  Id type(H5Aget_type(a.get()));
  return read_string_value(a.get(), type.get(), true, "attribute '" + name + "' of " + normalize(obj), *this);
}

int64_t File::attr_int(const std::string& obj, const std::string& name) const {
  Id a = open_attr(*this, obj, name);
  Id type(H5Aget_type(a.get()));
  if (H5Tget_class(type.get()) != H5T_INTEGER)
    fail("attribute '", name, "' of ", normalize(obj), " has type ", describe_type(type.get()),
         ", expected an integer");
  require_one_value(a.get(), true, "attribute '" + name + "' of " + normalize(obj), *this);
  int64_t v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_INT64, &v) < 0) fail("cannot read attribute '", name, "' of ", normalize(obj));
  return v;
}

double File::attr_double(const std::string& obj, const std::string& name) const {
  Id a = open_attr(*this, obj, name);
  Id type(H5Aget_type(a.get()));
  const H5T_class_t cls = H5Tget_class(type.get());
  if (cls != H5T_FLOAT && cls != H5T_INTEGER)
    fail("attribute '", name, "' of ", normalize(obj), " has type ", describe_type(type.get()), ", expected a number");
  require_one_value(a.get(), true, "attribute '" + name + "' of " + normalize(obj), *this);
  double v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v) < 0) fail("cannot read attribute '", name, "' of ", normalize(obj));
  return v;
}

void File::flush() {
  if (!file_.valid()) return;
  const bool ok = H5Fflush(file_.get(), H5F_SCOPE_GLOBAL) >= 0;
  check_writes("the file's metadata");
  if (!ok) fail("cannot flush");
}

void File::close() {
  if (!file_.valid()) return;
  // Ownership is dropped first so a failing close is not retried by the destructor.
  const herr_t rc = H5Fclose(file_.release());
  check_writes("the file's metadata");
  if (rc < 0) fail("cannot close");
}

std::vector<std::string> File::all_datasets() const {
  std::vector<std::string> out;
  std::vector<std::string> groups{"/"};
  while (!groups.empty()) {
    const std::string g = groups.back();
    groups.pop_back();
    for (const std::string& name : children(g)) {
      const std::string full = g == "/" ? "/" + name : g + "/" + name;
      if (!has(full)) fail("object ", full, " is missing (dangling link)");
      Id o(H5Oopen(file_.get(), full.c_str(), H5P_DEFAULT));  // (H5Oget_info's signature varies by HDF5 version)
      if (!o.valid()) fail("cannot open object ", full, " (corrupt file?)");
      const H5I_type_t type = H5Iget_type(o.get());
      if (type == H5I_GROUP) groups.push_back(full);
      else if (type == H5I_DATASET) out.push_back(full);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::pair<std::string, bool>> File::all_objects() const {
  std::vector<std::pair<std::string, bool>> out;
  std::vector<std::string> groups{"/"};
  while (!groups.empty()) {
    const std::string g = groups.back();
    groups.pop_back();
    for (const std::string& name : children(g)) {
      const std::string full = g == "/" ? "/" + name : g + "/" + name;
      if (!has(full)) fail("object ", full, " is missing (dangling link)");
      Id o(H5Oopen(file_.get(), full.c_str(), H5P_DEFAULT));
      if (!o.valid()) fail("cannot open object ", full, " (corrupt file?)");
      const H5I_type_t type = H5Iget_type(o.get());
      if (type == H5I_GROUP) groups.push_back(full);
      else if (type != H5I_DATASET) fail("object ", full, " is neither a group nor a dataset (a named datatype?)");
      out.emplace_back(full, type == H5I_GROUP);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

void File::verify(const std::string& name) const {
  const DatasetInfo di = info(name);
  if (di.type == "string") {
    (void)read_string(name);
    return;
  }
  size_t elem = 0;
  hid_t mem = -1;
  if (di.type == "float32") elem = 4, mem = H5T_NATIVE_FLOAT;
  else if (di.type == "float64") elem = 8, mem = H5T_NATIVE_DOUBLE;
  else if (di.type == "int32") elem = 4, mem = H5T_NATIVE_INT32;
  else if (di.type == "int64") elem = 8, mem = H5T_NATIVE_INT64;
  else if (di.type == "uint8") elem = 1, mem = H5T_NATIVE_UINT8;
  else fail("dataset ", normalize(name), " has type ", di.type, ", which qkv never writes");
  std::vector<char> buf(static_cast<size_t>(di.numel()) * elem);
  if (!buf.empty()) read_raw(name, di.type.c_str(), mem, buf.data());
}

}  // namespace qkv::h5
