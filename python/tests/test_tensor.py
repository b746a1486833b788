"""qkv.Tensor and its zero-copy crossings: numpy (buffer protocol) and torch (DLPack), both ways.

Sharing is proven by addresses (the qkv tensor's data_ptr equals the source's) and by writes seen
on the other side; lifetime by deleting one side and reading the other after gc.collect().
"""
import ctypes
import gc

import numpy as np
import pytest

import qkv

# The reference (and half of the sharing) is PyTorch's; scripts/test.sh installs python3-torch. The
# numpy tests run without it too (scripts/test.sh's numpy 2 stage has no torch).
try:
    import torch
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

NUMPY_DTYPES = [np.float32, np.float64, np.int32, np.int64, np.bool_]


def addr(a):
    return a.__array_interface__["data"][0]


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_to_qkv_shares_memory(dtype):
    a = (np.arange(12) % 3 == 1).astype(dtype).reshape(3, 4) if dtype == np.bool_ else np.arange(12, dtype=dtype).reshape(3, 4)
    t = qkv.tensor(a)
    assert t.shape == (3, 4) and t.strides == (4, 1) and t.ndim == 2 and t.numel() == 12
    assert t.dtype == np.dtype(dtype).name and t.device == "cpu"
    assert t.data_ptr() == addr(a)
    b = np.asarray(t)
    assert addr(b) == addr(a) and b.dtype == a.dtype
    np.testing.assert_array_equal(b, a)
    # Writes on either side are seen on the other.
    a[1, 2] = 0
    assert b[1, 2] == 0 and t.tolist()[1][2] == 0
    b[2, 3] = 1
    assert a[2, 3] == 1


def test_numpy_and_buffer_protocol_of_a_qkv_result():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    c = qkv.tensor(a, copy=True)  # memory qkv allocated
    assert c.data_ptr() != addr(a)
    n = c.numpy()
    m = np.asarray(memoryview(c))
    assert addr(n) == c.data_ptr() == addr(m)
    n[0, 0] = 42
    assert m[0, 0] == 42 and c.tolist()[0][0] == 42 and a[0, 0] == 0


@pytest.mark.parametrize(
    "view",
    [lambda a: a.T, lambda a: a[:, ::2], lambda a: a[1:, 1::3], lambda a: a[::2, 1:3].T],
    ids=["transposed", "stepped", "offset_stepped", "stepped_transposed"],
)
def test_numpy_strided_views_are_kept(view):
    base = np.arange(48, dtype=np.float64).reshape(6, 8)
    a = view(base)
    t = qkv.tensor(a)
    assert t.shape == a.shape
    assert t.strides == tuple(s // 8 for s in a.strides)
    assert t.data_ptr() == addr(a)
    np.testing.assert_array_equal(np.asarray(t), a)
    assert t.tolist() == a.tolist()  # reads follow the strides
    np.asarray(t)[0, 0] = -1
    assert a[0, 0] == -1
    assert t.is_contiguous() == a.flags.c_contiguous
    c = t.contiguous()
    assert c.is_contiguous() and np.array_equal(np.asarray(c), a)


# torch's dtypes by their names, which are qkv's.
TORCH_DTYPE_NAMES = ["float32", "float64", "int32", "int64", "bfloat16", "float16", "bool"]


@needs_torch
@pytest.mark.parametrize("name", TORCH_DTYPE_NAMES)
def test_torch_to_qkv_and_back_shares_memory(name):
    dtype = getattr(torch, name)
    x = (torch.arange(12) % 3 == 0) if dtype == torch.bool else torch.arange(12).to(dtype)
    x = x.reshape(3, 4)
    t = qkv.tensor(x)
    assert t.dtype == name and t.shape == (3, 4) and t.data_ptr() == x.data_ptr()
    expect = x.to(torch.float64).tolist()
    if dtype in (torch.bfloat16, torch.float16):  # stored words, and values through to()
        assert t.to("float32").tolist() == expect
    else:
        assert t.tolist() == expect
    # Back to torch: through DLPack (torch 1.13 exports and imports no bool; numpy shares those).
    y = torch.from_numpy(t.numpy()) if dtype == torch.bool else torch.from_dlpack(t)
    assert y.data_ptr() == x.data_ptr() and y.dtype == dtype and torch.equal(y, x)
    x[0, 1] = 1
    assert y[0, 1] == 1
    y[2, 3] = 0
    assert x[2, 3] == 0


@needs_torch
def test_qkv_from_dlpack_of_capsules_and_producers():
    x = torch.linspace(0, 1, 10, dtype=torch.float64)
    capsule = torch.utils.dlpack.to_dlpack(x)
    t = qkv.from_dlpack(capsule)
    assert t.data_ptr() == x.data_ptr() and t.tolist() == x.tolist()
    with pytest.raises(qkv.Error, match="consumed only once"):
        qkv.from_dlpack(capsule)
    # numpy 1.24 arrays are producers too.
    a = np.arange(5, dtype=np.int64)
    assert qkv.from_dlpack(a).data_ptr() == addr(a)
    with pytest.raises(qkv.Error, match="argument 'x'.*neither a DLPack capsule"):
        qkv.from_dlpack([1, 2])
    # A qkv capsule read by numpy's consumer.
    q = qkv.tensor(np.arange(4, dtype=np.float32))
    assert addr(np.from_dlpack(q)) == q.data_ptr()
    assert q.__dlpack_device__() == (1, 0)


@needs_torch
@pytest.mark.parametrize("view", [lambda x: x.t(), lambda x: x[:, ::3], lambda x: x[1:, 2:].t()[::2]],
                         ids=["transposed", "stepped", "offset_transposed_stepped"])
def test_torch_strided_views_are_kept(view):
    base = torch.arange(30, dtype=torch.float32).reshape(5, 6)
    x = view(base)
    t = qkv.tensor(x)
    assert t.data_ptr() == x.data_ptr()
    assert t.shape == tuple(x.shape)
    assert all(s == xs for s, xs, n in zip(t.strides, x.stride(), x.shape) if n > 1)
    assert t.tolist() == x.tolist()
    y = torch.from_dlpack(t)
    assert y.data_ptr() == x.data_ptr() and torch.equal(y, x)
    y[0, 0] = -5
    assert x[0, 0] == -5


@needs_torch
def test_bf16_from_uint16_words_is_reinterpreted_in_place():
    words = torch.tensor([1.0, -2.5, 3.0e38], dtype=torch.bfloat16).view(torch.int16).numpy().view(np.uint16).copy()
    t = qkv.tensor(words, dtype="bfloat16")
    assert t.dtype == "bfloat16" and t.data_ptr() == addr(words)
    assert t.to("float32").tolist() == torch.tensor([1.0, -2.5, 3.0e38], dtype=torch.bfloat16).float().tolist()
    assert np.asarray(t).dtype == np.uint16 and np.shares_memory(np.asarray(t), words)
    assert qkv.tensor(np.array([1.0], np.float32), dtype=torch.float32).dtype == "float32"


def test_float16_from_uint16_words_and_dtype_conversions():
    h = np.array([1.5, -0.25], np.float16)
    t16 = qkv.tensor(h.view(np.uint16), dtype="float16")
    assert t16.data_ptr() == addr(h) and t16.to("float64").tolist() == [1.5, -0.25]
    # Another dtype converts (a copy); copy=True always copies.
    f = np.array([1.0, 2.0], np.float32)
    d = qkv.tensor(f, dtype="float64")
    assert d.dtype == "float64" and d.data_ptr() != addr(f) and d.tolist() == [1.0, 2.0]
    assert qkv.tensor(f, copy=True).data_ptr() != addr(f)
    assert qkv.tensor(f, dtype=np.dtype("float32")).data_ptr() == addr(f)
    assert qkv.tensor(f, dtype="float32").data_ptr() == addr(f)
    # Words in the other byte order are not this machine's float16: refused, not misread.
    with pytest.raises(qkv.Error, match=r"byte order"):
        qkv.tensor(h.view(np.uint16).byteswap().view(h.dtype.newbyteorder()), dtype="float16")


def test_what_cannot_be_shared_is_refused_naming_the_argument():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    with pytest.raises(qkv.Error, match=r"argument 'obj': negative stride in dim 0 .*copy"):
        qkv.tensor(a[::-1])
    raw = np.zeros(17, np.uint8)
    unaligned = raw[1:].view(np.float32)
    with pytest.raises(qkv.Error, match=r"argument 'obj'.* not aligned .*copy"):
        qkv.tensor(unaligned)
    ro = np.ones(3, np.float32)
    ro.setflags(write=False)
    with pytest.raises(qkv.Error, match=r"argument 'obj' is a read-only array.*copy"):
        qkv.tensor(ro)
    with pytest.raises(qkv.Error, match=r"argument 'obj': numpy dtype complex64 has no qkv counterpart"):
        qkv.tensor(np.ones(3, np.complex64))
    with pytest.raises(qkv.Error, match=r"argument 'obj': numpy dtype uint8"):
        qkv.tensor(np.ones(3, np.uint8))
    with pytest.raises(qkv.Error, match=r"argument 'obj': numpy dtype >f4 is not in this machine's byte order"):
        qkv.tensor(np.ones(3, np.dtype(">f4")))
    with pytest.raises(qkv.Error, match=r"argument 'obj': negative stride .*copy"):
        qkv.tensor(_negative_stride_producer())
    with pytest.raises(qkv.Error, match=r"argument 'obj' lives on DLPack device type 2.*CPU copy"):
        qkv.tensor(_FakeCuda())
    with pytest.raises(qkv.Error, match=r"argument 'obj' is None"):
        qkv.tensor(None)
    with pytest.raises(qkv.Error, match=r"argument 'dtype' = 'float8' is not a qkv dtype"):
        qkv.tensor(a, dtype="float8")


@needs_torch
def test_what_torch_cannot_share_is_refused_naming_the_argument():
    with pytest.raises(qkv.Error, match=r"argument 'obj': DLPack dtype complex64 has no qkv counterpart"):
        qkv.tensor(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(qkv.Error, match=r"argument 'obj': DLPack dtype uint8"):
        qkv.tensor(torch.ones(2, dtype=torch.uint8))
    with pytest.raises(qkv.Error, match=r"argument 'obj' requires grad.*x.detach\(\)"):
        qkv.tensor(torch.ones(2, requires_grad=True))


def _negative_stride_producer():
    """A producer handing out a negative stride (torch itself refuses to build one)."""
    a = np.arange(4, dtype=np.float32)[::-1]

    class Producer:
        def __dlpack__(self, stream=None):
            return a.__dlpack__()

        def __dlpack_device__(self):
            return (1, 0)

    return Producer()


class _FakeCuda:
    def __dlpack__(self, stream=None):
        raise AssertionError("a non-CPU producer is refused before its capsule is taken")

    def __dlpack_device__(self):
        return (2, 0)


def test_properties_repr_and_conversions():
    t = qkv.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert repr(t) == "qkv.Tensor(shape=(2, 3), dtype=float32, device=cpu)"
    assert len(t) == 2 and t.dim() == 2
    d = t.to("float64")
    assert d.dtype == "float64" and d.tolist() == [[0, 1, 2], [3, 4, 5]] and d.data_ptr() != t.data_ptr()
    c = t.clone()
    assert c.data_ptr() != t.data_ptr() and c.tolist() == t.tolist()
    assert t.contiguous().data_ptr() == t.data_ptr()
    assert t.grad is None and not t.requires_grad and t.is_leaf
    t.requires_grad = True
    assert t.requires_grad and "requires_grad=True" in repr(t)
    with pytest.raises(qkv.Error, match="dtype"):
        t.to("complex")


@needs_torch
def test_lifetime_qkv_keeps_numpy_and_torch_sources_alive():
    a = np.arange(1000, dtype=np.float64)
    t = qkv.tensor(a)
    del a
    gc.collect()
    _scribble()
    assert t.tolist() == list(range(1000))
    x = torch.arange(1000, dtype=torch.float32) * 2
    u = qkv.tensor(x)
    del x
    gc.collect()
    _scribble()
    assert u.tolist() == [2.0 * i for i in range(1000)]


@needs_torch
def test_lifetime_numpy_and_torch_keep_qkv_storage_alive():
    t = qkv.tensor(np.arange(1000, dtype=np.float64), copy=True)  # qkv-owned memory
    n = t.numpy()
    m = np.asarray(t)
    y = torch.from_dlpack(t)
    capsule = t.__dlpack__()
    del t
    gc.collect()
    _scribble()
    assert n.tolist() == list(range(1000)) and m.tolist() == list(range(1000))
    assert y.tolist() == list(range(1000))
    assert qkv.from_dlpack(capsule).tolist() == list(range(1000))


@needs_torch
def test_capsules_hold_the_storage_until_released():
    import sys

    src = np.arange(8, dtype=np.float32)
    base = sys.getrefcount(src)
    t = qkv.tensor(src)
    assert sys.getrefcount(src) == base + 1  # the storage's owner
    unused = [t.__dlpack__() for _ in range(10)]
    taken = torch.from_dlpack(t.__dlpack__())
    del t
    gc.collect()
    assert sys.getrefcount(src) == base + 1  # the capsules and torch's tensor still hold it
    del unused
    gc.collect()
    assert sys.getrefcount(src) == base + 1  # torch's tensor still does
    assert taken.tolist() == list(range(8))
    del taken  # torch calls the deleter
    gc.collect()
    assert sys.getrefcount(src) == base


def _scribble():
    """Allocate and fill memory so that a freed buffer would likely be overwritten."""
    for _ in range(20):
        np.full(1000, -7.0).sum()
        torch.full((1000,), -7.0).sum()
