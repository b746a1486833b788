"""qkv.attention / attention_vjp against an independent float64 torch reference.

torch 1.13 has no scaled_dot_product_attention, so the reference is the formula of
attention/attention.h written out: S = scale·Q·Kᵀ + bias + alibi, every mask ANDed into one boolean
`visible` built here from the header's definitions (pattern masks included), P = softmax(S'), rows
with no visible key -> zero, O = (P ∘ Z)·V; gradients by torch autograd of that expression. The
dropout multipliers Z come from a Philox4x32-10 written here from its definition (checked against
Random123's known answer), with the counter layout the header states.
"""
import math

import numpy as np
import pytest

import qkv

# The reference (and half of the sharing) is PyTorch's; scripts/test.sh installs python3-torch.
torch = pytest.importorskip("torch")

B, HQ, N, D = 2, 4, 16, 8


# ---------------------------------------------------------------- Philox4x32-10 (numpy, vectorised)
M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
MASK = 0xFFFFFFFF


def philox(c0, c1, c2, c3, k0, k1):
    u, m = np.uint64, np.uint64(MASK)
    c = [np.asarray(x).astype(u) & m for x in np.broadcast_arrays(c0, c1, c2, c3)]
    k0, k1 = u(int(k0) & MASK), u(int(k1) & MASK)
    for _ in range(10):
        p0, p1 = u(M0) * c[0], u(M1) * c[2]
        hi0, lo0 = p0 >> u(32), p0 & m
        hi1, lo1 = p1 >> u(32), p1 & m
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
        k0, k1 = (k0 + u(W0)) & m, (k1 + u(W1)) & m
    return c


def test_philox_reference_matches_random123_known_answer():
    x = philox(0, 0, 0, 0, 0, 0)
    assert [int(v) for v in x] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


def dropout_z(shape, p, seed, offset):
    """Z [B,Hq,Nq,Nk] of attention.h: keep iff (x >> 8) >= ceil(p·2^24); kept weights are 1/(1-p)."""
    b_, hq, nq, nk = shape
    b, h, i, j = np.meshgrid(np.arange(b_), np.arange(hq), np.arange(nq), np.arange(nk), indexing="ij")
    k0, k1 = seed & MASK, ((seed >> 32) ^ (offset >> 32)) & MASK
    words = philox(j // 4, i, b * hq + h, np.full_like(j, offset & MASK), k0, k1)
    x = np.choose(j % 4, words)
    keep = (x >> np.uint64(8)) >= np.uint64(math.ceil(p * 2**24))
    return torch.from_numpy(keep.astype(np.float64) / (1 - p))


# ---------------------------------------------------------------- pattern masks from the formulas
def pattern_allows(spec, nk, causal):
    """allows(p, j) of attention.h's pattern list, as a function of position arrays."""
    kind = spec["kind"]
    bs = spec.get("block_size", 64)
    if kind == "full":
        return lambda p, j: np.ones(np.broadcast(p, j).shape, bool)
    if kind == "window":
        l = spec.get("local") or bs
        return lambda p, j: abs(p - j) < l
    if kind == "strided":
        s = spec.get("stride") or math.ceil(math.sqrt(nk))
        l = spec.get("local") or s
        return lambda p, j: (abs(p - j) < l) | ((p - j) % s == 0)

    def globals_():
        return np.array(spec["global_tokens"]) if "global_tokens" in spec else np.arange(spec.get("global", 1))

    if kind == "global":
        l, g = spec.get("local") or 1, globals_()
        return lambda p, j: (abs(p - j) < l) | np.isin(p, g) | np.isin(j, g)
    if kind == "bigbird":
        l, g, r, seed = spec.get("local") or bs, globals_(), spec.get("random_blocks", 2), spec.get("seed", 0)

        def allows(p, j):
            qb, kb = p // bs, j // bs
            m = qb + 1 if causal else -(-nk // bs)
            hit = np.zeros(np.broadcast(p, j).shape, bool)
            for k in range(r):
                x = philox(qb, k, 0x5BA25E00, qb >> 32, seed & MASK, seed >> 32)
                X = (x[0] << np.uint64(32)) | x[1]
                hit |= kb == (X % np.asarray(m, dtype=np.uint64)).astype(np.int64)
            return (abs(p - j) < l) | np.isin(p, g) | np.isin(j, g) | hit

        return allows
    if kind == "block_sparse":
        layout = spec.get("layout", "local_global")
        if layout == "local_global":
            return lambda p, j: (abs(p // bs - j // bs) <= 1) | (j // bs == 0) | (p // bs == 0)
        if layout == "fixed":
            return lambda p, j: (j // bs == p // bs) | (j // bs % 4 == 3)
        table = np.array(spec["table"], bool)
        return lambda p, j: table[p // bs, j // bs]
    raise AssertionError(kind)


# ---------------------------------------------------------------- the reference
def reference(q, k, v, scale=None, causal=False, window=0, key_padding=None, key_lengths=None, allow_mask=None,
              bias=None, alibi_slopes=None, segment_ids=None, pattern=None, z=None):
    """float64 torch: (out, visible); differentiable in q, k, v."""
    b_, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    g = hq // hkv
    kk, vv = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = (1 / math.sqrt(d)) if scale is None else scale
    S = s * q @ kk.transpose(-1, -2)
    pos = np.arange(nq) + nk - nq
    P, J = pos[:, None], np.arange(nk)[None, :]
    vis = np.ones((b_, hq, nq, nk), bool)
    if causal:
        vis &= J <= P
    if window:
        vis &= (P - window < J) & (J <= P)
    if key_padding is not None:
        vis &= np.asarray(key_padding)[:, None, None, :]
    if key_lengths is not None:
        vis &= J[None, None] < np.asarray(key_lengths)[:, None, None, None]
    if segment_ids is not None:
        seg = np.asarray(segment_ids)
        vis &= seg[:, None, pos, None] == seg[:, None, None, :]
    if allow_mask is not None:
        vis &= np.broadcast_to(np.asarray(allow_mask), vis.shape)
    if pattern is not None:
        spec = {"kind": pattern} if isinstance(pattern, str) else pattern
        vis &= pattern_allows(spec, nk, causal or window > 0)(P, J)
    if bias is not None:
        S = S + torch.as_tensor(np.asarray(bias), dtype=torch.float64)
    if alibi_slopes is not None:
        # AttentionOptions holds the slopes as float32: the reference uses the same numbers.
        slopes = torch.tensor(alibi_slopes, dtype=torch.float32).double()[None, :, None, None]
        S = S - slopes * torch.as_tensor(P - J, dtype=torch.float64)
    visible = torch.from_numpy(vis)
    S = S.masked_fill(~visible, -math.inf)
    row = torch.isfinite(S).any(-1, keepdim=True)  # a bias of -inf masks too
    Pw = torch.softmax(S.masked_fill(~row, 0.0), dim=-1) * row
    if z is not None:
        Pw = Pw * z
    return Pw @ vv, vis


def inputs(dtype=np.float64, hkv=2, nq=N, nk=N, seed=0, dv=D):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, HQ, nq, D)).astype(dtype)
    k = rng.standard_normal((B, hkv, nk, D)).astype(dtype)
    v = rng.standard_normal((B, hkv, nk, dv)).astype(dtype)
    go = rng.standard_normal((B, HQ, nq, dv)).astype(dtype)
    return q, k, v, go


def check(q, k, v, go, kernel="fused", z=None, **opts):
    """Forward and vjp of qkv against the reference; returns the visibility mask."""
    dtype = q.dtype
    tol = dict(atol=2e-5, rtol=2e-4) if dtype == np.float32 else dict(atol=1e-10, rtol=1e-9)
    qkv_opts = dict(opts)
    if isinstance(qkv_opts.get("pattern"), dict) and "table" in qkv_opts["pattern"]:
        qkv_opts["pattern"] = {k_: v_ for k_, v_ in qkv_opts["pattern"].items() if k_ != "table"}
    out = np.asarray(qkv.attention(q, k, v, kernel=kernel, **qkv_opts))
    assert out.dtype == dtype
    t = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v)]
    ref, vis = reference(*t, z=z, **{k_: v_ for k_, v_ in opts.items() if not k_.startswith("dropout")})
    np.testing.assert_allclose(out, ref.detach().numpy(), **tol)
    dq, dk, dv = qkv.attention_vjp(q, k, v, go, kernel=kernel, **qkv_opts)
    ref.backward(torch.from_numpy(go.astype(np.float64)))
    for got, want in zip((dq, dk, dv), t):
        np.testing.assert_allclose(np.asarray(got), want.grad.numpy(), **tol)
    return vis


def grid_kwargs():
    rng = np.random.default_rng(7)
    kp = np.ones((B, N), bool)
    kp[0, 11:] = False
    kp[1, :3] = False
    seg = np.repeat([[0, 0, 1, 1]], B, 0).repeat(N // 4, 1).astype(np.int64)
    seg[1] = np.repeat([0, 1, 2, 3], 4)
    allow = rng.random((B, 1, N, N)) < 0.6
    bias = rng.standard_normal((1, HQ, N, N))
    bias[0, 1, 3, :5] = -np.inf
    return {
        "none": {},
        "causal": dict(causal=True),
        "window": dict(window=5),
        "key_padding": dict(key_padding=kp),
        "key_padding_causal": dict(key_padding=kp, causal=True),
        "key_lengths": dict(key_lengths=[9, 16]),
        "allow_mask": dict(allow_mask=allow),
        "bias": dict(bias=bias),
        "alibi": dict(alibi_slopes=[0.5, 0.25, 0.125, 0.0625], causal=True),
        "segment_ids": dict(segment_ids=seg, causal=True),
        "scale": dict(scale=0.7),
        "all": dict(causal=True, key_padding=kp, key_lengths=[14, 15], allow_mask=allow, bias=bias,
                    alibi_slopes=[0.1, 0.2, 0.3, 0.4], segment_ids=seg),
    }


GRID = grid_kwargs()


# Every mask on the fused kernel; the reference kernel (the composed graph) on a subset.
KERNEL_CASES = [(c, "fused") for c in GRID] + [(c, "reference") for c in ("causal", "key_padding", "bias", "alibi", "all")]


@pytest.mark.parametrize("case,kernel", KERNEL_CASES)
def test_every_mask_kind_float64(case, kernel):
    check(*inputs(np.float64), kernel=kernel, **GRID[case])


@pytest.mark.parametrize("case", ["none", "causal", "window", "all"])
def test_float32(case):
    check(*inputs(np.float32), **GRID[case])


@pytest.mark.parametrize("hkv", [2, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_and_mqa(hkv, causal):
    check(*inputs(np.float64, hkv=hkv, seed=hkv), causal=causal)


def test_fewer_queries_than_keys_are_bottom_right_aligned():
    q, k, v, go = inputs(np.float64, nq=5, nk=N)
    vis = check(q, k, v, go, causal=True, window=4, alibi_slopes=[0.5, 0.4, 0.3, 0.2])
    assert vis[0, 0, 0].nonzero()[0].tolist() == [8, 9, 10, 11]  # row 0 sits at position 11


PATTERNS = [
    {"kind": "window", "local": 3},
    {"kind": "strided", "stride": 4, "local": 2},
    "strided",  # s = ceil(sqrt(16)) = 4, l = s
    {"kind": "global", "local": 2, "global": 2},
    {"kind": "global", "local": 1, "global_tokens": [3, 9]},
    {"kind": "bigbird", "block_size": 4, "local": 2, "random_blocks": 1, "seed": 11, "global": 1},
    {"kind": "bigbird", "block_size": 4, "random_blocks": 2, "seed": 123456789012, "global_tokens": [5]},
    {"kind": "block_sparse", "block_size": 4},
    {"kind": "block_sparse", "block_size": 2, "layout": "fixed"},
]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: p if isinstance(p, str) else "-".join(map(str, p.values())))
def test_every_sparse_pattern(pattern, causal):
    vis = check(*inputs(np.float64, seed=3), pattern=pattern, causal=causal)
    assert 0 < vis.sum() < vis.size  # the pattern removed something and kept something


def test_block_sparse_layout_file(tmp_path):
    table = [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [1, 0, 0, 1]]
    f = tmp_path / "layout.txt"
    f.write_text("# query block rows\n" + "\n".join(" ".join(map(str, r)) for r in table) + "\n")
    spec = {"kind": "block_sparse", "block_size": 4, "layout": str(f), "table": table}
    check(*inputs(np.float64, seed=4), pattern=spec, causal=True)


def test_fully_masked_rows_give_zero_output_and_zero_grads():
    q, k, v, go = inputs(np.float64, seed=5)
    kp = np.ones((B, N), bool)
    kp[1, :6] = False  # left padding: under causal, rows 0..5 of batch 1 see nothing
    vis = check(q, k, v, go, causal=True, key_padding=kp, key_lengths=[0, 16])  # batch 0 sees nothing at all
    assert not vis[0].any() and not vis[1, :, :6].any()
    out = np.asarray(qkv.attention(q, k, v, causal=True, key_padding=kp, key_lengths=[0, 16]))
    assert np.all(out[0] == 0) and np.all(out[1, :, :6] == 0) and np.isfinite(out).all()
    dq, dk, dv = (np.asarray(t) for t in qkv.attention_vjp(q, k, v, go, causal=True, key_padding=kp, key_lengths=[0, 16]))
    assert np.all(dq[0] == 0) and np.all(dk[0] == 0) and np.all(dv[0] == 0) and np.all(dq[1, :, :6] == 0)
    with pytest.raises(qkv.Error, match=r"query row 0 of batch 0, head 0 has no visible key"):
        qkv.attention(q, k, v, key_lengths=[0, 16], fully_masked="error")


@pytest.mark.parametrize("kernel", ["fused", "reference"])
def test_a_row_emptied_by_minus_inf_bias_is_zero_not_nan(kernel):
    q, k, v, go = inputs(np.float64, seed=11)
    bias = np.zeros((1, 1, N, N))
    bias[0, 0, 2, :] = -np.inf  # row 2 of every (b, h): no key left
    bias[0, 0, 7, :8] = -np.inf  # row 7 under causal: keys 0..7 visible, all at -inf
    check(q, k, v, go, kernel=kernel, bias=bias, causal=True)
    out = np.asarray(qkv.attention(q, k, v, kernel=kernel, bias=bias, causal=True))
    assert np.all(out[:, :, 2] == 0) and np.all(out[:, :, 7] == 0) and np.isfinite(out).all()


def test_torch_tensors_and_strided_views_go_in_directly():
    q, k, v, go = inputs(np.float64, seed=6)
    tq = torch.from_numpy(q.transpose(0, 2, 1, 3).copy()).transpose(1, 2)  # a strided [B,Hq,N,D] view
    out = qkv.attention(tq, torch.from_numpy(k), torch.from_numpy(v), causal=True)
    ref, _ = reference(*(torch.from_numpy(x) for x in (q, k, v)), causal=True)
    torch.testing.assert_close(torch.from_dlpack(out), ref, atol=1e-10, rtol=1e-9)


# ---------------------------------------------------------------- dropout
def test_dropout_matches_the_documented_philox_mask():
    q, k, v, go = inputs(np.float64, seed=8)
    p, seed, offset = 0.3, (7 << 32) | 99, (5 << 32) | 1234
    z = dropout_z((B, HQ, N, N), p, seed, offset)
    for kernel in ("fused", "reference"):
        check(q, k, v, go, kernel=kernel, z=z, causal=True, dropout_p=p, dropout_seed=seed, dropout_offset=offset)


def test_dropout_seed_repeats_and_p0_is_no_dropout():
    q, k, v, _ = inputs(np.float64, seed=9)
    a = np.asarray(qkv.attention(q, k, v, dropout_p=0.2, dropout_seed=5))
    b = np.asarray(qkv.attention(q, k, v, dropout_p=0.2, dropout_seed=5))
    c = np.asarray(qkv.attention(q, k, v, dropout_p=0.2, dropout_seed=6))
    d = np.asarray(qkv.attention(q, k, v, dropout_p=0.2, dropout_seed=5, dropout_offset=1))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c) and not np.allclose(a, d)
    np.testing.assert_array_equal(np.asarray(qkv.attention(q, k, v, dropout_p=0.0, dropout_seed=5)),
                                  np.asarray(qkv.attention(q, k, v)))


def test_dropout_kept_fraction_is_binomial():
    # q = 0 makes every weight 1/Nk, and v = I reads them out: out[i, j] = Z_ij / Nk.
    nk, nq, p = 64, 64, 0.25
    q = np.zeros((B, HQ, nq, 4))
    k = np.random.default_rng(1).standard_normal((B, 1, nk, 4))
    v = np.broadcast_to(np.eye(nk), (B, 1, nk, nk)).copy()
    out = np.asarray(qkv.attention(q, k, v, dropout_p=p, dropout_seed=2024))
    kept = out > 0
    np.testing.assert_allclose(out[kept], 1 / (nk * (1 - p)), rtol=1e-12)
    n = kept.size
    assert abs(kept.sum() - n * (1 - p)) < 5 * math.sqrt(n * p * (1 - p))


# ---------------------------------------------------------------- arguments, gradcheck, linear attention
def test_invalid_arguments_raise_qkv_error_naming_them():
    q, k, v, _ = inputs(np.float64)
    cases = [
        (dict(kernel="flash"), r"argument 'kernel' must be 'fused' or 'reference', got 'flash'"),
        (dict(fully_masked="nan"), r"argument 'fully_masked' must be 'zero' or 'error'"),
        (dict(pattern="dense"), r"argument 'pattern' = 'dense' is not a pattern \(full, window"),
        (dict(pattern={"kind": "strided", "strid": 2}), r"argument 'pattern' has no key 'strid'"),
        (dict(pattern={"kind": "bigbird", "block_size": 5}), r"pattern.block_size = 5 does not divide the key count Nk = 16"),
        (dict(pattern={"kind": "strided", "stride": 17}), r"pattern.stride = 17 exceeds the key count Nk = 16"),
        (dict(window=-1), r"argument 'window' must be >= 0"),
        (dict(scale=0), r"argument 'scale' must be a finite number > 0"),
        (dict(causal="yes"), r"argument 'causal' must be a bool"),
        (dict(dropout_p=1.0), r"dropout_p must be in \[0, 1\)"),
        (dict(key_lengths=[3]), r"key_lengths has 1 entries for batch 2"),
        (dict(alibi_slopes=[1.0]), r"alibi_slopes has 1 entries for Hq=4"),
        (dict(key_padding=np.ones((B, N), np.float32)), r"key_padding must be bool"),
    ]
    for kw, msg in cases:
        with pytest.raises(qkv.Error, match=msg):
            qkv.attention(q, k, v, **kw)
    # Every option is a named keyword (help() lists them): a misspelt one is Python's TypeError.
    with pytest.raises(TypeError, match=r"causl=True"):
        qkv.attention(q, k, v, causl=True)
    with pytest.raises(qkv.Error, match=r"argument 'grad_out'"):
        qkv.attention_vjp(q, k, v, None)


def test_gradcheck_attention_reports_like_the_cli():
    q, k, v, _ = inputs(np.float64)
    kp = np.ones((B, N), bool)
    kp[1, 10:] = False
    r = qkv.gradcheck_attention(q[:, :, :6], k[:, :, :6], v[:, :, :6], causal=True, key_padding=kp[:, :6],
                                pattern={"kind": "strided", "stride": 2, "local": 1}, dropout_p=0.1, dropout_seed=3)
    assert set(r) >= {"op", "case", "max_abs_err", "max_rel_err", "pass"}
    assert r["op"] == "attention" and r["pass"] is True and r["max_abs_err"] < 1e-6
    # A backward that is off fails: a tolerance of 0 with a coarse step cannot pass.
    bad = qkv.gradcheck_attention(q[:, :, :6], k[:, :, :6], v[:, :, :6], eps=0.5, atol=0.0, rtol=0.0)
    assert bad["pass"] is False and bad["max_abs_err"] > 1e-3
    reg = qkv.gradcheck_attention(only="alibi")
    assert reg["passed"] == len(reg["checks"]) > 0 and reg["failed"] == 0
    assert all("alibi" in (c["op"] + " " + c["case"]) for c in reg["checks"])
    with pytest.raises(qkv.Error, match=r"argument 'only' selects registered cases"):
        qkv.gradcheck_attention(q, k, v, only="alibi")
    with pytest.raises(qkv.Error, match=r"argument 'causal' needs q, k and v"):
        qkv.gradcheck_attention(causal=True)
    with pytest.raises(qkv.Error, match=r"argument 'only' = 'nothing-matches' matches no registered"):
        qkv.gradcheck_attention(only="nothing-matches")


def linear_reference(q, k, v, causal, eps=1e-6):
    s = 1 / math.sqrt(q.shape[-1])
    g = q.shape[1] // k.shape[1]
    phi = lambda x: torch.nn.functional.elu(x) + 1  # noqa: E731
    fq, fk = phi(math.sqrt(s) * q), phi(math.sqrt(s) * k.repeat_interleave(g, 1))
    vv = v.repeat_interleave(g, 1)
    A = fq @ fk.transpose(-1, -2)
    if causal:
        A = A.tril()
    return (A @ vv) / (A.sum(-1, keepdim=True) + eps)


@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_elu1(causal):
    q, k, v, go = inputs(np.float64, seed=10)
    out = qkv.linear_attention(q, k, v, causal=causal, chunk=5)
    ref = linear_reference(*(torch.from_numpy(x) for x in (q, k, v)), causal)
    np.testing.assert_allclose(np.asarray(out), ref.numpy(), atol=1e-10, rtol=1e-9)
    with pytest.raises(qkv.Error, match="feature"):
        qkv.linear_attention(q, k, v, feature="cosine")
