"""Check and time the Mosaic GPU causal Shaw kernels (`relpos.attention.mosaic_shaw`) on a GPU.

    python benchmarks/mosaic_shaw.py                                  # H100/H200: check, time
    python benchmarks/mosaic_shaw.py --lengths=1024,4096 --distances=16,64 --head_dim=128
    python benchmarks/mosaic_shaw.py --interpret --lengths=128 --distances=3 --kernels=mosaic
    python benchmarks/mosaic_shaw.py --batch=22 --lengths=512 --memory=512 --distances=16  # enwik8

Causal self-attention, bf16, forward and forward+backward. For each (n, k) every kernel is
compiled, checked against `shaw_attention(implementation='xla')` on the same inputs (error: max
|kernel - xla| / max |xla|, float32; for the gradients of sum(z·w), w random, the largest such
error over query, key, value, rel_key, rel_value, with max |xla| floored at 1) and timed,
interleaved (`timing.interleaved_median_seconds`), so ratios come from one run: the forward
("name") and jax.grad of that loss ("name+bwd": forward and backward). Kernels (`--kernels`):
mosaic and mosaic_ws (`shaw_attention_mosaic`, one warpgroup / warp-specialised), pallas (the
Triton kernel, `implementation='pallas'`), xla, and cudnn (`jax.nn.dot_product_attention`,
plain causal flash attention without the relative terms: the speed to aim for; NVIDIA only).
TFLOP/s counts plain causal attention's 2·B·H·n²·d for every kernel forward, 2.5 times that
for forward+backward (FlashAttention's convention). `--memory=m` puts m keys before the n
queries (Transformer-XL: n queries over m + n keys, query i at position m + i, key j visible iff
j <= m + i; enwik8_base is n = m = 512); then the count is 2·B·H·n·d·(n + 2m), and cudnn, whose
is_causal is aligned top-left, gets that mask as an additive bias instead (no tile skipping).
`--interpret` runs the Mosaic kernels in Mosaic GPU's interpreter (CPU, slow: tiny sizes only)
and times nothing. A kernel that fails to compile or run prints one 'failed' line and is left
out of the timing.
"""

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from timing import check_then_time

from relpos import attention, flag_types, runtime
from relpos.attention.mosaic_shaw import shaw_attention_mosaic

KERNELS = ('mosaic', 'mosaic_ws', 'pallas', 'xla', 'cudnn')
FLAGS = flags.FLAGS
flag_types.define_int_list('lengths', '1024,4096', 'sequence lengths n', minimum=1)
flag_types.define_int_list('distances', '16,64', 'clipping distances k', minimum=0)
flags.DEFINE_list('kernels', list(KERNELS), f'any of {KERNELS}')
flags.DEFINE_integer(
  'memory', 0, 'keys before the queries: n queries over memory + n keys', lower_bound=0
)
flags.DEFINE_integer('batch', 4, 'batch size', lower_bound=1)
flags.DEFINE_integer('heads', 8, 'heads', lower_bound=1)
flags.DEFINE_integer('head_dim', 64, 'head_dim (a multiple of 64)', lower_bound=1)
flags.DEFINE_integer('block_q', 64, 'block_q of the Mosaic kernels', lower_bound=1)
flags.DEFINE_integer('block_kv', 64, 'block_kv of the Mosaic kernels', lower_bound=1)
flags.DEFINE_integer('rounds', 20, 'timing rounds', lower_bound=1)
flags.DEFINE_integer('repeats', 10, 'calls per timing', lower_bound=1)
flags.DEFINE_bool('interpret', False, "Mosaic GPU's interpreter (CPU): check only, no timing")


def cudnn(q, k, v, *_):
  """Plain causal flash attention by cuDNN (no relative terms). Over a memory, the causal mask
  (queries aligned bottom-right) as a bias: cuDNN's is_causal aligns them top-left."""
  if q.shape[1] == k.shape[1]:
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation='cudnn')
  mask = attention.causal_mask(q.shape[1], k.shape[1])
  bias = jnp.where(mask, 0.0, -(2.0**41)).astype(q.dtype)[None, None]
  return jax.nn.dot_product_attention(q, k, v, bias=bias, implementation='cudnn')


def kernels(names, n, interpret):
  """name -> jitted f(q, k, v, rel_key, rel_value) -> [batch, n, heads, head_dim]; keys and
  values have FLAGS.memory + n positions."""
  mask = attention.causal_mask(n, n + FLAGS.memory)
  blocks = {'block_q': FLAGS.block_q, 'block_kv': FLAGS.block_kv, 'interpret': interpret}
  shaw = attention.shaw_attention
  table = {
    'mosaic': lambda *a: shaw_attention_mosaic(*a, **blocks),
    'mosaic_ws': lambda *a: shaw_attention_mosaic(*a, warp_specialized=True, **blocks),
    'pallas': lambda *a: shaw(*a, mask=mask, implementation='pallas'),
    'xla': lambda *a: shaw(*a, mask=mask, implementation='xla'),
    'cudnn': cudnn,
  }
  return {name: jax.jit(table[name]) for name in names}


def run_row(names, n, k, interpret) -> list[str]:
  rng = np.random.default_rng(0)
  shape = (FLAGS.batch, n, FLAGS.heads, FLAGS.head_dim)
  kv_shape = (FLAGS.batch, FLAGS.memory + n, FLAGS.heads, FLAGS.head_dim)
  q, key, v = (
    jnp.asarray(rng.standard_normal(s), jnp.bfloat16) for s in (shape, kv_shape, kv_shape)
  )
  rel = [
    jnp.asarray(rng.standard_normal((2 * k + 1, FLAGS.head_dim)) * 0.1, jnp.bfloat16)
    for _ in range(2)
  ]
  weight = jnp.asarray(rng.standard_normal(shape), jnp.float32)
  return check_then_time(
    kernels(names, n, interpret),
    kernels(['xla'], n, False)['xla'],
    (q, key, v, *rel),
    weight,
    label=f'n={n} k={k}',
    flops=2 * FLAGS.batch * FLAGS.heads * n * (n + 2 * FLAGS.memory) * FLAGS.head_dim,
    check_only=interpret,
    rounds=FLAGS.rounds,
    repeats=FLAGS.repeats,
  )


def main(argv):
  del argv
  names = [name for name in FLAGS.kernels if name in KERNELS]
  if unknown := set(FLAGS.kernels) - set(KERNELS):
    raise ValueError(f'--kernels: unknown {sorted(unknown)}; choose from {", ".join(KERNELS)}')
  lengths, distances = FLAGS.lengths, FLAGS.distances
  platform = jax.default_backend()
  if platform != 'gpu' and not FLAGS.interpret:
    raise ValueError(
      f'the Mosaic GPU kernels need an NVIDIA GPU (backend {platform}); '
      'pass --interpret to check them on the CPU'
    )
  if FLAGS.interpret:
    names = [name for name in names if name.startswith('mosaic')]
  print(
    f'device: {jax.devices()[0].device_kind}; batch {FLAGS.batch}, heads {FLAGS.heads}, '
    f'head_dim {FLAGS.head_dim}, bf16, causal, forward and forward+backward'
    + (f', {FLAGS.memory} keys of memory before the n queries' if FLAGS.memory else '')
  )
  for n in lengths:
    for k in distances:
      for line in run_row(names, n, k, FLAGS.interpret):
        print(line, flush=True)


if __name__ == '__main__':
  runtime.apply_defaults()  # as every relpos program
  from relpos.cli import run_main  # after apply_defaults: it imports jax, as train.py

  run_main(main)
