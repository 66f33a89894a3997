"""Timing helpers for benchmarks: interleaved rounds, so that ratios come from one run."""

import time

import jax
import jax.numpy as jnp
import numpy as np

from relpos.training.mesh import row_sharded


def peak_memory_line() -> str:
  """The process's peak device memory so far, from the devices' allocator statistics (GPU,
  TPU), as one line; '' where the backend keeps none (XLA:CPU)."""
  stats = [device.memory_stats() for device in jax.local_devices()]
  peaks = [s['peak_bytes_in_use'] for s in stats if s and 'peak_bytes_in_use' in s]
  if not peaks:
    return ''
  return (
    f'peak device memory: {max(peaks) / 2**30:.2f} GiB (the largest of {len(peaks)} devices, '
    'over every variant this process ran)'
  )


def interleaved_median_seconds(
  candidates: dict, *, rounds: int, warmup: int = 1, repeats: int = 1
) -> dict:
  """Median seconds per call of each zero-argument callable, measured round-robin.

  Every round times each candidate once, so slow drifts of a noisy machine hit all of them
  alike and their ratios stay meaningful. A timing is `repeats` calls back to back, blocked
  once at the end, divided by `repeats`: on an accelerator, where dispatch is asynchronous,
  this keeps the host's dispatch cost out of short kernels' times.
  """
  for fn in candidates.values():
    for _ in range(warmup):
      jax.block_until_ready(fn())
  times = {name: [] for name in candidates}
  for _ in range(rounds):
    for name, fn in candidates.items():
      start = time.perf_counter()
      for _ in range(repeats - 1):
        fn()
      jax.block_until_ready(fn())
      times[name].append((time.perf_counter() - start) / repeats)
  return {name: float(np.median(ts)) for name, ts in times.items()}


def step_flops(jitted, *args) -> float:
  """XLA's FLOP count of one call of `jitted` on `args`, for the whole (global) batch.

  Read from the lowered, not yet partitioned module, so a step sharded over several devices
  counts every device's share; matmuls dominate, elementwise operations count too.
  """
  return float(jitted.lower(*args).cost_analysis()['flops'])


def _matmul_gflops(matmul, rows_sharded, shape, rounds: int) -> float:
  """GFLOP/s of `matmul` on random [rows, inner] (rows split by `rows_sharded`) x [inner,
  cols] operands, from the fastest of `rounds` calls after one warm-up."""
  rows, inner, cols = shape
  generator = np.random.default_rng(0)
  lhs = jax.device_put(generator.standard_normal((rows, inner), np.float32), rows_sharded)
  rhs = jnp.asarray(generator.standard_normal((inner, cols), np.float32))
  jax.block_until_ready(matmul(lhs, rhs))
  seconds = []
  for _ in range(rounds):
    start = time.perf_counter()
    jax.block_until_ready(matmul(lhs, rhs))
    seconds.append(time.perf_counter() - start)
  return 2 * rows * inner * cols / min(seconds) / 1e9


class MatmulRate:
  """This machine's float32 matmul rate, and a step's FLOP rate against it.

  Measured on `shapes` ((rows, inner, cols): a [rows, inner] x [inner, cols] matmul, its rows
  rounded down to a multiple of the devices and split over `mesh` as a step's batch is): the
  fastest shape's GFLOP/s, from the minimum time over `rounds` calls (a rate, not a typical
  time). `line()` says what was measured, and `cells()` gives a table row's COLUMNS for one
  step.
  """

  COLUMNS = ' GFLOP / step | GFLOP/s | of matmul rate |'

  def __init__(self, mesh, shapes, *, rounds: int = 20):
    rows_sharded = row_sharded(mesh)
    matmul = jax.jit(jnp.matmul, out_shardings=rows_sharded)
    self.devices = mesh.size
    rates = {}
    for rows, inner, cols in shapes:
      shape = (rows - rows % mesh.size, inner, cols)  # the rows split evenly
      rates[shape] = _matmul_gflops(matmul, rows_sharded, shape, rounds)
    self.shape = max(rates, key=rates.get)
    self.gflops = rates[self.shape]

  def line(self) -> str:
    """What was measured, for above a table with COLUMNS."""
    rows, inner, cols = self.shape
    return (
      f'float32 matmul rate on these {self.devices} device(s): {self.gflops:.0f} GFLOP/s '
      f"([{rows}, {inner}] x [{inner}, {cols}], the fastest of the model's feed-forward and "
      'output shapes, rows split over the devices). "of matmul rate" is the step\'s FLOP rate '
      "(XLA's count) over it: at 1.00 every FLOP of the step would run as fast as that matmul."
    )

  def cells(self, flops: float, seconds: float) -> str:
    """The COLUMNS cells of one step of `flops` (XLA's count) taking `seconds`."""
    rate = flops / seconds / 1e9
    return f' {flops / 1e9:.3g} | {rate:.3g} | {rate / self.gflops:.3g} |'
