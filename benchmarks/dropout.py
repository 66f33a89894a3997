"""What dropout costs on the CPU: nnx.Dropout with JAX's default key against relpos's key.

    python benchmarks/dropout.py
    python benchmarks/dropout.py --sites=17 --shape=42,48,256 --rounds=7

Times the forward and backward pass (jit of the gradient) of `--sites` dropout layers, each
on its own [rows, len, d_model] activation split by rows over the CPU devices, as one
translate_tiny step has them (17 sites: the embeddings and every sublayer output of 3
encoder and 3 decoder layers, on a 42 x 48 bucket). The variants, interleaved round by round:

- `threefry`: flax's nnx.Dropout with JAX's default threefry2x32 key (relpos before
  2026-11-25), which JAX lowers to a rolled while loop on the CPU;
- `philox2x32`: the same layer with the dropout key of relpos's models (`layers.model_rngs`);
- `no dropout`: the same computation with rate 0, the floor.

Prints ms per pass and the ratio to the first variant.
"""

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx
from timing import interleaved_median_seconds

from relpos import runtime
from relpos.models import layers
from relpos.training import mesh

_SITES = flags.DEFINE_integer('sites', 17, 'Dropout layers, each on its own activation.')
_SHAPE = flags.DEFINE_list('shape', ['42', '48', '256'], 'rows, len, d_model of an activation.')
_RATE = flags.DEFINE_float('rate', 0.1, 'Dropout rate.')
_ROUNDS = flags.DEFINE_integer('rounds', 7, 'Interleaved timing rounds (median reported).')


def variants(rate: float) -> dict:
  """{name: a function of a seed making one dropout layer}."""
  return {
    'threefry': lambda seed: nnx.Dropout(rate, rngs=nnx.Rngs(seed)),
    'philox2x32': lambda seed: nnx.Dropout(rate, rngs=layers.model_rngs(seed)),
    'no dropout': lambda seed: nnx.Dropout(0.0, rngs=layers.model_rngs(seed)),
  }


def pass_call(make_layer, activations):
  """A zero-argument call of the jitted gradient of Σ_site Σ dropout_site(x_site)·x_site."""
  dropouts = [make_layer(seed) for seed in range(len(activations))]

  def loss(dropouts, activations):
    pairs = zip(dropouts, activations, strict=True)
    return sum(jnp.vdot(dropout(x, deterministic=False), x) for dropout, x in pairs)

  grads = nnx.jit(nnx.grad(loss, argnums=1))
  return lambda: grads(dropouts, activations)


def measure(sites: int, shape, rate: float, rounds: int) -> dict:
  """{variant: median seconds per pass}."""
  rng = np.random.default_rng(0)
  rows = mesh.row_sharded(mesh.data_mesh())  # split over the CPU devices, as in a train step
  activations = [
    jax.device_put(rng.standard_normal(shape).astype(np.float32), rows) for _ in range(sites)
  ]
  calls = {name: pass_call(make, activations) for name, make in variants(rate).items()}
  return interleaved_median_seconds(calls, rounds=rounds, warmup=1)


def main(argv):
  del argv
  shape = tuple(int(n) for n in _SHAPE.value)
  seconds = measure(_SITES.value, shape, _RATE.value, _ROUNDS.value)
  base = next(iter(seconds.values()))
  print(
    f'{_SITES.value} dropout sites of {shape}, rate {_RATE.value}, forward + backward, '
    f'median of {_ROUNDS.value} interleaved rounds'
  )
  print('| dropout | ms / pass | time / first row |')
  print('|---|---|---|')
  for name, s in seconds.items():
    print(f'| {name} | {s * 1e3:.1f} | {s / base:.2f} |')


if __name__ == '__main__':
  runtime.apply_defaults()  # relpos's allocator and CPU devices (re-executes), as train.py
  app.run(main)
