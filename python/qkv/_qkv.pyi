"""Type stubs of qkv._qkv, the C++ core as a module (python/src/). The package `qkv` re-exports every
public name. python/tests/test_stubs.py checks that these stubs and the module name the same things
with the same parameters and defaults."""

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt

# What a tensor argument takes: a qkv.Tensor; a numpy array or buffer (shared); anything with
# __dlpack__, such as a torch tensor (shared); a DLPack capsule; nested lists or numbers (copied).
_TensorLike: TypeAlias = Any
# A dtype by its qkv name ('float32', 'bfloat16', ...), a numpy dtype or a torch dtype.
_DTypeLike: TypeAlias = Any
# A config: a TOML file's path, TOML text, or a dict of sections.
_ConfigLike: TypeAlias = str | Mapping[str, Any]
# Token ids: a sequence of ints, or a 1-D ([N]) / 2-D ([B, N]) integer tensor or array.
_Ids: TypeAlias = Any
# A sparse attention pattern: a name ('strided', ...) or a dict of the SparsePattern fields.
_Pattern: TypeAlias = str | Mapping[str, Any]

# The package's version (pyproject.toml's), the same as `qkv --version` prints.
__version__: str

class Error(RuntimeError):
    """An error of the C++ core or of a binding's arguments; its text is the line the CLI prints after 'qkv: '."""

class Tensor:
    """A view over qkv memory: shape, strides (in elements), dtype, device. Shares memory with numpy
    (np.asarray(t), t.numpy()) and DLPack consumers (torch.from_dlpack(t))."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def ndim(self) -> int: ...
    @property
    def requires_grad(self) -> bool: ...
    @requires_grad.setter
    def requires_grad(self, arg1: bool) -> None: ...
    @property
    def grad(self) -> Tensor | None: ...
    @property
    def is_leaf(self) -> bool: ...
    def numel(self) -> int: ...
    def dim(self) -> int: ...
    def __len__(self) -> int: ...
    def data_ptr(self) -> int: ...
    def is_contiguous(self) -> bool: ...
    def backward(self, grad: _TensorLike | None = None) -> None: ...
    def detach(self) -> Tensor: ...
    def numpy(self) -> npt.NDArray[Any]: ...
    def __array__(self, dtype: Any = None) -> npt.NDArray[Any]: ...
    def __dlpack__(self, stream: Any = None) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def to(self, target: _DTypeLike | Literal["cpu", "cuda"]) -> Tensor: ...
    def contiguous(self) -> Tensor: ...
    def clone(self) -> Tensor: ...
    def tolist(self) -> Any: ...
    def item(self) -> float: ...
    def __repr__(self) -> str: ...

def tensor(obj: _TensorLike, copy: bool = False, dtype: _DTypeLike | None = None) -> Tensor: ...
def from_dlpack(x: Any) -> Tensor: ...
def attention(
    q: _TensorLike,
    k: _TensorLike,
    v: _TensorLike,
    *,
    scale: float | None = None,
    causal: bool = False,
    window: int = 0,
    key_padding: _TensorLike | None = None,
    key_lengths: Sequence[int] | _TensorLike | None = None,
    allow_mask: _TensorLike | None = None,
    bias: _TensorLike | None = None,
    alibi_slopes: Sequence[float] | _TensorLike | None = None,
    segment_ids: _TensorLike | None = None,
    pattern: _Pattern | None = None,
    dropout_p: float = 0.0,
    dropout_seed: int = 0,
    dropout_offset: int = 0,
    fully_masked: Literal["zero", "error"] = "zero",
    kernel: Literal["fused", "reference"] = "fused",
    check_invariants: bool = False,
) -> Tensor: ...
def attention_vjp(
    q: _TensorLike,
    k: _TensorLike,
    v: _TensorLike,
    grad_out: _TensorLike,
    *,
    scale: float | None = None,
    causal: bool = False,
    window: int = 0,
    key_padding: _TensorLike | None = None,
    key_lengths: Sequence[int] | _TensorLike | None = None,
    allow_mask: _TensorLike | None = None,
    bias: _TensorLike | None = None,
    alibi_slopes: Sequence[float] | _TensorLike | None = None,
    segment_ids: _TensorLike | None = None,
    pattern: _Pattern | None = None,
    dropout_p: float = 0.0,
    dropout_seed: int = 0,
    dropout_offset: int = 0,
    fully_masked: Literal["zero", "error"] = "zero",
    kernel: Literal["fused", "reference"] = "fused",
    check_invariants: bool = False,
) -> tuple[Tensor, Tensor, Tensor]: ...
def gradcheck_attention(
    q: _TensorLike | None = None,
    k: _TensorLike | None = None,
    v: _TensorLike | None = None,
    *,
    eps: float = 1e-06,
    atol: float = 1e-05,
    rtol: float = 0.001,
    seed: int = 1234,
    only: str | None = None,
    scale: float | None = None,
    causal: bool = False,
    window: int = 0,
    key_padding: _TensorLike | None = None,
    key_lengths: Sequence[int] | _TensorLike | None = None,
    allow_mask: _TensorLike | None = None,
    bias: _TensorLike | None = None,
    alibi_slopes: Sequence[float] | _TensorLike | None = None,
    segment_ids: _TensorLike | None = None,
    pattern: _Pattern | None = None,
    dropout_p: float = 0.0,
    dropout_seed: int = 0,
    dropout_offset: int = 0,
    fully_masked: Literal["zero", "error"] = "zero",
    kernel: Literal["fused", "reference"] = "fused",
    check_invariants: bool = False,
) -> dict[str, Any]: ...
def linear_attention(
    q: _TensorLike,
    k: _TensorLike,
    v: _TensorLike,
    *,
    feature: Literal["elu1", "relu", "favor"] = "elu1",
    causal: bool = False,
    chunk: int = 64,
    scale: float | None = None,
    eps: float = 1e-06,
    key_padding: _TensorLike | None = None,
    segment_ids: _TensorLike | None = None,
    projection: _TensorLike | None = None,
    features: int | None = None,
    seed: int = 0,
) -> Tensor: ...

class Tokenizer:
    """A model's tokenizer (Model.tokenizer)."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def kind(self) -> str: ...
    def encode(self, text: str) -> list[int]: ...
    def decode_bytes(self, ids: Sequence[int]) -> bytes: ...
    def decode(self, ids: Sequence[int]) -> str: ...

class Model:
    """A model loaded for inference (qkv.load)."""

    def __repr__(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def numerics(self) -> str: ...
    @property
    def threads(self) -> int: ...
    @property
    def device(self) -> str: ...
    @property
    def config(self) -> dict[str, Any]: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def step(self) -> int: ...
    @property
    def tokenizer(self) -> Tokenizer | None: ...
    def parameters(self) -> dict[str, Tensor]: ...
    def logits(self, ids: _Ids) -> Tensor: ...
    def loss(self, ids: _Ids, targets: _Ids) -> float: ...
    def token_logprobs(self, ids: _Ids) -> npt.NDArray[np.float64]: ...
    def generate(
        self,
        prompts: str | _Ids | Sequence[str | Sequence[int]],
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        batch_size: int = 1,
        logprobs: bool = False,
        kv_cache: bool = True,
    ) -> Any: ...
    def gradcheck(
        self,
        directions: int = 4,
        elements: int = 4,
        seed: int = 1234,
        eps: float = 1e-05,
        rtol: float = 1e-05,
        atol: float = 1e-08,
        only: str = "",
    ) -> dict[str, Any]: ...

def load(
    path: str,
    device: Literal["cpu", "cuda"] = "cpu",
    numerics: Literal["standard", "invariant"] | None = None,
    tokenizer: str = "",
    threads: int | None = None,
) -> Model: ...
def train(
    config: _ConfigLike,
    overrides: str | Sequence[str] = (),
    callback: Callable[[dict[str, Any]], bool | None] | None = None,
    out_dir: str | None = None,
    quiet: bool = True,
    resume: str = "",
    init_from: str = "",
    overwrite: bool = False,
    numerics: Literal["standard", "invariant"] | None = None,
    change_global_batch: bool = False,
) -> dict[str, Any]: ...
def leakcheck(
    model: Model,
    checks: str | Sequence[str] | None = None,
    numerics: Literal["standard", "invariant"] | None = None,
    ngram: int = 32,
    max_ngram_share: float = 0.05,
    consistency: bool = True,
    self_test: bool = False,
) -> dict[str, Any]: ...
def consistency(model: Model) -> dict[str, Any]: ...
def attention_map(
    model: Model, input: str | _Ids, layer: int | None = None, head: int | None = None
) -> npt.NDArray[np.float32]: ...
def heads(
    model: Model,
    input: str | _Ids,
    windows: int = 16,
    length: int = 0,
    separators: str | None = None,
    local_span: int = 4,
    peak_threshold: float = 0.5,
    local_threshold: float = 0.7,
    broad_threshold: float = 0.8,
) -> dict[str, Any]: ...
def cost(config: _ConfigLike, overrides: Sequence[str] = [], context: int = 0, vocab: int = 0) -> dict[str, Any]: ...
def study(
    config: _ConfigLike,
    variants: str | Sequence[str],
    overrides: Sequence[str] = [],
    lengths: Sequence[int] = [256, 1024, 4096],
    budget_tokens: int = 0,
    decode_tokens: int = 16,
    eval_tokens: int = 8192,
    checks: bool = True,
    dir: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]: ...
