#include "python/src/convert.h"

#include <memory>
#include <string_view>

#include "tensor/error.h"
#include "tensor/ops.h"

namespace py = pybind11;

namespace qkv::python {
namespace {

// DLPack's ABI (DLPack 0.8, the unversioned capsule every consumer reads): a producer hands a
// PyCapsule named "dltensor" holding a DLManagedTensor*. The consumer renames the capsule
// "used_dltensor" when it takes the tensor and calls `deleter` once it no longer needs the memory;
// a capsule still named "dltensor" when it dies was never taken, so its destructor calls `deleter`.
enum DLDeviceType : int32_t { kDLCPU = 1, kDLCUDA = 2 };
struct DLDevice {
  int32_t device_type;  // DLDeviceType
  int32_t device_id;
};
enum DLDataTypeCode : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLComplex = 5, kDLBool = 6 };
struct DLDataType {
  uint8_t code;  // DLDataTypeCode
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;  // the first element is at data + byte_offset
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null means compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";

// Keeps a Python object alive from C++ (a Storage's owner): released with the GIL held, from
// whichever thread drops the last reference.
std::shared_ptr<void> keep_alive(py::object obj) {
  return std::shared_ptr<void>(new py::object(std::move(obj)), [](void* p) {
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(p);
  });
}

std::string type_name(py::handle obj) { return py::str(py::type::of(obj).attr("__name__")).cast<std::string>(); }

}  // namespace

NumpyItem numpy_item(const py::dtype& dt) {
  return {dt.attr("kind").cast<std::string>().at(0), dt.attr("itemsize").cast<py::ssize_t>(),
          dt.attr("isnative").cast<bool>()};
}

namespace {

DType dtype_of_numpy(const py::dtype& dt, const char* what) {
  const NumpyItem item = numpy_item(dt);
  QKV_CHECK(item.native, "argument '", what, "': numpy dtype ", dt.attr("str").cast<std::string>(),
            " is not in this machine's byte order; pass a copy converted with .astype(x.dtype.newbyteorder('='))");
  if (item.kind == 'f' && item.size == 2) return DType::f16;
  if (item.kind == 'f' && item.size == 4) return DType::f32;
  if (item.kind == 'f' && item.size == 8) return DType::f64;
  if (item.kind == 'i' && item.size == 4) return DType::i32;
  if (item.kind == 'i' && item.size == 8) return DType::i64;
  if (item.kind == 'b' && item.size == 1) return DType::boolean;
  fail("argument '", what, "': numpy dtype ", dt.attr("name").cast<std::string>(),
       " has no qkv counterpart (float16, float32, float64, int32, int64, bool); pass a copy converted with "
       ".astype(...)");
  return DType::f32;
}

py::dtype numpy_dtype_of(DType t) {
  switch (t) {
    case DType::f32:
      return py::dtype::of<float>();
    case DType::f64:
      return py::dtype::of<double>();
    case DType::i32:
      return py::dtype::of<int32_t>();
    case DType::i64:
      return py::dtype::of<int64_t>();
    case DType::bf16:
    case DType::f16:
      return py::dtype::of<uint16_t>();
    case DType::boolean:
      return py::dtype::of<bool>();
  }
  fail("unknown dtype");
  return py::dtype::of<float>();
}

// Bytes from the first element to one past the furthest one the view reaches (0 when empty).
size_t span_bytes(const Shape& shape, const Strides& strides, size_t item) {
  int64_t last = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return 0;
    last += (shape[d] - 1) * strides[d];
  }
  return static_cast<size_t>(last + 1) * item;
}

Tensor from_numpy(py::array arr, const char* what) {
  const DType dtype = dtype_of_numpy(arr.dtype(), what);
  const auto item = static_cast<int64_t>(dtype_size(dtype));
  Shape shape(arr.ndim());
  Strides strides(arr.ndim());
  for (py::ssize_t d = 0; d < arr.ndim(); ++d) {
    shape[d] = arr.shape(d);
    if (arr.shape(d) <= 1) continue;  // a stride of a dim of one position is never taken
    QKV_CHECK(arr.strides(d) >= 0, "argument '", what, "': negative stride in dim ", d,
              " cannot be shared; pass a copy (numpy.ascontiguousarray)");
    QKV_CHECK(arr.strides(d) % item == 0, "argument '", what, "': stride ", arr.strides(d), " bytes of dim ", d,
              " is not a multiple of the ", item, "-byte items; pass a copy (numpy.ascontiguousarray)");
    strides[d] = arr.strides(d) / item;
  }
  QKV_CHECK(arr.writeable(), "argument '", what,
            "' is a read-only array; qkv tensors share memory for writing, so pass a writable copy (x.copy())");
  void* data = arr.mutable_data();
  QKV_CHECK(reinterpret_cast<uintptr_t>(data) % item == 0, "argument '", what, "': data at ", data,
            " is not aligned to its ", item, "-byte items; pass a copy (numpy.ascontiguousarray)");
  return Tensor::from_external(data, span_bytes(shape, strides, item), shape, strides, dtype, Device::cpu,
                               keep_alive(arr));
}

DType dtype_of_dlpack(const DLDataType& t, const char* what) {
  QKV_CHECK(t.lanes == 1, "argument '", what, "': DLPack vector dtype (", int(t.lanes),
            " lanes) has no qkv counterpart; pass a copy with scalar elements");
  if (t.code == kDLFloat && t.bits == 16) return DType::f16;
  if (t.code == kDLFloat && t.bits == 32) return DType::f32;
  if (t.code == kDLFloat && t.bits == 64) return DType::f64;
  if (t.code == kDLBfloat && t.bits == 16) return DType::bf16;
  if (t.code == kDLInt && t.bits == 32) return DType::i32;
  if (t.code == kDLInt && t.bits == 64) return DType::i64;
  if (t.code == kDLBool && t.bits == 8) return DType::boolean;
  const char* kinds[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  fail("argument '", what, "': DLPack dtype ", t.code < 7 ? kinds[t.code] : "code " + std::to_string(t.code),
       int(t.bits),
       " has no qkv counterpart (float16, bfloat16, float32, float64, int32, int64, bool); pass a converted copy");
  return DType::f32;
}

void capsule_destructor(PyObject* capsule) {
  // Only a capsule nobody took still owns its tensor; keep any pending Python error intact.
  if (!PyCapsule_IsValid(capsule, kCapsuleName)) return;
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (m && m->deleter) m->deleter(m);
  PyErr_Restore(type, value, trace);
}

// What an exported capsule's DLManagedTensor points into: the tensor handle (keeping its storage
// alive) and the shape/strides arrays DLTensor borrows.
struct Exported {
  DLManagedTensor managed;
  Tensor tensor;
  std::vector<int64_t> shape, strides;
};

}  // namespace

Tensor from_dlpack(py::handle obj, const char* what) {
  py::object capsule;
  if (PyCapsule_CheckExact(obj.ptr())) {
    capsule = py::reinterpret_borrow<py::object>(obj);
  } else {
    QKV_CHECK(py::hasattr(obj, "__dlpack__"), "argument '", what, "' of type ", type_name(obj),
              " is neither a DLPack capsule nor an object with __dlpack__");
    if (py::hasattr(obj, "__dlpack_device__")) {
      const auto dev = obj.attr("__dlpack_device__")().cast<std::pair<int, int>>();
      QKV_CHECK(dev.first == kDLCPU, "argument '", what, "' lives on DLPack device type ", dev.first,
                " (2 = CUDA); only CPU memory can be shared; pass a CPU copy (x.cpu())");
    }
    QKV_CHECK(!(py::hasattr(obj, "requires_grad") && py::bool_(obj.attr("requires_grad"))), "argument '", what,
              "' requires grad, which DLPack cannot carry; pass x.detach() (it shares the memory)");
    try {
      capsule = obj.attr("__dlpack__")();
    } catch (py::error_already_set& e) {
      fail("argument '", what, "' cannot be shared through DLPack (", py::str(e.value()).cast<std::string>(),
           "); pass a copy");
    }
  }
  QKV_CHECK(PyCapsule_IsValid(capsule.ptr(), kCapsuleName), "argument '", what,
            "' is not an unused DLPack capsule named \"dltensor\" (a capsule can be consumed only once)");
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kCapsuleName));
  const DLTensor& t = m->dl_tensor;
  QKV_CHECK(t.device.device_type == kDLCPU, "argument '", what, "' lives on DLPack device type ", t.device.device_type,
            "; only CPU memory can be shared; pass a CPU copy");
  const DType dtype = dtype_of_dlpack(t.dtype, what);
  const auto item = static_cast<int64_t>(dtype_size(dtype));
  Shape shape(t.shape, t.shape + t.ndim);
  Strides strides = t.strides ? Strides(t.strides, t.strides + t.ndim) : contiguous_strides(shape);
  for (int d = 0; d < t.ndim; ++d) {
    if (shape[d] <= 1) {
      strides[d] = 0;
      continue;
    }
    QKV_CHECK(strides[d] >= 0, "argument '", what, "': negative stride in dim ", d,
              " cannot be shared; pass a copy (x.contiguous())");
  }
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  QKV_CHECK(reinterpret_cast<uintptr_t>(data) % item == 0, "argument '", what, "': data at ", data,
            " is not aligned to its ", item, "-byte items; pass a copy (x.clone())");
  // Taken: from here on the tensor's owner calls the deleter, and the capsule's destructor does not.
  std::shared_ptr<void> owner(m, [](void* p) {
    py::gil_scoped_acquire gil;  // a producer's deleter may release Python objects
    auto* managed = static_cast<DLManagedTensor*>(p);
    if (managed->deleter) managed->deleter(managed);
  });
  PyCapsule_SetName(capsule.ptr(), kUsedCapsuleName);
  return Tensor::from_external(data, span_bytes(shape, strides, item), shape, strides, dtype, Device::cpu,
                               std::move(owner));
}

py::capsule to_dlpack(const Tensor& t) {
  QKV_CHECK(t.defined(), "an undefined tensor has no DLPack form");
  auto* e = new Exported{{},
                         t,
                         std::vector<int64_t>(t.shape().begin(), t.shape().end()),
                         std::vector<int64_t>(t.strides().begin(), t.strides().end())};
  DLTensor& d = e->managed.dl_tensor;
  d.data = t.raw_data();
  d.device = {t.device() == Device::cpu ? kDLCPU : kDLCUDA, 0};
  d.ndim = t.dim();
  switch (t.dtype()) {
    case DType::f32:
      d.dtype = {kDLFloat, 32, 1};
      break;
    case DType::f64:
      d.dtype = {kDLFloat, 64, 1};
      break;
    case DType::f16:
      d.dtype = {kDLFloat, 16, 1};
      break;
    case DType::bf16:
      d.dtype = {kDLBfloat, 16, 1};
      break;
    case DType::i32:
      d.dtype = {kDLInt, 32, 1};
      break;
    case DType::i64:
      d.dtype = {kDLInt, 64, 1};
      break;
    case DType::boolean:
      d.dtype = {kDLBool, 8, 1};
      break;
  }
  d.shape = e->shape.data();
  d.strides = e->strides.data();
  d.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = [](DLManagedTensor* self) { delete static_cast<Exported*>(self->manager_ctx); };
  PyObject* capsule = PyCapsule_New(&e->managed, kCapsuleName, &capsule_destructor);
  if (!capsule) {
    delete e;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
}

py::tuple dlpack_device(const Tensor& t) {
  return py::make_tuple(t.device() == Device::cpu ? int(kDLCPU) : int(kDLCUDA), 0);
}

Tensor as_tensor(py::handle obj, const char* what) {
  if (py::isinstance<Tensor>(obj)) return obj.cast<Tensor>();
  QKV_CHECK(!obj.is_none(), "argument '", what, "' is None; a tensor or array is required");
  if (py::isinstance<py::array>(obj)) return from_numpy(py::reinterpret_borrow<py::array>(obj), what);
  if (PyCapsule_CheckExact(obj.ptr())) return from_dlpack(obj, what);
  if (py::hasattr(obj, "__dlpack__")) {
    // torch 1.x cannot export bool tensors through DLPack; its .numpy() shares them instead.
    if (py::hasattr(obj, "dtype") && py::hasattr(obj, "numpy") &&
        py::str(obj.attr("dtype")).cast<std::string>() == "torch.bool") {
      py::object arr;
      try {
        arr = obj.attr("numpy")();
      } catch (py::error_already_set& e) {
        fail("argument '", what, "' (a bool tensor) cannot be shared (", py::str(e.value()).cast<std::string>(),
             "); pass x.detach() or a CPU copy");
      }
      return from_numpy(py::reinterpret_borrow<py::array>(arr), what);
    }
    return from_dlpack(obj, what);
  }
  // Python numbers and sequences (and buffers) become arrays: a list is a copy, a buffer is shared.
  py::array arr = py::array::ensure(obj);
  QKV_CHECK(arr, "argument '", what, "' of type ", type_name(obj),
            " is not a tensor, an array or a sequence of numbers");
  return from_numpy(arr, what);
}

Tensor as_tensor_of(py::handle obj, const char* what, DType dtype) {
  if ((dtype == DType::bf16 || dtype == DType::f16) && py::isinstance<py::array>(obj)) {
    auto arr = py::reinterpret_borrow<py::array>(obj);
    const NumpyItem item = numpy_item(arr.dtype());
    if (item.size == 2 && item.native && (item.kind == 'u' || item.kind == 'f')) {
      Tensor t = from_numpy(py::reinterpret_borrow<py::array>(arr.attr("view")(py::dtype("float16"))), what);
      t.impl()->dtype = dtype;  // the same 16-bit words, read as `dtype`
      return t;
    }
  }
  Tensor t = as_tensor(obj, what);
  return t.dtype() == dtype ? t : t.to(dtype);
}

std::optional<Tensor> as_optional_tensor(py::handle obj, const char* what) {
  if (obj.is_none()) return std::nullopt;
  return as_tensor(obj, what);
}

py::array to_numpy(const Tensor& t) {
  QKV_CHECK(t.defined(), "an undefined tensor has no array");
  QKV_CHECK(t.device() == Device::cpu, "a ", device_name(t.device()),
            " tensor cannot be shared with numpy; copy it to the CPU first (tensor.to('cpu'))");
  const auto item = static_cast<py::ssize_t>(t.element_size());
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  std::vector<py::ssize_t> strides;
  for (int64_t s : t.strides()) strides.push_back(s * item);
  // The capsule owns a handle to the tensor: the array keeps its storage alive.
  py::capsule base(new Tensor(t), [](void* p) { delete static_cast<Tensor*>(p); });
  return py::array(numpy_dtype_of(t.dtype()), shape, strides, t.raw_data(), base);
}

DType parse_dtype(py::handle obj, const char* what) {
  std::string name = py::str(obj).cast<std::string>();
  if (name.rfind("torch.", 0) == 0) name = name.substr(6);
  constexpr DType all[] = {DType::f32, DType::f64, DType::i32, DType::i64, DType::bf16, DType::f16, DType::boolean};
  for (DType t : all)
    if (name == dtype_name(t)) return t;
  fail("argument '", what, "' = '", name,
       "' is not a qkv dtype (float32, float64, int32, int64, bfloat16, float16, bool)");
  return DType::f32;
}

}  // namespace qkv::python
