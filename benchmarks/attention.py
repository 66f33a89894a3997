"""Attention kernel benchmark: Shaw (its forms and the Pallas kernel) and Transformer-XL vs vanilla.

    python benchmarks/attention.py --config=configs/attention_benchmark.py        # CPU table
    python benchmarks/attention.py --config=configs/attention_benchmark.py:quick  # ~1 min
    python benchmarks/attention.py --config=configs/attention_benchmark.py:gpu    # on a GPU

Causal self-attention, forward and forward+backward. Every (n, k) is measured in one run with
the kernels interleaved, and each row reports its ratio to vanilla attention of the same size,
so the table compares kernels, not machines. Kernels (`config.kernels`):

- vanilla: `relpos.attention.dot_product_attention` (XLA), the base of every ratio;
- cudnn: `jax.nn.dot_product_attention(implementation='cudnn')`, the flash baseline (NVIDIA
  GPUs only; skipped elsewhere, with a line saying so);
- shaw: `shaw_attention` as a model gets it, named with the form it picks at that length
  (`relpos.attention.shaw.xla_form`: dense up to `DENSE_MAX_KV_LEN` keys, banded above);
  banded and dense: the two forms forced; shaw_pallas: the fused Pallas kernel (interpreted
  on CPU: slow);
- xl, xl_pallas, xl_cudnn: `xl_attention` with `implementation='xla'`, `'pallas'` and
  `'cudnn'` (its position term as the bias of cuDNN's flash attention; bf16/fp16, GPU only);
- shaw_mosaic, xl_mosaic: `implementation='mosaic'`, the causal Mosaic GPU kernels
  (`relpos.attention.mosaic_shaw`, `mosaic_xl`: wgmma and TMA, Hopper; bf16/fp16, GPU only;
  'xla' at shapes they do not serve, `relpos.attention.mosaic_dispatch`);
- a Pallas kernel with `@QxK`, e.g. shaw_pallas@128x64: that kernel with `block_sizes=(Q, K)`
  instead of its default tiles, so that one run can compare tilings;
- flash_pallas, flash_mosaic: JAX's own Pallas flash attention, without relative terms, as
  ceilings of what each Pallas backend reaches at these shapes: `flash_pallas` is the Triton
  backend's (`jax.experimental.pallas.ops.gpu.attention.mha`, the backend of relpos's fused
  kernels; interpreted on a CPU), `flash_mosaic` Mosaic GPU's FA3-style kernel
  (`attention_mgpu.attention`: wgmma and TMA, Hopper; GPU only). flash_mosaic runs in float16
  (its shared-memory buffers are float16; the same tensor-core rate as bf16) and forward only:
  its backward does not take a causal mask, so its fwd+bwd row is left out, with the reason.

A function that fails to lower or compile (a tiling over the GPU's shared memory, a kernel
without a backward pass) is left out of the table with one line saying why; the rest run.

Every function is compiled before any is timed, `config.compile_threads` at a time (0: one
per core); kernels without a k (vanilla, cudnn, flash_*, xl*) once per n, timed in
each k's row. Each Pallas kernel's outputs (fwd) and gradients (fwd+bwd) are checked against
its XLA implementation on the same inputs (JAX's flash kernels against vanilla attention):
"error vs xla" is max |pallas - xla| / max |xla|.
A timing is `config.repeats` calls dispatched back to back (more than one on a GPU, so that
short kernels are not timed as the host's dispatch).

Temp memory is XLA's `memory_analysis().temp_size_in_bytes` of the compiled function. TFLOP/s
counts vanilla causal attention's work for every kernel: 2·B·H·n²·d forward (half of the
dense 4·B·H·n²·d) and 3.5× that for forward+backward, as flash-attention papers count it. A
relative kernel's extra work therefore shows as a lower rate. "% of peak" divides by the
device's data-sheet dense peak in the benchmark's dtype where relpos knows it
(`relpos.flops.PEAKS`: bf16/fp16, or TF32 for float32 on NVIDIA GPUs), or `config.peak_tflops`.
`--config.plot=ratios.png` also draws time / vanilla against n, a panel per pass and a line per
kernel and k. `--config.profile="('xl_pallas',)"` then traces each named kernel's fwd+bwd at
every (n, k) (`step_profile.profile`, 3 calls) and prints where its time goes, op by op: a
Pallas kernel's custom call with the kernel's own name (forward, dq, dk/dv, d rel).
"""

import concurrent.futures
import functools
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import step_profile
from ml_collections import config_flags
from timing import interleaved_median_seconds

from relpos import attention, runtime
from relpos.attention.shaw import xla_form
from relpos.config import checks
from relpos.flops import device_peak
from relpos.studies import figures

KERNELS = (
  'vanilla',
  'cudnn',
  'flash_pallas',
  'flash_mosaic',
  'shaw',
  'banded',
  'dense',
  'shaw_pallas',
  'xl',
  'xl_pallas',
  'xl_cudnn',
  'shaw_mosaic',
  'xl_mosaic',
)
# Kernels that run only on an NVIDIA GPU (left out elsewhere, with a line saying so; the Mosaic
# GPU kernels interpret on a CPU, too slowly for a table: benchmarks/mosaic_*.py --interpret).
GPU_ONLY = ('cudnn', 'flash_mosaic', 'xl_cudnn', 'shaw_mosaic', 'xl_mosaic')
# The kernels whose inputs depend on the clipping distance k (the others are lowered once per n).
USES_K = ('shaw', 'banded', 'dense', 'shaw_pallas', 'shaw_mosaic')
# relpos's Pallas kernels (they take tiles) and their XLA implementations.
XLA_OF_PALLAS = {'shaw_pallas': 'shaw', 'xl_pallas': 'xl'}
# What each Pallas kernel's outputs and gradients are checked against ("error vs xla").
CHECKED_AGAINST = {
  **XLA_OF_PALLAS,
  'flash_pallas': 'vanilla',
  'flash_mosaic': 'vanilla',
  'xl_cudnn': 'xl',
  'shaw_mosaic': 'shaw',
  'xl_mosaic': 'xl',
}


def split_tiles(name: str):
  """(kernel, block_sizes): ('shaw_pallas', (128, 64)) for 'shaw_pallas@128x64', (name, None)
  for a name without tiles. Raises ValueError for tiles that are not QxK or not on a Pallas
  kernel."""
  kernel, _, tiles = name.partition('@')
  if not tiles:
    return kernel, None
  try:
    block_q, block_k = (int(size) for size in tiles.split('x'))
  except ValueError:
    raise ValueError(f'{name!r}: tiles must be QxK, e.g. {kernel}@64x64') from None
  if kernel not in XLA_OF_PALLAS:
    raise ValueError(f'{name!r}: only {", ".join(XLA_OF_PALLAS)} take tiles')
  return kernel, (block_q, block_k)


def _kernels(names, n, k, heads, head_dim, dtype):
  """name -> (attention(q, k, v, params), params) for causal self-attention of length n."""
  rng = np.random.default_rng(0)
  table = lambda *shape: jnp.asarray(rng.normal(size=shape) * 0.1, dtype)  # noqa: E731
  mask = attention.causal_mask(n, n)
  shaw_tables = (table(2 * k + 1, head_dim), table(2 * k + 1, head_dim))
  xl_params = (table(n, heads, head_dim), table(heads, head_dim), table(heads, head_dim))
  shaw = attention.shaw_attention
  xl = attention.xl_attention
  interpret = jax.default_backend() != 'gpu'
  kernels = {
    'vanilla': (lambda q, key, v, p: attention.dot_product_attention(q, key, v, mask=mask), ()),
    'cudnn': (
      lambda q, key, v, p: jax.nn.dot_product_attention(
        q, key, v, is_causal=True, implementation='cudnn'
      ),
      (),
    ),
    'flash_pallas': (
      lambda q, key, v, p: _jax_flash_triton(q, key, v, interpret=interpret),
      (),
    ),
    'flash_mosaic': (lambda q, key, v, p: _jax_flash_mosaic(q, key, v), ()),
    # Shaw's public kernel as the models call it: causal=True, no mask array (the fused
    # kernels bound their loops by the causal mask as cuDNN's is_causal does).
    'shaw': (lambda q, key, v, p: shaw(q, key, v, *p, causal=True), shaw_tables),
    'banded': (
      lambda q, key, v, p: attention.shaw_attention_banded(q, key, v, *p, mask=mask),
      shaw_tables,
    ),
    'dense': (
      lambda q, key, v, p: attention.shaw_attention_dense(q, key, v, *p, mask=mask),
      shaw_tables,
    ),
    'xl': (lambda q, key, v, p: xl(q, key, v, *p, implementation='xla'), xl_params),
    'xl_cudnn': (lambda q, key, v, p: xl(q, key, v, *p, implementation='cudnn'), xl_params),
    'shaw_mosaic': (
      lambda q, key, v, p: shaw(q, key, v, *p, causal=True, implementation='mosaic'),
      shaw_tables,
    ),
    'xl_mosaic': (lambda q, key, v, p: xl(q, key, v, *p, implementation='mosaic'), xl_params),
  }

  def pallas(name, blocks):
    if name == 'shaw_pallas':
      fn = functools.partial(shaw, causal=True, implementation='pallas', block_sizes=blocks)
      return lambda q, key, v, p: fn(q, key, v, *p), shaw_tables
    fn = functools.partial(xl, implementation='pallas', block_sizes=blocks)
    return lambda q, key, v, p: fn(q, key, v, *p), xl_params

  def kernel(name):
    base, blocks = split_tiles(name)
    return pallas(base, blocks) if base in XLA_OF_PALLAS else kernels[name]

  return {name: kernel(name) for name in names}


def _jax_flash_triton(q, key, v, *, interpret):
  """JAX's Pallas (Triton) flash attention, causal, scaled by 1/sqrt(head_dim)."""
  from jax.experimental.pallas.ops.gpu import attention as triton_flash

  scale = 1.0 / np.sqrt(q.shape[-1])
  return triton_flash.mha(q, key, v, None, sm_scale=scale, causal=True, interpret=interpret)


def _jax_flash_mosaic(q, key, v):
  """JAX's Mosaic GPU flash attention (FA3-style), causal, in float16 (its shared-memory
  buffers are float16), queries scaled by 1/sqrt(head_dim) (the kernel does not scale)."""
  from jax.experimental.pallas.ops.gpu import attention_mgpu

  config = attention_mgpu.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2, causal=True)
  half = lambda x: x.astype(jnp.float16)  # noqa: E731
  q = q * (1.0 / np.sqrt(q.shape[-1]))
  return attention_mgpu.attention(half(q), half(key), half(v), config).astype(v.dtype)


def _forward_and_backward(fn):
  """fwd+bwd: gradients of <fn(q, key, v, p), cotangent> w.r.t. q, key, v and p (the cotangent
  is an argument: a closed-over array would be a constant that XLA folds while compiling)."""

  def gradients(q, key, v, p, cotangent):
    loss = lambda *inputs: jnp.vdot(fn(*inputs), cotangent)  # noqa: E731
    return jax.grad(loss, argnums=(0, 1, 2, 3))(q, key, v, p)

  return gradients


def lower_row(names, n, k, *, batch, heads, head_dim, dtype):
  """({(kernel, pass): jax.stages.Lowered, or the exception its lowering raised},
  {(kernel, pass): its arguments}) at one (n, k)."""
  rng = np.random.default_rng(1)
  q, key, v, cotangent = (
    jnp.asarray(rng.normal(size=(batch, n, heads, head_dim)), dtype) for _ in range(4)
  )
  lowered, arguments = {}, {}
  for name, (fn, params) in _kernels(names, n, k, heads, head_dim, dtype).items():
    arguments[name, 'fwd'] = (q, key, v, params)
    arguments[name, 'fwd+bwd'] = (q, key, v, params, cotangent)
    for mode, f in (('fwd', fn), ('fwd+bwd', _forward_and_backward(fn))):
      try:
        lowered[name, mode] = jax.jit(f).lower(*arguments[name, mode])
      except Exception as error:  # reported by the caller, like a failed compile
        lowered[name, mode] = error
  return lowered, arguments


def compile_all(lowered: dict, threads: int) -> tuple[dict, dict]:
  """({key: jax.stages.Compiled}, {key: the exception of a compile that failed}) of
  {key: Lowered}, `threads` compiles at a time: XLA releases the GIL while it compiles, so on
  a GPU the Pallas kernels' slow Triton compiles overlap. A failed compile (a tiling over the
  GPU's shared memory, say) costs its own rows, not the run's; so does a lowering that failed
  (an exception in place of the Lowered, from `lower_row`)."""

  def compile_one(stage):
    if isinstance(stage, Exception):
      return stage
    try:
      return stage.compile()
    except Exception as error:  # reported by the caller, row by row
      return error

  with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as pool:
    results = dict(zip(lowered, pool.map(compile_one, lowered.values()), strict=True))
  failed = {key: result for key, result in results.items() if isinstance(result, Exception)}
  return {key: result for key, result in results.items() if key not in failed}, failed


def relative_error(got, want) -> float:
  """max |got - want| / max |want| over every array of two equal pytrees."""
  pairs = zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
  diffs, scales = zip(
    *(
      (
        float(jnp.max(jnp.abs(g.astype(jnp.float32) - w.astype(jnp.float32)))),
        float(jnp.max(jnp.abs(w.astype(jnp.float32)))),
      )
      for g, w in pairs
    ),
    strict=True,
  )
  return max(diffs) / max(max(scales), 1e-30)


def measure_row(compiled, arguments, *, rounds, repeats=1):
  """Times, temp memory and agreement of one (n, k)'s compiled kernels:
  ({(kernel, pass): seconds}, {(kernel, pass): temp bytes}, {(kernel, pass): relative error
  of a Pallas kernel against its XLA implementation (`relative_error`), where both ran})."""
  calls = {key: functools.partial(fn, *arguments[key]) for key, fn in compiled.items()}
  memory = {key: fn.memory_analysis().temp_size_in_bytes for key, fn in compiled.items()}
  errors = {
    (name, mode): relative_error(call(), calls[CHECKED_AGAINST[split_tiles(name)[0]], mode]())
    for (name, mode), call in calls.items()
    if (CHECKED_AGAINST.get(split_tiles(name)[0]), mode) in calls
  }
  seconds = interleaved_median_seconds(calls, rounds=rounds, repeats=repeats)
  return seconds, memory, errors


def vanilla_causal_flops(n, *, batch, heads, head_dim, mode) -> float:
  """The model FLOPs of causal attention: 2·B·H·n²·d forward, 3.5× that forward+backward."""
  forward = 2.0 * batch * heads * n * n * head_dim
  return forward if mode == 'fwd' else 3.5 * forward


def peak_tflops(config, device_kind: str) -> float:
  """config.peak_tflops if set, else the data-sheet dense peak of the device in config.dtype
  (`relpos.flops.device_peak`: bf16, or float32 as JAX runs it, TF32 on NVIDIA GPUs; float16
  at the bf16 rate, the same tensor-core rate on these GPUs), else 0 (unknown device, CPU)."""
  if config.peak_tflops:
    return config.peak_tflops
  dtype = 'bfloat16' if config.dtype == 'float16' else config.dtype
  peak = device_peak(device_kind, dtype)
  return 0.0 if peak is None else peak.tflops


# The rules of configs/attention_benchmark.py's fields (`relpos.config.checks`), and of its
# lists, which must not be empty (no row, or no Shaw kernel's row, would be timed).
RULES = {
  'heads': checks.integer(1),
  'head_dim': checks.integer(1),
  'tokens': checks.integer(1),
  'rounds': checks.integer(1),
  'repeats': checks.integer(1),
  'compile_threads': checks.integer(0),
  'dtype': checks.one_of('float32', 'bfloat16', 'float16'),
  'peak_tflops': checks.number(0.0),
  'plot': checks.TEXT,
  'kernels': checks.Rule(tuple),
  'profile': checks.Rule(tuple),
}
LISTS = {'lengths': checks.integer(1), 'distances': checks.integer(0)}


def check_config(config) -> None:
  """Raises ValueError naming the field for a config this benchmark cannot run, before
  anything is built: another kind of config (--config), a value out of range, an empty list,
  an unknown kernel (to time or to profile)."""
  checks.require_fields(
    config, (*RULES, *LISTS), 'configs/attention_benchmark.py (heads, lengths, kernels, ...)'
  )
  checks.check(config, RULES)
  checks.check_sequences(config, LISTS)
  # A profiled kernel need not be timed (a preset's profile outlives a narrower kernels
  # override: it is skipped), but must be a kernel: a misspelt name would be skipped too.
  for field in ('kernels', 'profile'):
    check_kernel_names(config[field], field)


def check_kernel_names(names, field: str) -> None:
  """Raises ValueError naming config.<field> for a name that is not a kernel (`KERNELS`, with
  tiles where `split_tiles` takes them)."""
  try:
    unknown = sorted(name for name in names if split_tiles(name)[0] not in KERNELS)
  except ValueError as error:
    raise ValueError(f'config.{field}: {error}') from None
  if unknown:
    raise ValueError(f'config.{field}: unknown {unknown}; choose from {", ".join(KERNELS)}')


def kernel_names(config, platform: str) -> list:
  """config.kernels, checked (ValueError naming an unknown one), with vanilla first; GPU-only
  kernels dropped (and said) off NVIDIA GPUs."""
  names = list(config.kernels)
  check_kernel_names(names, 'kernels')
  for name in GPU_ONLY:
    if name in names and platform != 'gpu':
      print(f'{name}: skipped, it needs an NVIDIA GPU (this is {platform})')
      names.remove(name)
  return ['vanilla'] + [name for name in names if name != 'vanilla']


def plot_ratios(ratios, out) -> Path:
  """PNG of {(pass, kernel, k): {n: time / vanilla}}: a panel per pass, a line per (kernel, k)."""
  passes = sorted({mode for mode, _, _ in ratios})
  kernels = sorted({name for _, name, _ in ratios} - {'vanilla'})
  distances = sorted({k for _, _, k in ratios})
  lengths = sorted({n for by_n in ratios.values() for n in by_n})
  fig, axes = figures.subplots(1, len(passes), figsize=(6 * len(passes), 4.5), squeeze=False)
  for ax, mode in zip(axes[0], passes, strict=True):
    for (line_mode, name, k), by_n in sorted(ratios.items()):
      if line_mode == mode and name != 'vanilla':
        ns = sorted(by_n)
        ax.plot(
          ns,
          [by_n[n] for n in ns],
          marker='o',
          color=f'C{kernels.index(name)}',
          linestyle=('-', '--', ':', '-.')[distances.index(k) % 4],
          label=f'{name}, k={k}',
        )
    ax.axhline(1.0, color='gray', linewidth=0.8)
    ax.set(xlabel='n (keys = queries)', ylabel='time / vanilla', title=mode)
    ax.set_xscale('log', base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.minorticks_off()
    ax.legend(fontsize='small')
  return figures.save(fig, Path(out))


def _row(by_key, n, k):
  """{(kernel, pass): value} of one (n, k) row from {(n, k or None, kernel, pass): value}."""
  return {key[2:]: value for key, value in by_key.items() if key[0] == n and key[1] in (k, None)}


def define_config_flag():
  """The --config flag (defined only when run as a program, so tests can import this)."""
  return config_flags.DEFINE_config_file(
    'config',
    str(Path(__file__).resolve().parent.parent / 'configs' / 'attention_benchmark.py'),
    'Benchmark sizes.',
  )


def main(config):
  check_config(config)
  device = jax.devices()[0]
  names = kernel_names(config, device.platform)
  dtype = jnp.dtype(config.dtype)
  peak = peak_tflops(config, device.device_kind)
  print(
    f'device: {device.device_kind}  dtype={dtype.name}  heads={config.heads} '
    f'head_dim={config.head_dim}  causal  median of {config.rounds} interleaved rounds'
    + (f' of {config.repeats} calls' if config.repeats > 1 else '')
    + (f'  peak {peak:.0f} TFLOP/s' if peak else '')
  )
  # Kernels without a clipping distance are lowered (and compiled) once per n, under k = None,
  # and timed in every k's row: lower_row draws the same inputs for every k.
  per_k = [name for name in names if split_tiles(name)[0] in USES_K]
  rows, lowered, arguments = [], {}, {}
  for n in config.lengths:
    size = {'batch': max(1, config.tokens // n), 'heads': config.heads, 'head_dim': config.head_dim}
    groups = [(k, per_k) for k in config.distances]
    groups.append((None, [name for name in names if name not in per_k]))
    for k, group in groups:
      row_lowered, row_arguments = lower_row(group, n, k or 0, **size, dtype=dtype)
      lowered.update({(n, k, *key): stage for key, stage in row_lowered.items()})
      arguments.update({(n, k, *key): args for key, args in row_arguments.items()})
    rows += [(n, k, size) for k in config.distances]
  threads = config.compile_threads or os.cpu_count() or 1
  start = time.perf_counter()
  compiled, failed = compile_all(lowered, threads)
  print(
    f'compiled {len(compiled)} functions in {time.perf_counter() - start:.0f} s '
    f'({threads} at a time)'
  )
  for (n, k, name, mode), error in failed.items():
    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    where = f'n = {n}' if k is None else f'n = {n}, k = {k}'
    print(f'{name} {mode} at {where}: did not lower or compile, left out: {first_line[:300]}')
  header = (
    '| n | k | batch | pass | kernel | ms | time / vanilla | TFLOP/s | % of peak | temp MiB '
    '| temp / vanilla | error vs xla |'
  )
  print(header)
  print('|' + '---|' * header.count(' | ') + '---|')
  ratios = {}  # (pass, kernel, k) -> {n: time / vanilla}
  for n, k, size in rows:
    seconds, memory, errors = measure_row(
      _row(compiled, n, k), _row(arguments, n, k), rounds=config.rounds, repeats=config.repeats
    )
    for mode in ('fwd', 'fwd+bwd'):
      flops = vanilla_causal_flops(n, **size, mode=mode)
      for name in names:
        if (name, mode) not in seconds:  # did not compile
          continue
        s, m = seconds[name, mode], memory[name, mode]
        tflops = flops / s / 1e12
        ratio = s / seconds['vanilla', mode]
        ratios.setdefault((mode, name, k), {})[n] = ratio
        label = f'shaw ({xla_form(n)})' if name == 'shaw' else name
        error = errors.get((name, mode))
        print(
          f'| {n} | {k} | {size["batch"]} | {mode} | {label} '
          f'| {s * 1e3:.2f} | {ratio:.2f} | {tflops:.3g} '
          f'| {f"{100 * tflops / peak:.1f}" if peak else "—"} | {m / 2**20:.1f} '
          f'| {m / max(memory["vanilla", mode], 1):.2f} '
          f'| {"—" if error is None else f"{error:.1e}"} |',
          flush=True,
        )
  for n, k, _ in rows:
    row, row_arguments = _row(compiled, n, k), _row(arguments, n, k)
    for name in config.profile:
      if (name, 'fwd+bwd') not in row:  # did not compile
        continue
      fn, args = row[name, 'fwd+bwd'], row_arguments[name, 'fwd+bwd']
      print(f'\n### profile: {name} fwd+bwd at n = {n}, k = {k}\n')
      summary = step_profile.profile(functools.partial(fn, *args), fn.as_text(), steps=3)
      print(summary.table(), flush=True)
  if config.plot:
    print(f'plot: {plot_ratios(ratios, config.plot)}')


if __name__ == '__main__':
  runtime.apply_defaults()  # relpos's allocator (re-executes), as train.py
  config_flag = define_config_flag()
  from relpos.cli import run_main  # after apply_defaults: it imports jax, as train.py

  run_main(lambda argv: main(config_flag.value))
