"""xl_attention vs the float64 reference (Transformer-XL, Dai et al. 2019)."""

import jax
import numpy as np
import pytest
import reference
from helpers import (
    MASK_KINDS,
    assert_close,
    dead_rows,
    f32,
    f32_np,
    make_mask,
    qkv,
    randn,
    xl_materialized_jax,
)

from relpos import attention

# (batch, q_len, kv_len, heads, head_dim); q_len < kv_len means kv_len - q_len memory positions
SHAPES = [
    (2, 7, 13, 3, 5),  # with memory, odd sizes
    (2, 9, 9, 2, 8),  # no memory
    (1, 1, 11, 3, 4),  # single query attending to 10 memory positions + itself
    (2, 5, 6, 4, 6),
    (1, 16, 16, 1, 2),
]
SHAPE_IDS = ["x".join(map(str, s)) for s in SHAPES]


def _inputs(rng, batch, q_len, kv_len, heads, dim):
    q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
    return q, k, v, randn(rng, kv_len, heads, dim), randn(rng, heads, dim), randn(rng, heads, dim)


def _run(args, mask=None):
    kwargs = {} if mask is None else {"mask": np.asarray(mask)}
    return attention.xl_attention(*(f32(a) for a in args), **kwargs)


def _dead_rows_xl(mask, batch, heads, q_len, kv_len):
    """Rows with nothing allowed once the built-in causal restriction is applied too."""
    causal = np.arange(kv_len)[None] <= (kv_len - q_len + np.arange(q_len))[:, None]
    full = causal if mask is None else np.broadcast_to(mask, (batch, heads, q_len, kv_len)) & causal
    return dead_rows(full, batch, heads, q_len, kv_len)


@pytest.mark.parametrize("mask_kind", MASK_KINDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_xl_vs_reference(shape, mask_kind):
    batch, q_len, kv_len, heads, dim = shape
    rng = np.random.default_rng(500 + 10 * SHAPES.index(shape) + MASK_KINDS.index(mask_kind))
    args = _inputs(rng, batch, q_len, kv_len, heads, dim)
    mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len)
    out = _run(args, mask)
    assert out.shape == (batch, q_len, heads, dim)
    assert out.dtype == np.float32
    want = reference.xl(*(f32_np(a) for a in args), mask=mask)
    assert_close(out, want)
    dead = _dead_rows_xl(mask, batch, heads, q_len, kv_len)
    assert np.all(np.asarray(out)[dead] == 0.0)


def test_xl_causal_is_builtin():
    """Adding an explicit causal mask changes nothing; future keys never leak in."""
    batch, q_len, kv_len, heads, dim = 2, 6, 10, 2, 4
    rng = np.random.default_rng(9)
    args = _inputs(rng, batch, q_len, kv_len, heads, dim)
    a = np.asarray(_run(args))
    causal = np.arange(kv_len)[None] <= (kv_len - q_len + np.arange(q_len))[:, None]
    b = np.asarray(_run(args, causal))
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    # perturb the future keys/values of query 2 and the rel_key rows never used: query 0..2 same
    q, k, v, r, u, vb = args
    k2, v2 = k.copy(), v.copy()
    first_future = kv_len - q_len + 3
    k2[:, first_future:] += 5.0
    v2[:, first_future:] -= 3.0
    c = np.asarray(_run((q, k2, v2, r, u, vb)))
    np.testing.assert_allclose(c[:, :3], a[:, :3], rtol=1e-6, atol=1e-6)
    assert not np.allclose(c[:, 3:], a[:, 3:], atol=1e-3)


def test_xl_matches_materialized_jax_transcription():
    """The helper used for gradient tests agrees with the loop reference (guards the helper)."""
    batch, q_len, kv_len, heads, dim = 2, 5, 8, 3, 4
    rng = np.random.default_rng(10)
    args = _inputs(rng, batch, q_len, kv_len, heads, dim)
    mask = make_mask("dead_rows", rng, batch, heads, q_len, kv_len)
    got = xl_materialized_jax(*(f32(a) for a in args), mask=mask)
    assert_close(got, reference.xl(*(f32_np(a) for a in args), mask=mask))


def test_xl_jit():
    batch, q_len, kv_len, heads, dim = 2, 4, 7, 2, 4
    rng = np.random.default_rng(11)
    args = _inputs(rng, batch, q_len, kv_len, heads, dim)
    mask = make_mask("padding", rng, batch, heads, q_len, kv_len)
    out = jax.jit(attention.xl_attention)(*(f32(a) for a in args), mask=mask)
    assert_close(out, reference.xl(*(f32_np(a) for a in args), mask=mask))
