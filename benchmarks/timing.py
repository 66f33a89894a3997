"""Timing helpers for benchmarks: interleaved rounds, so that ratios come from one run."""

import time

import jax
import numpy as np


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
