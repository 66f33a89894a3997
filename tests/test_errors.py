"""Bad shapes get a ValueError that names what is wrong, before anything reaches XLA."""

import jax.numpy as jnp
import pytest

from relpos import attention

B, Q, K, H, D = 2, 3, 5, 2, 4


def _qkv(q_len=Q, kv_len=K, heads=H, dim=D):
  return (
    jnp.ones((B, q_len, heads, dim)),
    jnp.ones((B, kv_len, heads, dim)),
    jnp.ones((B, kv_len, heads, dim)),
  )


@pytest.mark.parametrize(
  'kernel',
  [
    attention.shaw_attention,
    attention.shaw_attention_banded,
    attention.shaw_attention_dense,
  ],
)
@pytest.mark.parametrize(
  'rel_key,rel_value,message',
  [
    (None, None, 'got neither'),
    (jnp.ones((4, D)), jnp.ones((4, D)), r'\[2k\+1, head_dim'),
    (jnp.ones((5, D + 1)), None, r'\[2k\+1, head_dim=4\]'),
    (jnp.ones((5, D)), jnp.ones((3, D)), 'differ in k'),
  ],
)
def test_shaw_rejects_bad_tables(kernel, rel_key, rel_value, message):
  with pytest.raises(ValueError, match=message):
    kernel(*_qkv(), rel_key, rel_value)


@pytest.mark.parametrize(
  'kernel',
  [
    lambda q, k, v: attention.dot_product_attention(q, k, v),
    lambda q, k, v: attention.shaw_attention(q, k, v, jnp.ones((3, D)), None),
    lambda q, k, v: attention.xl_attention(
      q, k, v, jnp.ones((K, H, D)), jnp.ones((H, D)), jnp.ones((H, D))
    ),
  ],
)
def test_kernels_reject_mismatched_qkv(kernel):
  q, k, v = _qkv()
  with pytest.raises(ValueError, match='differ in batch, heads or head_dim'):
    kernel(q[:, :, :1], k, v)
  with pytest.raises(ValueError, match=r'key, value \[batch, kv_len'):
    kernel(q, k, v[:, :-1])


@pytest.mark.parametrize(
  'rel_key,u,v,message',
  [
    (jnp.ones((K - 1, H, D)), jnp.ones((H, D)), jnp.ones((H, D)), 'rel_key must be'),
    (jnp.ones((K, H, D)), jnp.ones((D,)), jnp.ones((H, D)), 'content_bias must be'),
    (jnp.ones((K, H, D)), jnp.ones((H, D)), jnp.ones((H, D + 1)), 'position_bias must be'),
  ],
)
def test_xl_rejects_bad_parameters(rel_key, u, v, message):
  with pytest.raises(ValueError, match=message):
    attention.xl_attention(*_qkv(), rel_key, u, v)


def test_sinusoidal_rejects_odd_dim():
  with pytest.raises(ValueError, match='must be even'):
    attention.sinusoidal_embedding(jnp.arange(3), 5)
