"""dot_product_attention vs the float64 reference."""

import numpy as np
import pytest
import reference
from helpers import MASK_KINDS, assert_close, dead_rows, f32, f32_np, make_mask, qkv

from relpos import attention

# (batch, q_len, kv_len, heads, head_dim)
SHAPES = [
    (2, 7, 13, 3, 5),  # q_len != kv_len, odd sizes
    (2, 9, 9, 2, 8),  # self-attention
    (1, 1, 11, 3, 4),  # single query (decoding)
    (2, 6, 4, 2, 3),  # q_len > kv_len
]


@pytest.mark.parametrize("mask_kind", MASK_KINDS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_dot_product_vs_reference(shape, mask_kind):
    batch, q_len, kv_len, heads, dim = shape
    rng = np.random.default_rng(100 + 7 * SHAPES.index(shape) + MASK_KINDS.index(mask_kind))
    q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
    mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len)
    out = attention.dot_product_attention(
        f32(q), f32(k), f32(v), mask=None if mask is None else np.asarray(mask)
    )
    assert out.shape == (batch, q_len, heads, dim)
    assert out.dtype == np.float32
    want = reference.vanilla(f32_np(q), f32_np(k), f32_np(v), mask=mask)
    assert_close(out, want)
    dead = dead_rows(mask, batch, heads, q_len, kv_len)
    assert np.all(np.asarray(out)[dead] == 0.0)


@pytest.mark.parametrize("mask_shape", ["bhqk", "b11k", "11qk", "qk", "1h1k"])
def test_dot_product_mask_broadcasting(mask_shape):
    batch, q_len, kv_len, heads, dim = 2, 5, 6, 3, 4
    rng = np.random.default_rng(7)
    q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
    shape = {
        "bhqk": (batch, heads, q_len, kv_len),
        "b11k": (batch, 1, 1, kv_len),
        "11qk": (1, 1, q_len, kv_len),
        "qk": (q_len, kv_len),
        "1h1k": (1, heads, 1, kv_len),
    }[mask_shape]
    mask = rng.random(shape) < 0.6
    out = attention.dot_product_attention(f32(q), f32(k), f32(v), mask=mask)
    assert_close(out, reference.vanilla(f32_np(q), f32_np(k), f32_np(v), mask=mask))


def test_dot_product_mask_all_true_equals_no_mask():
    rng = np.random.default_rng(8)
    q, k, v = (f32(x) for x in qkv(rng, 2, 4, 7, 2, 6))
    a = attention.dot_product_attention(q, k, v)
    b = attention.dot_product_attention(q, k, v, mask=np.ones((2, 2, 4, 7), dtype=bool))
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
