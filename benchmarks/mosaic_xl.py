"""Check and time the Mosaic GPU causal Transformer-XL kernels (`relpos.attention.mosaic_xl`).

    python benchmarks/mosaic_xl.py                                 # H100/H200: enwik8_base
    python benchmarks/mosaic_xl.py --lengths=1024 --memory=1024 --batch=4
    python benchmarks/mosaic_xl.py --interpret --lengths=64 --memory=64 --batch=1 --heads=1

n queries over memory + n keys (query i at position memory + i; enwik8_base is n = memory =
512, batch 22, 8 heads of 64), bf16, forward and forward+backward. Each kernel is compiled,
checked against `xl_attention(implementation='xla')` on the same inputs (error: max |kernel -
xla| / max |xla|, float32; for the gradients of sum(z·w), w random, the largest such error over
the six inputs, with max |xla| floored at 1) and timed, interleaved
(`timing.interleaved_median_seconds`): the forward ("name") and jax.grad of that loss
("name+bwd"). Kernels (`--kernels`): mosaic (`xl_attention_mosaic`), pallas (the Triton
kernel), cudnn (`implementation='cudnn'`: the position term materialised by XLA as cuDNN's
bias) and xla. TFLOP/s counts plain causal attention's 2·B·H·n·d·(n + 2·memory) forward, 2.5
times that for forward+backward (the position term's matmuls are extra work not counted).
`--interpret` runs the Mosaic kernels in Mosaic GPU's interpreter (CPU, slow: tiny sizes only)
and times nothing. A kernel that fails to compile or run prints one 'failed' line.
"""

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from timing import check_then_time

from relpos.attention.mosaic_xl import xl_attention_mosaic
from relpos.attention.xl import xl_attention

KERNELS = ('mosaic', 'pallas', 'cudnn', 'xla')
FLAGS = flags.FLAGS
flags.DEFINE_list('lengths', ['512'], 'query lengths n')
flags.DEFINE_integer('memory', 512, 'keys before the queries (a multiple of 64)')
flags.DEFINE_list('kernels', list(KERNELS), f'any of {KERNELS}')
flags.DEFINE_integer('batch', 22, 'batch size')
flags.DEFINE_integer('heads', 8, 'heads')
flags.DEFINE_integer('head_dim', 64, 'head_dim (64; 128 forward only)')
flags.DEFINE_integer('rounds', 20, 'timing rounds')
flags.DEFINE_integer('repeats', 10, 'calls per timing')
flags.DEFINE_bool('interpret', False, "Mosaic GPU's interpreter (CPU): check only, no timing")


def kernels(names, interpret):
  """name -> f(q, k, v, rel_key, u, v), the kernel `name` (KERNELS)."""
  table = {
    'mosaic': lambda *a: xl_attention_mosaic(*a, interpret=interpret),
    **{name: (lambda *a, name=name: xl_attention(*a, implementation=name)) for name in KERNELS[1:]},
  }
  return {name: table[name] for name in names}


def run_row(names, n, interpret) -> list[str]:
  rng = np.random.default_rng(0)
  b, h, d, m = FLAGS.batch, FLAGS.heads, FLAGS.head_dim, FLAGS.memory
  shapes = [(b, n, h, d), (b, m + n, h, d), (b, m + n, h, d), (m + n, h, d), (h, d), (h, d)]
  args = [jnp.asarray(rng.standard_normal(s), jnp.bfloat16) for s in shapes]
  weight = jnp.asarray(rng.standard_normal(shapes[0]), jnp.float32)
  return check_then_time(
    kernels(names, interpret),
    kernels(['xla'], False)['xla'],
    args,
    weight,
    label=f'n={n}',
    flops=2 * b * h * n * (n + 2 * m) * d,
    check_only=interpret,
    rounds=FLAGS.rounds,
    repeats=FLAGS.repeats,
  )


def main(argv):
  del argv
  if unknown := set(FLAGS.kernels) - set(KERNELS):
    raise app.UsageError(f'unknown kernels {sorted(unknown)}; known: {KERNELS}')
  names = list(FLAGS.kernels)
  if jax.default_backend() != 'gpu' and not FLAGS.interpret:
    raise app.UsageError('the Mosaic GPU kernel needs an NVIDIA GPU; pass --interpret on a CPU')
  if FLAGS.interpret:
    names = [name for name in names if name == 'mosaic']
  print(
    f'device: {jax.devices()[0].device_kind}; batch {FLAGS.batch}, heads {FLAGS.heads}, '
    f'head_dim {FLAGS.head_dim}, bf16, causal over {FLAGS.memory} keys of memory'
  )
  for n in map(int, FLAGS.lengths):
    for line in run_row(names, n, FLAGS.interpret):
      print(line, flush=True)


if __name__ == '__main__':
  app.run(main)
