"""Make `relpos` (repo root) and the test helpers (this folder) importable however pytest runs."""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.dirname(_HERE), _HERE):
  if _path not in sys.path:
    sys.path.insert(0, _path)


import jax  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(scope='module')
def attention_test_config():
  """JAX settings for the attention tests, opted into per module with
  `pytestmark = pytest.mark.usefixtures("attention_test_config")` and restored afterwards.

  - float32 matmuls at full precision, so the comparisons with float64 references at ~1e-6
    also hold on GPUs/TPUs whose default float32 matmul is TF32/bf16-pass (no-op on CPU);
  - most XLA optimisations off: compile time dominates these tests on CPU and this cuts it by
    about 40%; results are checked against float64 references either way.
  """
  old = jax.config.read('jax_disable_most_optimizations')
  jax.config.update('jax_disable_most_optimizations', True)
  try:
    with jax.default_matmul_precision('highest'):
      yield
  finally:
    jax.config.update('jax_disable_most_optimizations', old)
