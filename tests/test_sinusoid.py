"""sinusoidal_embedding (relpos.attention.sinusoid) against its direct formula."""

import jax.numpy as jnp
import numpy as np
import pytest
import reference

from relpos import attention

pytestmark = pytest.mark.usefixtures('attention_test_config')


@pytest.mark.parametrize('dim', [2, 8, 16, 64])
def test_sinusoidal_embedding(dim):
  positions = np.arange(20.0, -1.0, -1.0)  # Transformer-XL uses descending klen-1 .. 0
  got = attention.sinusoidal_embedding(jnp.asarray(positions, jnp.float32), dim)
  assert got.shape == (len(positions), dim)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), reference.sinusoidal(positions, dim), atol=2e-6)


def test_sinusoidal_embedding_int_positions():
  got = attention.sinusoidal_embedding(jnp.arange(5), 6)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), reference.sinusoidal(np.arange(5), 6), atol=2e-6)
