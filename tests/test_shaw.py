"""shaw_attention and shaw_attention_materialized vs the float64 reference (Shaw et al. 2018)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from helpers import MASK_KINDS, assert_close, dead_rows, f32, f32_np, make_mask, qkv, randn

from relpos import attention

SHAW_FNS = {
    "blocked": attention.shaw_attention,
    "materialized": attention.shaw_attention_materialized,
}

# (batch, q_len, kv_len, heads, head_dim)
SHAPES = [
    (2, 7, 13, 3, 5),  # q_len != kv_len, odd sizes
    (2, 9, 9, 2, 8),  # self-attention
    (1, 1, 11, 3, 4),  # single query (decoding)
    (2, 6, 4, 2, 3),  # q_len > kv_len (default query_offset is negative)
]
SHAPE_IDS = ["x".join(map(str, s)) for s in SHAPES]


def _kmax_values(kv_len):
    # k = 0, k = 1, a middle value, k == kv_len, and k far beyond kv_len (no clipping at all)
    return {"k0": 0, "k1": 1, "k3": 3, "k=kv": kv_len, "k>kv": kv_len + 4}


def _run(fn, q, k, v, wk, wv, mask=None, query_offset=None):
    kwargs = {}
    if mask is not None:
        kwargs["mask"] = np.asarray(mask)
    if query_offset is not None:
        kwargs["query_offset"] = query_offset
    return fn(f32(q), f32(k), f32(v), f32(wk), f32(wv), **kwargs)


def _check(fn, q, k, v, wk, wv, mask=None, query_offset=None):
    out = _run(fn, q, k, v, wk, wv, mask, query_offset)
    batch, q_len, heads, dim = q.shape
    kv_len = k.shape[1]
    assert out.shape == (batch, q_len, heads, dim)
    assert out.dtype == np.float32
    want = reference.shaw(
        f32_np(q), f32_np(k), f32_np(v), f32_np(wk), f32_np(wv), mask=mask,
        query_offset=query_offset,
    )
    assert_close(out, want)
    dead = dead_rows(mask, batch, heads, q_len, kv_len)
    assert np.all(np.asarray(out)[dead] == 0.0), "fully masked rows must be exactly zero"
    return out


@pytest.mark.parametrize("fn_name", list(SHAW_FNS))
@pytest.mark.parametrize("kname", ["k0", "k1", "k3", "k=kv", "k>kv"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_shaw_vs_reference_no_mask(shape, kname, fn_name):
    batch, q_len, kv_len, heads, dim = shape
    kmax = _kmax_values(kv_len)[kname]
    rng = np.random.default_rng(10 * SHAPES.index(shape) + list(_kmax_values(0)).index(kname))
    q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
    wk, wv = randn(rng, 2 * kmax + 1, dim), randn(rng, 2 * kmax + 1, dim)
    _check(SHAW_FNS[fn_name], q, k, v, wk, wv)


@pytest.mark.parametrize("fn_name", list(SHAW_FNS))
@pytest.mark.parametrize("kmax", [1, 4, 20])
@pytest.mark.parametrize("mask_kind", [m for m in MASK_KINDS if m != "none"])
def test_shaw_vs_reference_masked(mask_kind, kmax, fn_name):
    batch, q_len, kv_len, heads, dim = 2, 7, 13, 3, 5
    rng = np.random.default_rng(1000 + 31 * kmax + MASK_KINDS.index(mask_kind))
    q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
    wk, wv = randn(rng, 2 * kmax + 1, dim), randn(rng, 2 * kmax + 1, dim)
    mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len)
    _check(SHAW_FNS[fn_name], q, k, v, wk, wv, mask=mask)


# query_offset: 0 (queries are the first positions), the default kv_len - q_len written out,
# negative (queries before every key), past the end (queries after every key), in between.
OFFSETS = [0, 6, -9, -3, 16, 40, 2]


@pytest.mark.parametrize("fn_name", list(SHAW_FNS))
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "causal"])
@pytest.mark.parametrize("offset", OFFSETS)
def test_shaw_query_offset(offset, masked, fn_name):
    batch, q_len, kv_len, heads, dim, kmax = 2, 5, 11, 2, 4, 3
    rng = np.random.default_rng(2000 + offset + 100 * masked)
    q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
    wk, wv = randn(rng, 2 * kmax + 1, dim), randn(rng, 2 * kmax + 1, dim)
    # causal mask at this offset; offsets < 0 leave some query rows with no key at all
    mask = (np.arange(kv_len)[None] <= offset + np.arange(q_len)[:, None]) if masked else None
    _check(SHAW_FNS[fn_name], q, k, v, wk, wv, mask=mask, query_offset=offset)


@pytest.mark.parametrize("fn_name", list(SHAW_FNS))
def test_shaw_default_offset_is_kv_minus_q(fn_name):
    rng = np.random.default_rng(3)
    q, k, v = qkv(rng, 2, 4, 9, 2, 6)
    wk, wv = randn(rng, 7, 6), randn(rng, 7, 6)
    fn = SHAW_FNS[fn_name]
    a = _run(fn, q, k, v, wk, wv)
    b = _run(fn, q, k, v, wk, wv, query_offset=5)
    c = _run(fn, q, k, v, wk, wv, query_offset=4)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.allclose(np.asarray(a), np.asarray(c), atol=1e-3), "query_offset is ignored"


@pytest.mark.parametrize("fn_name", list(SHAW_FNS))
@pytest.mark.parametrize("mask_kind", ["none", "dead_rows"])
@pytest.mark.parametrize("which", ["keys_only", "values_only"])
@pytest.mark.parametrize("kmax", [0, 2, 15])
def test_shaw_single_table(kmax, which, mask_kind, fn_name):
    batch, q_len, kv_len, heads, dim = 2, 6, 10, 3, 5
    rng = np.random.default_rng(3000 + kmax + 50 * (which == "keys_only") + 7 * len(mask_kind))
    q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
    w = randn(rng, 2 * kmax + 1, dim)
    wk, wv = (w, None) if which == "keys_only" else (None, w)
    mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len)
    _check(SHAW_FNS[fn_name], q, k, v, wk, wv, mask=mask, query_offset=2)


@pytest.mark.parametrize("fn_name", list(SHAW_FNS))
def test_shaw_with_library_causal_mask(fn_name):
    """The mask built by attention.causal_mask plugs straight into the kernel."""
    batch, q_len, kv_len, heads, dim, kmax, off = 2, 6, 9, 2, 4, 2, 1
    rng = np.random.default_rng(4)
    q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
    wk, wv = randn(rng, 2 * kmax + 1, dim), randn(rng, 2 * kmax + 1, dim)
    mask = attention.causal_mask(q_len, kv_len, query_offset=off)
    out = SHAW_FNS[fn_name](f32(q), f32(k), f32(v), f32(wk), f32(wv), mask=mask, query_offset=off)
    want_mask = np.arange(kv_len)[None] <= off + np.arange(q_len)[:, None]
    want = reference.shaw(
        f32_np(q), f32_np(k), f32_np(v), f32_np(wk), f32_np(wv), mask=want_mask, query_offset=off
    )
    assert_close(out, want)


@pytest.mark.parametrize("fn_name", list(SHAW_FNS))
def test_shaw_traced_query_offset_under_jit(fn_name):
    """query_offset as a traced int32 scalar: one compilation serves every decoding step."""
    batch, kv_len, heads, dim, kmax = 2, 8, 3, 4, 2
    rng = np.random.default_rng(5)
    q_all, k, v = qkv(rng, batch, kv_len, kv_len, heads, dim)
    wk, wv = randn(rng, 2 * kmax + 1, dim), randn(rng, 2 * kmax + 1, dim)
    fn = SHAW_FNS[fn_name]
    traces = []

    @jax.jit
    def step(q, k, v, wk, wv, off):
        traces.append(1)
        mask = jnp.arange(kv_len)[None, :] <= off + jnp.arange(q.shape[1])[:, None]
        return fn(q, k, v, wk, wv, mask=mask, query_offset=off)

    for t in [0, 3, 7]:
        q = q_all[:, t : t + 1]
        out = step(f32(q), f32(k), f32(v), f32(wk), f32(wv), jnp.int32(t))
        mask = np.arange(kv_len)[None] <= t
        want = reference.shaw(
            f32_np(q), f32_np(k), f32_np(v), f32_np(wk), f32_np(wv), mask=mask, query_offset=t
        )
        assert_close(out, want)
    assert len(traces) == 1, "query_offset must be usable as a traced value (no retrace)"

    # same without a mask and with several queries per step, also traced
    q = q_all[:, :3]
    jitted = jax.jit(lambda q, k, v, wk, wv, off: fn(q, k, v, wk, wv, query_offset=off))
    for t in [-2, 4]:
        out = jitted(f32(q), f32(k), f32(v), f32(wk), f32(wv), jnp.int32(t))
        want = reference.shaw(
            f32_np(q), f32_np(k), f32_np(v), f32_np(wk), f32_np(wv), query_offset=t
        )
        assert_close(out, want)


def test_blocked_equals_materialized_larger():
    """A somewhat larger case, blocked vs materialised implementation (both float32)."""
    batch, q_len, kv_len, heads, dim, kmax = 2, 33, 47, 4, 16, 8
    rng = np.random.default_rng(6)
    q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
    wk, wv = randn(rng, 2 * kmax + 1, dim), randn(rng, 2 * kmax + 1, dim)
    mask = make_mask("dead_rows", rng, batch, heads, q_len, kv_len)
    a = _run(attention.shaw_attention, q, k, v, wk, wv, mask=mask, query_offset=5)
    b = _run(attention.shaw_attention_materialized, q, k, v, wk, wv, mask=mask, query_offset=5)
    assert_close(a, b)
