"""Gradients: shaw_attention vs shaw_attention_materialized, xl_attention vs a materialised JAX
transcription, and float64 finite differences on tiny cases."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_grads_close, f32, make_mask, qkv, randn, xl_materialized_jax
from jax.test_util import check_grads

from relpos import attention

SHAW_NAMES = ("query", "key", "value", "rel_key", "rel_value")
XL_NAMES = ("query", "key", "value", "rel_key", "content_bias", "position_bias")


def _shaw_grads(fn, arrays, cot, mask, query_offset):
    """Gradient of sum(out * cot) w.r.t. every non-None input of the Shaw kernel."""
    present = [n for n, a in enumerate(arrays) if a is not None]
    kwargs = {"mask": mask} if mask is not None else {}
    if query_offset is not None:
        kwargs["query_offset"] = query_offset

    def loss(*xs):
        full = list(arrays)
        for n, x in zip(present, xs, strict=True):
            full[n] = x
        return jnp.sum(fn(*full, **kwargs) * cot)

    grads = jax.grad(loss, argnums=tuple(range(len(present))))(*(arrays[n] for n in present))
    return grads, [SHAW_NAMES[n] for n in present]


# (id, (batch, q_len, kv_len, heads, dim), kmax, mask kind, query_offset, drop)
SHAW_GRAD_CASES = [
    ("plain", (2, 7, 13, 3, 5), 3, "none", None, None),
    ("random_mask", (2, 7, 13, 3, 5), 2, "random", None, None),
    ("causal", (2, 9, 9, 2, 8), 4, "causal", None, None),
    ("padding", (2, 6, 10, 2, 4), 3, "padding", None, None),
    ("dead_rows", (2, 6, 10, 3, 5), 2, "dead_rows", None, None),
    ("offset0_causal", (2, 5, 11, 2, 4), 2, "causal", 0, None),
    ("offset_before", (1, 4, 7, 2, 3), 2, "none", -6, None),
    ("offset_after", (1, 4, 7, 2, 3), 2, "none", 12, None),
    ("offset_neg_causal", (2, 5, 8, 2, 4), 1, "causal", -2, None),  # some rows fully masked
    ("k0", (2, 6, 9, 3, 5), 0, "random", None, None),
    ("k_ge_kv", (2, 6, 9, 3, 5), 12, "causal", None, None),
    ("q1", (2, 1, 9, 3, 4), 3, "padding", None, None),
    ("keys_only", (2, 6, 9, 2, 5), 3, "dead_rows", 1, "rel_value"),
    ("values_only", (2, 6, 9, 2, 5), 3, "dead_rows", 1, "rel_key"),
    ("keys_only_k0", (1, 5, 5, 2, 4), 0, "none", None, "rel_value"),
]


@pytest.mark.parametrize(
    "shape,kmax,mask_kind,offset,drop", [c[1:] for c in SHAW_GRAD_CASES],
    ids=[c[0] for c in SHAW_GRAD_CASES],
)
def test_shaw_grads_match_materialized(shape, kmax, mask_kind, offset, drop):
    batch, q_len, kv_len, heads, dim = shape
    rng = np.random.default_rng(kmax * 101 + q_len * 7 + kv_len + (offset or 0) * 13 + len(mask_kind))
    q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
    wk, wv = randn(rng, 2 * kmax + 1, dim), randn(rng, 2 * kmax + 1, dim)
    if drop == "rel_key":
        wk = None
    if drop == "rel_value":
        wv = None
    off_for_mask = offset
    mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len, query_offset=off_for_mask)
    cot = f32(randn(rng, batch, q_len, heads, dim))
    arrays = [f32(x) for x in (q, k, v, wk, wv)]
    got, names = _shaw_grads(attention.shaw_attention, arrays, cot, mask, offset)
    want, _ = _shaw_grads(attention.shaw_attention_materialized, arrays, cot, mask, offset)
    assert_grads_close(got, want, names=names)


XL_GRAD_CASES = [
    ("plain", (2, 7, 13, 3, 5), "none"),
    ("no_memory", (2, 9, 9, 2, 8), "none"),
    ("random_mask", (2, 7, 13, 3, 5), "random"),
    ("padding", (2, 6, 10, 2, 4), "padding"),
    ("dead_rows", (2, 6, 10, 3, 5), "dead_rows"),
    ("q1", (2, 1, 9, 3, 4), "none"),
]


@pytest.mark.parametrize(
    "shape,mask_kind", [c[1:] for c in XL_GRAD_CASES], ids=[c[0] for c in XL_GRAD_CASES]
)
def test_xl_grads_match_materialized(shape, mask_kind):
    batch, q_len, kv_len, heads, dim = shape
    rng = np.random.default_rng(q_len * 17 + kv_len + len(mask_kind))
    q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
    args = [f32(x) for x in (q, k, v, randn(rng, kv_len, heads, dim), randn(rng, heads, dim),
                             randn(rng, heads, dim))]
    mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len)
    cot = f32(randn(rng, batch, q_len, heads, dim))
    kwargs = {} if mask is None else {"mask": mask}

    def loss(fn):
        return lambda *xs: jnp.sum(fn(*xs, **kwargs) * cot)

    argnums = tuple(range(6))
    got = jax.grad(loss(attention.xl_attention), argnums)(*args)
    want = jax.grad(loss(xl_materialized_jax), argnums)(*args)
    assert_grads_close(got, want, names=XL_NAMES)


# --------------------------------------------------------------------------------------------
# Finite differences in float64. jax.enable_x64 is a context manager in this jax version; the
# setting is scoped to the `with` block, so other tests still run in float32.


def _f64(x):
    return jnp.asarray(x, dtype=jnp.float64)


def _fd_check(f, args):
    check_grads(f, args, order=1, modes=("rev",), atol=1e-6, rtol=1e-6, eps=1e-6)


def test_x64_is_scoped():
    with jax.enable_x64(True):
        assert jnp.asarray(1.0, dtype=jnp.float64).dtype == jnp.float64
    assert jnp.zeros(1).dtype == jnp.float32


@pytest.mark.parametrize("fn_name", ["shaw_attention", "shaw_attention_materialized"])
def test_shaw_finite_differences_f64(fn_name):
    fn = getattr(attention, fn_name)
    rng = np.random.default_rng(21)
    batch, q_len, kv_len, heads, dim, kmax = 1, 3, 5, 2, 3, 1
    q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
    wk, wv = randn(rng, 2 * kmax + 1, dim), randn(rng, 2 * kmax + 1, dim)
    mask = rng.random((batch, heads, q_len, kv_len)) < 0.7
    mask[0, 0, 1] = False  # one fully masked row
    mask[0, 1, 0, 2] = True
    with jax.enable_x64(True):
        args = tuple(_f64(x) for x in (q, k, v, wk, wv))
        out = fn(*args, mask=mask, query_offset=1)
        assert out.dtype == jnp.float64, "float64 inputs should give a float64 output"
        _fd_check(lambda *xs: fn(*xs, mask=mask, query_offset=1), args)


def test_xl_finite_differences_f64():
    rng = np.random.default_rng(22)
    batch, q_len, kv_len, heads, dim = 1, 3, 5, 2, 3
    q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
    extra = (randn(rng, kv_len, heads, dim), randn(rng, heads, dim), randn(rng, heads, dim))
    mask = rng.random((batch, 1, 1, kv_len)) < 0.7
    mask[..., -1] = True
    with jax.enable_x64(True):
        args = tuple(_f64(x) for x in (q, k, v, *extra))
        assert attention.xl_attention(*args, mask=mask).dtype == jnp.float64
        _fd_check(lambda *xs: attention.xl_attention(*xs, mask=mask), args)


def test_dot_product_finite_differences_f64():
    rng = np.random.default_rng(23)
    q, k, v = qkv(rng, 2, 3, 4, 2, 3)
    mask = rng.random((2, 2, 3, 4)) < 0.6
    mask[1, 0, 2] = False
    mask[0, 1, 0, 1] = True
    with jax.enable_x64(True):
        args = tuple(_f64(x) for x in (q, k, v))
        _fd_check(lambda *xs: attention.dot_product_attention(*xs, mask=mask), args)
