"""Threefry on the CPU as straight-line code: a backport of JAX's own change (jax-ml/jax PR
#37872, merged 2026-05-20, not in the jax 0.10.2 relpos pins).

jax 0.10.2 lowers its default PRNG, threefry2x32, to a rolled `while` loop of five iterations
on the CPU, and to straight-line code everywhere else. Every dropout site of a train step draws
its whole mask through that loop, whose small kernels run one after another over the full
activation. The unrolled form is one elementwise fusion. Upstream measured it faster to run and
to compile (JAX's thunk runtime made the rolled loop pointless); here it made a translate_tiny
train step 6-9% faster (docs/performance-cpu.md).

It is the same function of the same inputs, so every random bit (dropout masks, initial
parameters, `jax.random.split`/`fold_in` keys) is what jax 0.10.2 draws: runs, checkpoints and
the resume tests' trajectories are unchanged. Tests check the lowering against the Random123
known-answer vector and a NumPy transcription of the hash.

`relpos.models` applies it on import, so every program and library use that builds a model gets
it. `RELPOS_THREEFRY=rolled` keeps JAX's own CPU lowering. It replaces a rule in JAX's private
lowering table (`jax._src`): if a JAX release renames it, `unroll_on_cpu` returns False and JAX's
own lowering stays.
"""

import os

OFF_SWITCH = 'RELPOS_THREEFRY'  # =rolled keeps JAX's CPU lowering


def set_cpu_lowering(*, unrolled: bool) -> bool:
  """Registers JAX's straight-line threefry2x32 lowering (its rule for every other platform) for
  the CPU, or with `unrolled=False` jax 0.10.2's rolled loop; False if this JAX lacks the rule.

  A function already compiled keeps the lowering it was compiled with (benchmarks/
  translate_step.py --threefry times both in one process)."""
  try:
    from jax._src.interpreters import mlir
    from jax._src.random import threefry2x32
  except ImportError:
    return False
  name = '_threefry2x32_lowering_rule' if unrolled else '_threefry2x32_cpu_lowering_rule'
  rule = getattr(threefry2x32, name, None)
  if rule is None:
    return False
  mlir.register_lowering(threefry2x32.threefry2x32_p, rule, platform='cpu', inline=not unrolled)
  return True


def unroll_on_cpu() -> bool:
  """`set_cpu_lowering(unrolled=True)` unless RELPOS_THREEFRY=rolled; whether it did."""
  if os.environ.get(OFF_SWITCH, 'unrolled') == 'rolled':
    return False
  return set_cpu_lowering(unrolled=True)
