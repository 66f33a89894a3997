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

Then (`--anatomy`, on by default on a GPU) where XL through cuDNN spends its time: at the same
shapes, cuDNN's flash attention timed in four forms, each forward and forward+backward
(`cudnn_parts`): 'flash', no bias and no mask (every query-key pair of the rectangle: the
causal call does less); 'flash_mask', a boolean mask [B, H, n, memory + n], which JAX hands
cuDNN as a bias it reads but whose gradient it does not ask for (what reading a bias costs;
JAX asks cuDNN for a bias's gradient whenever a bias is given, differentiated or not, so a
stopped bias would not do); 'flash_dbias', a bias of that shape in the input dtype and its
gradient (what cuDNN's writing it costs); and 'xl_cudnn', `implementation='cudnn'` itself (the
position matmuls, the shift and the mask besides). On an H200 on 2026-11-27 the last took
1.94 ms forward+backward a layer at enwik8_base's shape (its 12 layers about two thirds of the
bf16 step), where flash attention without a bias should take about 0.25 ms (docs/gpu.md, "What
40% MFU asks of the enwik8_base XL step"): these rows say which part takes the difference.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from timing import check_then_time, interleaved_median_seconds

from relpos import flag_types, runtime
from relpos.attention.mosaic_xl import xl_attention_mosaic
from relpos.attention.xl import xl_attention

KERNELS = ('mosaic', 'pallas', 'cudnn', 'xla')
FLAGS = flags.FLAGS
flag_types.define_int_list('lengths', '512', 'query lengths n', minimum=1)
flags.DEFINE_integer('memory', 512, 'keys before the queries (a multiple of 64)', lower_bound=0)
flags.DEFINE_list('kernels', list(KERNELS), f'any of {KERNELS}')
flags.DEFINE_integer('batch', 22, 'batch size', lower_bound=1)
flags.DEFINE_integer('heads', 8, 'heads', lower_bound=1)
flags.DEFINE_integer('head_dim', 64, 'head_dim (64; 128 forward only)', lower_bound=1)
flags.DEFINE_integer('rounds', 20, 'timing rounds', lower_bound=1)
flags.DEFINE_integer('repeats', 10, 'calls per timing', lower_bound=1)
flags.DEFINE_bool('interpret', False, "Mosaic GPU's interpreter (CPU): check only, no timing")
flags.DEFINE_bool('anatomy', True, "then time XL-through-cuDNN's parts (cudnn_parts); GPU only")


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


def cudnn_parts(implementation='cudnn'):
  """name -> (f(q, k, v, rel_key, u, v, bias) -> attention output, the arguments its backward
  differentiates): the four forms of the module docstring ('flash_mask' masks where the bias
  argument is not positive: about half the pairs, at random). `implementation` is
  jax.nn.dot_product_attention's ('xla' on a CPU, to test the plumbing)."""

  def flash(q, k, v, rel_key, u, w, bias, *, use=None):
    del rel_key, u, w
    return jax.nn.dot_product_attention(
      q,
      k,
      v,
      bias=bias if use == 'bias' else None,
      mask=bias > 0 if use == 'mask' else None,
      implementation=implementation,
    )

  def xl(q, k, v, rel_key, u, w, bias):
    del bias
    xl_implementation = 'cudnn' if implementation == 'cudnn' else 'xla'
    return xl_attention(q, k, v, rel_key, u, w, implementation=xl_implementation)

  return {
    'flash': (flash, (0, 1, 2)),
    'flash_mask': (functools.partial(flash, use='mask'), (0, 1, 2)),
    'flash_dbias': (functools.partial(flash, use='bias'), (0, 1, 2, 6)),
    'xl_cudnn': (xl, tuple(range(6))),
  }


def cudnn_part_rows(n, m, b, h, d, *, implementation='cudnn', rounds, repeats) -> list[str]:
  """One line per form of `cudnn_parts` and pass ('name' forward, 'name+bwd' the gradient of
  sum(output·w)) at batch b, n queries over m + n keys, h heads of d: ms, and the share of
  'xl_cudnn''s time of the same pass. A form that fails prints one 'failed' line."""
  rng = np.random.default_rng(1)
  shapes = [(b, n, h, d), (b, m + n, h, d), (b, m + n, h, d), (m + n, h, d), (h, d), (h, d)]
  shapes.append((b, h, n, m + n))
  args = [jnp.asarray(rng.standard_normal(s), jnp.bfloat16) for s in shapes]
  weight = jnp.asarray(rng.standard_normal(shapes[0]), jnp.float32)
  fns = {}
  for name, (fn, argnums) in cudnn_parts(implementation).items():

    def loss(*a, fn=fn):
      return jnp.sum(fn(*a).astype(jnp.float32) * weight)

    fns[name] = jax.jit(fn)
    fns[f'{name}+bwd'] = jax.jit(jax.grad(loss, argnums=argnums))
  lines, calls = [], {}
  for name, fn in fns.items():
    try:
      jax.block_until_ready(fn(*args))
    except Exception as exc:  # a form that cuDNN refuses leaves out only itself
      lines.append(f'n={n} cudnn part {name}: failed: {type(exc).__name__}: {exc}'.split('\n')[0])
      continue
    calls[name] = lambda fn=fn: fn(*args)
  seconds = interleaved_median_seconds(calls, rounds=rounds, repeats=repeats) if calls else {}
  for name, s in seconds.items():
    whole = 'xl_cudnn+bwd' if name.endswith('+bwd') else 'xl_cudnn'
    share = f', {s / seconds[whole]:.2f} of {whole}' if whole in seconds else ''
    lines.append(f'n={n} cudnn part {name}: {s * 1e3:.3f} ms{share}')
  return lines


def main(argv):
  del argv
  if unknown := set(FLAGS.kernels) - set(KERNELS):
    raise ValueError(f'--kernels: unknown {sorted(unknown)}; choose from {", ".join(KERNELS)}')
  names = list(FLAGS.kernels)
  lengths = FLAGS.lengths
  if jax.default_backend() != 'gpu' and not FLAGS.interpret:
    raise ValueError('the Mosaic GPU kernel needs an NVIDIA GPU; pass --interpret on a CPU')
  if FLAGS.interpret:
    names = [name for name in names if name == 'mosaic']
  print(
    f'device: {jax.devices()[0].device_kind}; batch {FLAGS.batch}, heads {FLAGS.heads}, '
    f'head_dim {FLAGS.head_dim}, bf16, causal over {FLAGS.memory} keys of memory'
  )
  for n in lengths:
    for line in run_row(names, n, FLAGS.interpret):
      print(line, flush=True)
  if FLAGS.anatomy and not FLAGS.interpret:
    for n in lengths:
      shape = (n, FLAGS.memory, FLAGS.batch, FLAGS.heads, FLAGS.head_dim)
      for line in cudnn_part_rows(*shape, rounds=FLAGS.rounds, repeats=FLAGS.repeats):
        print(line, flush=True)


if __name__ == '__main__':
  runtime.apply_defaults()  # as every relpos program
  from relpos.cli import run_main  # after apply_defaults: it imports jax, as train.py

  run_main(main)
