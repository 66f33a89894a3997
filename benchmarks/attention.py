"""Attention kernel benchmark: Shaw (banded and dense forms) and Transformer-XL vs vanilla.

    python benchmarks/attention.py --config=configs/attention_benchmark.py        # full table
    python benchmarks/attention.py --config=configs/attention_benchmark.py:quick  # ~1 min

Causal self-attention. Every row is measured in one run with the candidates interleaved; the
table reports ratios to vanilla attention of the same size, so it compares kernels, not
machines. Temp memory is XLA's `memory_analysis().temp_size_in_bytes` of the compiled function.
The 'shaw' column repeats the form `shaw_attention` picks at that length (dense up to
`relpos.attention.shaw.DENSE_MAX_KV_LEN` keys, banded above), which is what a model gets.
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from ml_collections import config_flags
from timing import compiled_temp_bytes, interleaved_median_seconds

from relpos import attention, runtime
from relpos.attention.shaw import DENSE_MAX_KV_LEN

_CONFIG = config_flags.DEFINE_config_file(
  'config',
  str(Path(__file__).resolve().parent.parent / 'configs' / 'attention_benchmark.py'),
  'Benchmark sizes.',
)


def _kernels(n, k, heads, head_dim):
  """name -> (attention(q, k, v, params), params) for causal self-attention of length n."""
  rng = np.random.default_rng(0)
  table = lambda *shape: jnp.asarray(rng.normal(size=shape) * 0.1, jnp.float32)  # noqa: E731
  mask = attention.causal_mask(n, n)
  return {
    'vanilla': (lambda q, key, v, p: attention.dot_product_attention(q, key, v, mask=mask), ()),
    'banded': (
      lambda q, key, v, p: attention.shaw_attention_banded(q, key, v, *p, mask=mask),
      (table(2 * k + 1, head_dim), table(2 * k + 1, head_dim)),
    ),
    'dense': (
      lambda q, key, v, p: attention.shaw_attention_materialized(q, key, v, *p, mask=mask),
      (table(2 * k + 1, head_dim), table(2 * k + 1, head_dim)),
    ),
    'xl': (
      lambda q, key, v, p: attention.xl_attention(q, key, v, *p),
      (table(n, heads, head_dim), table(heads, head_dim), table(heads, head_dim)),
    ),
  }


def _forward_and_backward(fn, cotangent):
  """fwd+bwd: gradients of <fn(...), cotangent> w.r.t. every input."""
  loss = lambda q, key, v, p: jnp.vdot(fn(q, key, v, p), cotangent)  # noqa: E731
  return jax.grad(loss, argnums=(0, 1, 2, 3))


def measure_row(n, k, *, batch, heads, head_dim, rounds):
  """Time and temp memory of every kernel, fwd and fwd+bwd, at one (n, k)."""
  rng = np.random.default_rng(1)
  q, key, v, cotangent = (
    jnp.asarray(rng.normal(size=(batch, n, heads, head_dim)), jnp.float32) for _ in range(4)
  )
  calls, memory = {}, {}
  for name, (fn, params) in _kernels(n, k, heads, head_dim).items():
    for mode, f in (('fwd', fn), ('fwd+bwd', _forward_and_backward(fn, cotangent))):
      jitted = jax.jit(f)
      calls[name, mode] = lambda jitted=jitted, params=params: jitted(q, key, v, params)
      memory[name, mode] = compiled_temp_bytes(f, q, key, v, params)
  seconds = interleaved_median_seconds(calls, rounds=rounds)
  return seconds, memory


def main(argv):
  del argv
  config = _CONFIG.value
  print(
    f'device: {jax.devices()[0].device_kind}  heads={config.heads} '
    f'head_dim={config.head_dim}  causal  median of {config.rounds} interleaved rounds'
  )
  header = (
    '| n | k | batch | pass | vanilla ms | shaw / vanilla | banded / vanilla | dense / vanilla '
    '| xl / vanilla | temp MiB vanilla | shaw / vanilla | banded / vanilla | dense / vanilla '
    '| xl / vanilla |'
  )
  print(header)
  print('|' + '---|' * header.count(' | ') + '---|')
  for n in config.lengths:
    batch = max(1, config.tokens // n)
    for k in config.distances:
      seconds, memory = measure_row(
        n, k, batch=batch, heads=config.heads, head_dim=config.head_dim, rounds=config.rounds
      )
      shaw = 'dense' if n <= DENSE_MAX_KV_LEN else 'banded'
      for mode in ('fwd', 'fwd+bwd'):
        base_s, base_m = seconds['vanilla', mode], memory['vanilla', mode]
        ratios = ' | '.join(
          f'{seconds[name, mode] / base_s:.2f}' + (f' ({name})' if i == 0 else '')
          for i, name in enumerate((shaw, 'banded', 'dense', 'xl'))
        )
        mem_ratios = ' | '.join(
          f'{memory[name, mode] / base_m:.2f}' for name in (shaw, 'banded', 'dense', 'xl')
        )
        print(
          f'| {n} | {k} | {batch} | {mode} | {base_s * 1e3:.1f} | {ratios} | '
          f'{base_m / 2**20:.1f} | {mem_ratios} |',
          flush=True,
        )


if __name__ == '__main__':
  runtime.apply_defaults()  # relpos's allocator (re-executes), as train.py
  app.run(main)
