"""Timing helpers for benchmarks: interleaved rounds, so that ratios come from one run."""

import time

import jax
import jax.numpy as jnp
import numpy as np

from relpos import flops as flops_lib
from relpos.training import tasks
from relpos.training.mesh import row_sharded


def check_task_config(config, expected: tuple[str, ...], mesh=None, *, variant: str = '') -> None:
  """Raises ValueError, as one line for `relpos.cli.run_main`, unless `config` is of a task in
  `expected` and passes that task's own checks (`Task.check_config`, with `mesh`: the batch
  against the devices), the checks train.py makes. A benchmark calls it before it loads data
  or builds anything, so that a config train.py would refuse is refused here the same way, not
  as a traceback minutes later; `variant` (e.g. '--variants=xl_mem0') names the benchmark's
  own overrides when the config checked carries them."""
  task = config.get('task')
  if task not in expected:
    raise ValueError(
      f'--config: this benchmark takes a config of task {" or ".join(expected)}; the one given '
      f'has config.task={task!r}'
    )
  try:
    tasks.get(config).check_config(config, mesh)
  except ValueError as error:
    raise ValueError(f'{variant}: {error}' if variant else str(error)) from error


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


def build_within(names, build, seconds: float, *, share: float = 0.6, clock=time.perf_counter):
  """{name: build(name)} for `names` in order, as many as fit a time budget, and a line naming
  those left out ('' where none were).

  For a run under a time limit (benchmarks/gpu_run.sh gives each part one): `build` compiles
  (a variant's step, say), which dominates, and what is built is timed afterwards. The next
  name is built only while the time spent so far, plus as long again as the average build,
  stays within `share` of `seconds`, so the rest of the budget is left for timing and
  printing; the first name is always built. `seconds` 0 means no budget. Each build prints a
  line with its time, so a log of a run that was cut short still says how far it got.
  """
  start = clock()
  built, left_out = {}, ''
  for index, name in enumerate(names):
    spent = clock() - start
    if seconds and built and spent * (len(built) + 1) / len(built) > share * seconds:
      left_out = (
        f'time budget: left out {", ".join(names[index:])} (building {len(built)} took '
        f'{spent:.0f} s of --seconds={seconds:g})'
      )
      print(left_out, flush=True)
      break
    built[name] = build(name)
    print(f'built {name} in {clock() - start - spent:.1f} s', flush=True)
  return built, left_out


def with_backward(fns: dict, weight, num_inputs: int) -> dict:
  """name -> jitted f, and 'name+bwd' -> the jitted gradient of sum(f(...)·weight) with respect
  to its first `num_inputs` arguments: a kernel's forward and forward+backward passes."""
  out = {}
  for name, fn in fns.items():

    def loss(*args, fn=fn):
      return jnp.sum(fn(*args).astype(jnp.float32) * weight)

    out[name] = jax.jit(fn)
    out[f'{name}+bwd'] = jax.jit(jax.grad(loss, argnums=range(num_inputs)))
  return out


def relative_error(got, want) -> float:
  """max |got - want| / max |want| of float32 NumPy values; for gradients (tuples) the largest
  over the inputs, each with max |want| floored at 1."""
  if isinstance(want, tuple):
    return max(
      float(np.abs(g - w).max() / max(np.abs(w).max(), 1.0)) for g, w in zip(got, want, strict=True)
    )
  return float(np.abs(got - want).max() / np.abs(want).max())


def check_then_time(
  fns: dict, reference, args, weight, *, label: str, flops: float, check_only: bool, **timing
) -> list[str]:
  """Lines checking each kernel of `fns` (name -> f(*args)), forward and forward+backward
  (`with_backward`), against `reference` (the same call through XLA) on `args`, then, unless
  `check_only`, timing them interleaved (`interleaved_median_seconds(**timing)`): ms, TFLOP/s
  at `flops` forward (2.5 times that with the backward) and the ratio to cuDNN's (else XLA's)
  time of the same pass where it ran. Each line starts with `label`. A kernel that fails to
  compile or run gets one 'failed' line and is left out; the rest go on."""

  def as_f32(x):
    return jax.tree.map(lambda a: np.asarray(a, np.float32), jax.block_until_ready(x))

  fns = with_backward(fns, weight, len(args))
  wants = {
    name: as_f32(fn(*args))
    for name, fn in with_backward({'xla': reference}, weight, len(args)).items()
  }
  lines = []
  for name, fn in list(fns.items()):
    want = wants['xla+bwd' if name.endswith('+bwd') else 'xla']
    start = time.perf_counter()
    try:
      got = as_f32(fn(*args))
    except Exception as exc:  # one kernel failing to compile or run leaves out only itself
      lines.append(f'{label} {name}: failed: {type(exc).__name__}: {exc}'.split('\n')[0])
      del fns[name]
      continue
    first = time.perf_counter() - start
    error = relative_error(got, want)
    lines.append(f'{label} {name}: error vs xla {error:.2e}, first call {first:.1f} s')
  if check_only or not fns:
    return lines
  calls = {name: (lambda fn=fn: fn(*args)) for name, fn in fns.items()}
  seconds = interleaved_median_seconds(calls, **timing)
  for name, s in seconds.items():
    suffix = '+bwd' if name.endswith('+bwd') else ''
    base = next((b + suffix for b in ('cudnn', 'xla') if b + suffix in seconds), None)
    ratio = f', {s / seconds[base]:.2f}x {base}' if base else ''
    work = flops * (2.5 if suffix else 1.0)
    lines.append(f'{label} {name}: {s * 1e3:.3f} ms, {work / s / 1e12:.1f} TFLOP/s{ratio}')
  return lines


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


def with_repeated_rows(seconds: dict, repeats: dict, order, *tables: dict) -> dict:
  """`seconds` of every variant of `order`, where `repeats` maps a variant that was not built
  to the 'auto' variant whose program it is (every attention call of 'auto' chose its kernels:
  `relpos.attention.autotune.recorded_choices`), which lends it its time; each of `tables`
  ({variant: value}) gets the same entries, in place."""
  for table in tables:
    for variant, auto_variant in repeats.items():
      table[variant] = table[auto_variant]
  return {variant: seconds[repeats.get(variant, variant)] for variant in order}


def repeated_row_line(variant: str, auto_variant: str) -> str:
  """The line saying that `variant`'s row repeats `auto_variant`'s (`with_repeated_rows`)."""
  return (
    f"{variant}: not built again: every attention call of '{auto_variant}' chose these "
    f"kernels, so it is the same program (the row repeats '{auto_variant}''s time)"
  )


def xla_flops(cost_analysis) -> float | None:
  """The 'flops' of an XLA cost analysis, or None where there is none.

  `Lowered.cost_analysis()` and `Compiled.cost_analysis()` return None where the backend has
  no analysis (the lowered module on a GPU), a dict on jax 0.10, and a list of one dict per
  program on older versions (the first is the whole program); a count XLA could not make is
  negative or absent.
  """
  if isinstance(cost_analysis, (list, tuple)):
    cost_analysis = cost_analysis[0] if cost_analysis else None
  if not isinstance(cost_analysis, dict):
    return None
  flops = cost_analysis.get('flops')
  return float(flops) if flops is not None and flops >= 0 else None


def step_flops(jitted, *args, devices: int = 1) -> float | None:
  """XLA's FLOP count of one call of `jitted` on `args`, for the whole (global) batch, or None
  where XLA gives none (never an error: a benchmark prints "n/a").

  Read from the lowered, not yet partitioned module, so a step sharded over several devices
  counts every device's share; matmuls dominate, elementwise operations count too. Where the
  lowered module has no analysis (a GPU), the compiled one's is read instead: that module is
  one device's program, so its count is multiplied by `devices` (the data-parallel devices
  that each run it on their rows). Custom calls (Pallas kernels, cuDNN attention) count 0 in
  either.
  """
  lowered = jitted.lower(*args)
  flops = xla_flops(lowered.cost_analysis())
  if flops is None:
    per_device = xla_flops(lowered.compile().cost_analysis())
    flops = None if per_device is None else per_device * devices
  return flops


def peak_rate(mesh, dtype: str, matmul_shapes, *, rounds: int = 20):
  """(the peak FLOP/s of the mesh's devices together, or None; a line saying what it is).

  A CPU's peak is its measured float32 matmul rate (`MatmulRate` on `matmul_shapes`, the
  model's own); an accelerator's is the data-sheet dense peak of its device kind in the
  compute `dtype` (`relpos.flops.device_peak`) times the devices. An unknown device has
  none: MFU is then n/a, and the line says why.
  """
  device = mesh.devices.flat[0]
  if device.platform == 'cpu':
    rate = MatmulRate(mesh, matmul_shapes, rounds=rounds)
    return rate.gflops * 1e9, rate.line()
  peak = flops_lib.device_peak(device.device_kind, dtype)
  if peak is None:
    return None, (
      f'MFU n/a: relpos.flops.PEAKS has no data-sheet peak for device kind '
      f'{device.device_kind!r} in {dtype}'
    )
  return peak.tflops * 1e12 * mesh.size, (
    f'peak: {peak.description} x {mesh.size} device(s) = {peak.tflops * mesh.size:g} TFLOP/s '
    f'({device.device_kind!r}, compute dtype {dtype}); MFU = model FLOPs per second over it'
  )


# The model-FLOP columns of a step benchmark's table (`step_cells`), after its own.
STEP_COLUMNS = ' model GFLOP / step | XLA GFLOP / step | model GFLOP/s | MFU | MFU, visible pairs |'
CONVENTION_LINE = (
  "model FLOPs (relpos.flops): matmuls at 2·m·k·n plus each position scheme's own elementwise "
  'terms, every query-key pair of the attention rectangle counted; a training step is 3 x the '
  'forward count; rematerialisation not counted. "MFU, visible pairs" leaves out the pairs a '
  "causal mask hides. XLA's count (cost analysis, n/a where there is none) adds softmax, "
  "LayerNorm, the optimizer and the kernels' own extra work, and counts custom calls as 0."
)


def _figure(value: float) -> str:
  """A rate or count for a table cell: 3 significant figures, whole numbers from 1000 up."""
  return f'{value:.0f}' if value >= 1000 else f'{value:.3g}'


def step_cells(model_flops, xla_count: float | None, seconds: float, peak: float | None) -> str:
  """The STEP_COLUMNS cells of one step taking `seconds`.

  Args:
    model_flops: the step's `relpos.flops.Flops` of the forward pass (the cells show a
      training step's: `train_step()`).
    xla_count: XLA's FLOP count of the step (`step_flops`), or None.
    seconds: the step's time.
    peak: the devices' peak FLOP/s (`peak_rate`), or None.
  """
  full, visible = model_flops.train_step(), model_flops.train_step(visible_only=True)
  xla = 'n/a' if xla_count is None else _figure(xla_count / 1e9)
  cells = [_figure(full / 1e9), xla, _figure(full / seconds / 1e9)]
  for count in (full, visible):
    utilisation = flops_lib.mfu(count, seconds, peak)
    cells.append('n/a' if utilisation is None else f'{utilisation:.3g}')
  return ' ' + ' | '.join(cells) + ' |'


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
  """This machine's float32 matmul rate: the peak a CPU's MFU divides by (`peak_rate`).

  Measured on `shapes` ((rows, inner, cols): a [rows, inner] x [inner, cols] matmul, its rows
  rounded down to a multiple of the devices and split over `mesh` as a step's batch is): the
  fastest shape's GFLOP/s, from the minimum time over `rounds` calls (a rate, not a typical
  time). `line()` says what was measured.
  """

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
    """What was measured, for above a table with STEP_COLUMNS."""
    rows, inner, cols = self.shape
    return (
      f'peak: the float32 matmul rate on these {self.devices} CPU device(s), '
      f'{_figure(self.gflops)} GFLOP/s ([{rows}, {inner}] x [{inner}, {cols}], the fastest of '
      "the model's feed-forward and output shapes, rows split over the devices). MFU is the "
      "step's model "
      'FLOP rate over it: at 1.00 every model FLOP would run as fast as that matmul.'
    )
