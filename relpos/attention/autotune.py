"""`implementation='auto'` by measurement: Shaw's and XL's 'xla' kernels and their 'pallas'
kernels at a few tilings timed at the shapes a model calls them with, the fastest kept.

Why. The first 'auto' was a rule ('pallas' on a GPU from 512 keys up) taken from kernel timings
at other shapes. Inside enwik8_base on an H200 it made the XL step 2.0x and the Shaw step 1.14x
slower than XLA's kernels (issue 36). Which kernel wins depends on every dimension of the call
and on what surrounds it, so 'auto' now asks the device.

What is timed. `shaw_attention` and `xl_attention` resolve 'auto' while they are traced (inside
`jax.jit`, `jax.grad`, `lax.scan` over layers, `nnx.remat`, `shard_map`), where every shape is
static. They describe the call as a `Signature`: the kernel, batch, query and key lengths (memory
included), heads, head_dim, dtype, the mask's shape (or none), Shaw's k and which tables it has, the
dropout rate. On a miss the tuner builds inputs of those shapes and times a jitted forward AND
backward pass (gradients of every float input, as training uses the kernels) of each candidate
(`candidate_names`, below) through the public function itself (layout changes and padding of the
Pallas wrappers included). The timing runs in a fresh thread (`signals.call_in_thread`): JAX keeps
its trace state per thread, so there the candidates compile and run on the device as at top level
although the caller is being traced. (`jax.ensure_compile_time_eval()` does not do: it also
evaluates the interpreted Pallas kernel bodies eagerly, which fails on `program_id`.) JAX's
thread-local settings (e.g. a `jax.default_matmul_precision` block) do not reach that thread: the
candidates are timed at the global settings.
- Forward only, where nothing is differentiated. Inside a trace an eval call cannot be told from a
  training one (under a scanned stack the layer is traced before it is differentiated), so the
  code that builds an eval or decoding step says so: its traced body runs inside
  `forward_only()` (`char_lm_task`'s bits per char, `translation_task`'s eval loss and beam
  search, `tools/sample.py`, `benchmarks/xl_eval_speed.py`). Such a call's signature ends in
  'fwd' instead of 'fwd+bwd' and its candidates are timed as a jitted forward pass alone: a
  kernel whose backward is slow (XL's Pallas backward is 5x its forward on an H200) can win the
  forward it is asked for. The same shapes are then tuned once per pass, each kept under its
  own key.
- The mask's contents are traced, so they are not known: a mask with a query axis (shape
  [.., q_len, kv_len]) is timed as causal, one without (key padding, [.., 1, kv_len]) as all
  True. In relpos's models every mask with a query axis is causal (with padding), and the
  causal structure matters: the Pallas kernels skip tiles the mask rules out. XL is causal
  itself, and so is a Shaw call with `causal=True` (the character LM's: its mask is the
  memory's filled slots, [.., 1, kv_len]), which the signature records (`causal` in its text)
  and the candidates are called with. Shaw is timed at its default query offset (queries are
  the last q_len keys).
- The candidates, in this order: 'xla'; 'pallas', the Pallas kernel at its default tiles (Shaw
  64x64, XL 32x32, each axis capped at its length rounded up to a power of two >= 16:
  `pallas_common.Tiling.make`); then, only with RELPOS_AUTOTUNE_TILINGS=1 (`TILINGS_OPT_IN`),
  'pallas@QxK' for each of `TILINGS[kernel]` that is not the default's tiles and no larger than the
  padded lengths (a tile longer than its axis is only padding). Opt-in since an H200 run (2026-11-27
  evening, docs/gpu.md): in the 9 of its decisions that timed other tilings, at enwik8_base's and
  wmt_base's shapes and at n = 2048, none beat the default tiles (the closest was 0.2% slower; the
  over-sized ones failed over the shared memory), as none had in the H100's tile figures, while each
  one timed is another compile, about 3 to 6 s, at every new signature. The tilings, from the H100
  figures (docs/results/gpu_h100.md, "Tiles") and the Triton compiles (docs/gpu.md): Shaw 128x64 (8
  warps; at n = 2048 within 5% of 64x64 forward and 19% slower fwd+bwd, the closest measured) and
  32x32 (short sentences: wmt_base's padded lengths up to ~128 have one or two 64-tiles per axis and
  pad ragged lengths more); 64x128 was 1.7x slower and 128x128 is over an H100's shared memory. XL
  32x64 (within 6% of 32x32 at n = 512) and 64x32 (not measured, the other half-step; its float32
  kernels spill 0.3-1.7 KB); 16x16 was 1.5x slower and 64x64 is over the shared memory. Last, for XL
  in bf16/fp16 without attention dropout on a GPU, 'cudnn' (`xl.xl_attention_cudnn`: the position
  term as a bias of cuDNN's flash attention); on a GPU where the scheme's causal Mosaic GPU kernel
  serves the signature (`mosaic_dispatch.serves`: bf16/fp16, no dropout, a memory of whole 64-key
  tiles, head_dim 64 (Shaw also 128); Shaw causal or with a mask with a query axis, timed causal),
  'mosaic', for now only with RELPOS_AUTOTUNE_MOSAIC=1 (`MOSAIC_OPT_IN`: until its kernels have run
  on a GPU). At most 6 candidates. Every process builds the same list from the signature.
- Given tiles. A caller that passes `block_sizes` with 'auto' keeps its tiles: the signature
  records them (`tiles=QxK` in its text) and the candidates are 'xla' and 'pallas@QxK' at
  those tiles, so only the implementation is tuned.
- Per-device shapes. Under the data mesh's `jax.jit` (GSPMD) the trace sees the global batch,
  which each of the `jax.device_count()` devices holds a share of: the timed batch is
  batch / device_count where that divides. Inside `shard_map` the trace already sees a
  device's share and it is timed as it is.
- The candidates are compiled first, all at once in threads (`compile_concurrently`: XLA
  releases the GIL while it compiles), then timed one at a time. The default timer
  (`measure`) runs a candidate twice to warm up (and to compile one that was not), then times
  enough runs for about `TARGET_SECONDS` (at least `MIN_REPEATS`) and takes the median. A
  candidate that fails (e.g. a Triton kernel over its shared memory) counts as infinitely
  slow, with a warning. Where 'xla' or the first Pallas candidate (the default or given
  tiles, which are expected to run) failed, the decision is kept in memory only (a later run
  tries again); a failed extra tiling is written as failed (None), since an over-sized tile
  fails the same way every time. The fastest Pallas variant (the earlier listed on an exact
  tie) wins only if it is more than `TIE_MARGIN` faster than 'xla': a tie goes to 'xla', whose
  kernels XLA can fuse with their surroundings.

Where. Only on a GPU (`jax.default_backend() == 'gpu'`): on a CPU Pallas only interprets and on
a TPU these Triton kernels do not lower, so 'auto' is 'xla' there without timing. Tests force
tuning on a CPU with `tuning(timer=...)`, which installs a fresh tuner with an injected timer.

Caches. Decisions are kept per process in memory (one tuning per signature per process) and on disk
in a JSON file (`runtime.autotune_cache_path`: RELPOS_AUTOTUNE_CACHE, 'off' for none, else
relpos-autotune.json inside JAX's persistent compilation cache directory, else autotune.json in
`runtime.cache_root`: $XDG_CACHE_HOME/relpos or ~/.cache/relpos), keyed by device kind, jax version,
a hash of the attention kernels' source (`kernel_version`: an edited kernel is timed again),
XLA_FLAGS and the signature; an entry is {'choice': name, 'ms': {name: ms or None}}. Each new
decision is logged once (absl), naming the signature, the choice and every candidate's time. An
entry whose choice is not one of the signature's candidates (a tiling since dropped, a name from
another version) is ignored with a warning and timed again; 'pallas' always names the default tiles,
as it did before tilings were tuned. A corrupt or unreadable file, or a malformed entry in it (an
'ms' that is no number), is ignored with one `warning:` line naming the file (once a process) and
timed again, and the file rewritten without it; a cache that cannot be written (a directory in the
way) is one warning and leaves no temporary file. Writes go through a temporary file and a rename,
so a reader never sees half a file.

Several processes. Every process must compile the same program. In a multi-process run only
process 0 reads the disk cache and times; its choice is broadcast
(`multihost_utils.broadcast_one_to_all`, as an index into the signature's candidate list,
which every process builds alike) and used by all. Every process traces the same calls
in the same order, so each calls the broadcast the same number of times (once per new
signature; memory hits need none).

Cost. The first trace of a new signature pays one compile of a fwd+bwd kernel pass and about
`TARGET_SECONDS` of runs per candidate: 'xla' and 'pallas', XL's 'cudnn' in bf16, so two
or three compiles, made at the same time (at enwik8_base's shapes on an H200, 20 to 25 s with
the two extra tilings then timed too, one compile after another); with
RELPOS_AUTOTUNE_TILINGS=1 and 'mosaic', at most 6 candidates.
enwik8_base has one signature; wmt_base two per padded length (encoder and decoder). Later
traces, processes and runs on the same device read the decision from memory or disk.

`python -m relpos.tools.pretune --config=configs/enwik8_base.py` tunes a config's call sites
ahead of a run and prints the decisions (`relpos.tools.pretune`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from relpos import runtime, signals
from relpos.attention import implementations, mosaic_dispatch
from relpos.attention.implementations import parse_choice, tiles_name
from relpos.attention.masking import causal_mask, table_max_distance
from relpos.attention.pallas_common import DEFAULT_BLOCK, Tiling, triton_size
from relpos.attention.pallas_xl import DEFAULT_XL_BLOCK
from relpos.messages import warn

# (block_q, block_k) timed besides each kernel's default tiles with RELPOS_AUTOTUNE_TILINGS=1
# (module docstring, The candidates): then at most 3 Pallas candidates per signature.
TILINGS = {'shaw': ((128, 64), (32, 32)), 'xl': ((32, 64), (64, 32))}
TILINGS_OPT_IN = 'RELPOS_AUTOTUNE_TILINGS'  # '1': TILINGS are candidates too (module docstring)
DEFAULT_BLOCKS = {'shaw': DEFAULT_BLOCK, 'xl': DEFAULT_XL_BLOCK}
TIE_MARGIN = 0.02  # a 'pallas' variant must be this much faster than 'xla' to be chosen
TARGET_SECONDS = 0.25  # timed runs per candidate add up to about this
MIN_REPEATS, MAX_REPEATS = 5, 100

Timer = Callable[[str, Callable[[], Any]], float]  # (candidate name, run) -> seconds per run


@dataclasses.dataclass(frozen=True)
class Signature:
  """What a Shaw or XL call's speed depends on, all static under tracing.

  `batch` is the timed (per-device) batch; `mask` the mask's shape as 4 axes [B|1, H|1, Q|1, K]
  or None; `max_distance` and `tables` ('kv', 'k' or 'v') are Shaw's k and which of w^K, w^V
  it has (None and '' for XL); `tiles` the caller's block_sizes (None: tilings are tuned);
  `causal` whether a Shaw call was asked to be causal (`shaw_attention(causal=True)`; False
  for XL, which always is); `xla_form` the form Shaw's 'xla' takes at the call ('dense' or
  'banded': `shaw.xla_form`, by its `dense_max_kv_len`; '' for XL).
  """

  kernel: str
  batch: int
  q_len: int
  kv_len: int
  heads: int
  head_dim: int
  dtype: str
  mask: tuple[int, ...] | None
  max_distance: int | None
  tables: str
  dropout: float
  tiles: tuple[int, int] | None = None
  causal: bool = False
  xla_form: str = ''
  backward: bool = True  # timed as training uses it; False inside `forward_only()`

  def text(self) -> str:
    """One line, the cache key's and the log's: e.g. `shaw B=22 Q=512 K=1024 H=8 D=64
    bfloat16 mask=1x1x512x1024 k=16 kv xla=banded dropout=0.1 fwd+bwd` ('fwd' for a
    forward-only call)."""
    mask = 'none' if self.mask is None else 'x'.join(map(str, self.mask))
    words = [
      self.kernel,
      f'B={self.batch} Q={self.q_len} K={self.kv_len} H={self.heads} D={self.head_dim}',
      self.dtype,
      f'mask={mask}',
    ]
    if self.kernel == 'shaw':
      words.append(f'k={self.max_distance} {self.tables}')
      if self.causal:
        words.append('causal')
      words.append(f'xla={self.xla_form}')
    words.append(f'dropout={self.dropout:g}')
    if self.tiles is not None:
      words.append('tiles={}x{}'.format(*self.tiles))
    words.append('fwd+bwd' if self.backward else 'fwd')
    return ' '.join(words)


def timed_batch(batch: int) -> int:
  """The batch one device runs (module docstring, Per-device shapes)."""
  if jax.sharding.get_abstract_mesh().manual_axes:  # inside shard_map: already a device's
    return batch
  devices = jax.device_count()
  return batch // devices if devices > 1 and batch % devices == 0 else batch


def _mask_shape(mask, batch: int, timed: int) -> tuple[int, ...] | None:
  """The mask's shape as 4 axes, its batch axis (if whole) at the timed batch."""
  if mask is None:
    return None
  shape = (1,) * (4 - len(mask.shape)) + tuple(mask.shape)
  return (timed if shape[0] == batch else shape[0],) + shape[1:]


def _signature(
  kernel: str, query, key, mask, dropout_rate: float, block_sizes, **position
) -> Signature:
  """The `Signature` of a call of `kernel` over these arrays with the caller's `block_sizes`
  (or None); `position` holds the scheme's own fields (Shaw's max_distance and tables)."""
  batch, q_len, heads, head_dim = query.shape
  timed = timed_batch(batch)
  return Signature(
    kernel=kernel,
    batch=timed,
    q_len=q_len,
    kv_len=key.shape[1],
    heads=heads,
    head_dim=head_dim,
    dtype=jnp.dtype(query.dtype).name,
    mask=_mask_shape(mask, batch, timed),
    dropout=float(dropout_rate),
    tiles=None if block_sizes is None else tuple(int(b) for b in block_sizes),
    backward=not _FORWARD_ONLY,
    **position,
  )


_FORWARD_ONLY: list[None] = []  # one entry per `forward_only()` block open


@contextlib.contextmanager
def forward_only() -> Iterator[None]:
  """Within the block, 'auto' calls traced are tuned as a forward pass alone (module
  docstring, Forward only). Enter it inside the function a jit traces (its body runs at trace
  time), around code that is never differentiated: an eval or decoding step."""
  _FORWARD_ONLY.append(None)
  try:
    yield
  finally:
    _FORWARD_ONLY.pop()


def shaw_signature(
  query,
  key,
  rel_key,
  rel_value,
  mask,
  dropout_rate: float,
  block_sizes=None,
  *,
  causal=False,
  xla_form: str,
) -> Signature:
  """The `Signature` of a `shaw_attention` call (arguments already checked) whose 'xla' takes
  `xla_form` ('dense' or 'banded')."""
  return _signature(
    'shaw',
    query,
    key,
    mask,
    dropout_rate,
    block_sizes,
    max_distance=table_max_distance(rel_key, rel_value),
    tables=('k' if rel_key is not None else '') + ('v' if rel_value is not None else ''),
    causal=bool(causal),
    xla_form=xla_form,
  )


def xl_signature(query, key, mask, dropout_rate: float, block_sizes=None) -> Signature:
  """The `Signature` of an `xl_attention` call (arguments already checked)."""
  return _signature('xl', query, key, mask, dropout_rate, block_sizes, max_distance=None, tables='')


def candidate_names(signature: Signature) -> tuple[str, ...]:
  """What is timed at `signature` (module docstring, The candidates): 'xla', 'pallas' (default
  tiles) and, with RELPOS_AUTOTUNE_TILINGS=1, 'pallas@QxK' for each of `TILINGS` that differs
  from the default tiles and fits the padded lengths; with given tiles, 'xla' and 'pallas@QxK'
  at them; then 'cudnn' and 'mosaic' where they serve. A pure function of the signature
  and the environment (the same in every process of a run), so every process lists the same
  names in the same order."""
  s = signature
  fused = ['cudnn'] if cudnn_serves(s) else []  # the other kernels: cuDNN's, Mosaic GPU's
  fused += ['mosaic'] if mosaic_serves(s) else []
  if s.tiles is not None:
    return ('xla', tiles_name(s.tiles), *fused)
  default = Tiling.make(s.q_len, s.kv_len, None, DEFAULT_BLOCKS[s.kernel])
  names = ['xla', 'pallas']
  for block_q, block_k in TILINGS[s.kernel] if os.environ.get(TILINGS_OPT_IN) == '1' else ():
    fits = block_q <= triton_size(s.q_len) and block_k <= triton_size(s.kv_len)
    if fits and (block_q, block_k) != (default.block_q, default.block_k):
      names.append(tiles_name((block_q, block_k)))
  return (*names, *fused)


def cudnn_serves(signature: Signature) -> bool:
  """Whether 'cudnn' is a candidate at `signature`: XL, bf16/fp16, no attention dropout, on a
  GPU (`relpos.attention.xl.xl_attention_cudnn`; on a GPU without cuDNN it fails, is timed as
  failed and never chosen)."""
  s = signature
  gpu = jax.default_backend() == 'gpu'
  return gpu and implementations.serves('cudnn', s.kernel, s.dtype, s.dropout)


# 'mosaic' is an 'auto' candidate only where this is '1': its kernels have not run on a GPU yet,
# and one that hangs (a barrier never released) or corrupts the device would take the whole
# step with it, which a failed compile (timed as failed) does not.
MOSAIC_OPT_IN = 'RELPOS_AUTOTUNE_MOSAIC'


def mosaic_serves(signature: Signature) -> bool:
  """Whether 'mosaic' is a candidate at `signature`: with RELPOS_AUTOTUNE_MOSAIC=1
  (`MOSAIC_OPT_IN`), on a GPU where the kernel's Mosaic GPU kernel serves the call
  (`mosaic_dispatch.serves`; Shaw at its default query offset, as timed, and the timed mask
  causal). On a GPU without Hopper's wgmma it fails, is timed as failed and never chosen."""
  s = signature
  if jax.default_backend() != 'gpu' or os.environ.get(MOSAIC_OPT_IN) != '1':
    return False
  shapes = (s.q_len, s.kv_len, s.dtype, s.head_dim, s.mask, s.dropout)
  return mosaic_dispatch.serves(s.kernel, *shapes, causal=s.causal)


# ------------------------------------------------------------------------------------------
# What is timed: a jitted forward and backward pass (or forward pass) of each candidate on dummy
# inputs.


def dummy_mask(signature: Signature) -> np.ndarray | None:
  """The mask timed for `signature.mask` (module docstring): causal where it has a query axis
  (query i at key position kv_len - q_len + i: `masking.causal_mask`), all True otherwise
  (a keys-only mask's single query row, at the last position, sees every key)."""
  if signature.mask is None:
    return None
  q_len, kv_len = signature.mask[2:]
  return np.broadcast_to(np.asarray(causal_mask(q_len, kv_len)), signature.mask)


def _random(rng, shape, dtype):
  return jnp.asarray(rng.standard_normal(shape, np.float32) * 0.5, dtype)


def _dummy_inputs(signature: Signature):
  """(float inputs, which get gradients; the mask; the dropout rng) for `signature`."""
  s = signature
  rng = np.random.default_rng(0)
  q_shape = (s.batch, s.q_len, s.heads, s.head_dim)
  kv_shape = (s.batch, s.kv_len, s.heads, s.head_dim)
  floats = [_random(rng, shape, s.dtype) for shape in (q_shape, kv_shape, kv_shape)]
  if s.kernel == 'shaw':
    table = (2 * s.max_distance + 1, s.head_dim)
    floats += [_random(rng, table, s.dtype) if name in s.tables else None for name in 'kv']
  else:
    floats += [_random(rng, (s.kv_len, s.heads, s.head_dim), s.dtype)]
    floats += [_random(rng, (s.heads, s.head_dim), s.dtype) for _ in range(2)]
  mask = dummy_mask(s)
  dropout_rng = jax.random.key(0) if s.dropout > 0.0 else None
  cotangent = _random(rng, q_shape, jnp.float32)
  return tuple(floats), None if mask is None else jnp.asarray(mask), dropout_rng, cotangent


def timed_candidates(attention: Callable, signature: Signature) -> dict[str, Candidate]:
  """name -> a `Candidate`: a zero-argument call running one jitted forward and backward pass
  (the forward pass alone where `signature.backward` is False) of `attention(*floats, mask=,
  dropout_rate=, dropout_rng=, implementation=, block_sizes=)` on inputs of `signature`'s
  shapes (built on first use, shared by the candidates), for each of
  `candidate_names(signature)` ('pallas@QxK': implementation 'pallas', block_sizes (Q, K))."""
  made = functools.cache(lambda: _dummy_inputs(signature))
  lock = threading.Lock()  # the candidates compile in threads (`compile_concurrently`)

  def inputs():
    with lock:
      return made()

  causal = {'causal': True} if signature.causal else {}

  def candidate(name):
    implementation, block_sizes = parse_choice(name)

    def forward(floats, mask, dropout_rng):
      return attention(
        *floats,
        mask=mask,
        **causal,
        dropout_rate=signature.dropout,
        dropout_rng=dropout_rng,
        implementation=implementation,
        block_sizes=block_sizes,
      )

    def loss(floats, mask, dropout_rng, cotangent):
      output = forward(floats, mask, dropout_rng)
      return jnp.sum(output.astype(jnp.float32) * cotangent)

    if not signature.backward:
      return Candidate(jax.jit(forward), lambda: inputs()[:3])
    return Candidate(jax.jit(jax.grad(loss)), inputs)

  return {name: candidate(name) for name in candidate_names(signature)}


class Candidate:
  """One candidate's jitted pass (fwd+bwd, or fwd) on the signature's dummy inputs: a call
  runs it; `compile()` compiles it ahead of the first call, so that the tuner can compile all
  of a signature's candidates at once (`compile_concurrently`)."""

  def __init__(self, step, inputs: Callable[[], tuple]):
    self._step, self._inputs, self._compiled = step, inputs, None

  def compile(self) -> None:
    self._compiled = self._step.lower(*self._inputs()).compile()

  def __call__(self):
    return (self._compiled or self._step)(*self._inputs())


def compile_concurrently(candidates: Mapping[str, Any]) -> dict[str, Exception]:
  """Compiles the candidates that can be compiled ahead (those with a `compile()` method, as
  `Candidate`) all at once, one thread each: XLA releases the GIL while it compiles, so a
  signature's two or three compiles overlap instead of following one another (on an H200 a
  candidate's compile at enwik8_base's shapes took 3 to 6 s, its timed runs well under one).
  Only compiles: nothing runs on the device here, so no candidate's memory competes with
  another's. Returns {name: exception} of those that failed to compile; a candidate that
  fails when it runs (a Triton kernel over its shared memory) fails in the timer instead."""
  ahead = {name: run for name, run in candidates.items() if callable(getattr(run, 'compile', None))}
  if not ahead:
    return {}

  def attempt(run):
    try:
      run.compile()
    except Exception as error:  # noqa: BLE001 - reported as that candidate's failure
      return error
    return None

  threads = len(ahead)
  with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix='relpos-compile') as pool:
    errors = dict(zip(ahead, pool.map(attempt, ahead.values()), strict=True))
  return {name: error for name, error in errors.items() if error is not None}


def measure(name: str, run: Callable[[], Any]) -> float:
  """Median seconds of one `run()` (the default timer; module docstring). `name` is unused."""
  del name
  for _ in range(2):  # compile, then warm up
    jax.block_until_ready(run())
  start = time.perf_counter()
  jax.block_until_ready(run())
  first = time.perf_counter() - start
  repeats = min(MAX_REPEATS, max(MIN_REPEATS, int(TARGET_SECONDS / max(first, 1e-6))))
  seconds = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(run())
    seconds.append(time.perf_counter() - start)
  return statistics.median(seconds)


def pick(seconds: Mapping[str, float]) -> str:
  """The fastest other candidate (name -> seconds: 'pallas', 'pallas@QxK', 'cudnn'; the
  earlier listed on an exact tie) if it is more than TIE_MARGIN faster than 'xla', else
  'xla'."""
  variants = [name for name in seconds if name != 'xla']
  fastest = min(variants, key=seconds.__getitem__)
  return fastest if seconds[fastest] < seconds['xla'] * (1.0 - TIE_MARGIN) else 'xla'


# ------------------------------------------------------------------------------------------
# The caches and the tuner.


@functools.cache
def kernel_version() -> str:
  """12 hex digits of a hash of relpos/attention/*.py: a kernel edit invalidates the cache."""
  digest = hashlib.sha256()
  for path in sorted(Path(__file__).parent.glob('*.py')):
    digest.update(path.name.encode() + path.read_bytes())
  return digest.hexdigest()[:12]


def cache_key(signature: Signature) -> str:
  """The disk cache's key: device kind, jax version, kernel version, XLA's flags (XLA_FLAGS,
  as this process started with them: relpos.runtime's GPU flags change the steps XLA
  compiles, and so which candidate wins) and signature."""
  device = jax.devices()[0].device_kind
  flags = ' '.join(os.environ.get('XLA_FLAGS', '').split()) or 'none'
  return (
    f'{device} | jax {jax.__version__} | kernels {kernel_version()} | XLA_FLAGS {flags} | '
    f'{signature.text()}'
  )


# What becomes of a cache (or its entries) that `read_cache` ignores.
_RETIMED = 'their attention calls are timed again and the file is rewritten'


def _is_entry(entry) -> bool:
  """Whether `entry` is a cache entry: {'choice': name, 'ms': {name: ms or None}}."""
  if not isinstance(entry, dict) or not isinstance(entry.get('choice'), str):
    return False
  times = entry.get('ms')
  return isinstance(times, dict) and all(
    ms is None or (isinstance(ms, int | float) and not isinstance(ms, bool))
    for ms in times.values()
  )


def read_cache(path: Path | None) -> dict:
  """The entries of the cache file (key -> {'choice': name, 'ms'}); {} when there is none or it
  is unreadable or corrupt, and without each malformed entry (an 'ms' that is no number, say:
  its signature is timed again). Either is one `warning:` line naming the file, said once a
  process (`relpos.messages.warn`; a run reads the cache at each new signature), and the next
  decision rewrites the file without them. Whether a choice is one of its signature's
  candidates is `Tuner.choose`'s check."""
  if path is None or not path.exists():
    return {}
  try:
    entries = json.loads(path.read_text())
  except (OSError, ValueError) as error:  # json.JSONDecodeError is a ValueError
    warn(
      f'ignoring the autotune cache {path}, which cannot be read ({error}): {_RETIMED}', once=True
    )
    return {}
  if not isinstance(entries, dict):
    warn(f'ignoring the autotune cache {path}, which is not a JSON object: {_RETIMED}', once=True)
    return {}
  kept = {key: entry for key, entry in entries.items() if _is_entry(entry)}
  if len(kept) < len(entries):
    malformed = len(entries) - len(kept)
    warn(
      f'ignoring {malformed} of the {len(entries)} entries of the autotune cache {path}, not '
      f'of the form {{"choice": name, "ms": {{name: milliseconds or null}}}}: {_RETIMED}',
      once=True,
    )
  return kept


def write_cache(path: Path | None, key: str, entry: dict) -> None:
  """Adds `entry` under `key` to the cache file (read again first, so entries other
  processes wrote meanwhile stay); a failure to write is a `warning:` line (once a process)
  and leaves no temporary file behind."""
  if path is None:
    return
  temporary = path.with_name(f'{path.name}.{os.getpid()}.tmp')
  try:
    entries = read_cache(path)
    entries[key] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary.write_text(json.dumps(entries, indent=1, sort_keys=True))
    os.replace(temporary, path)
  except OSError as error:
    with contextlib.suppress(OSError):
      temporary.unlink(missing_ok=True)
    warn(
      f'cannot write the autotune cache {path} ({error}): its choices are timed again in the '
      'next run; set RELPOS_AUTOTUNE_CACHE to a file path that can be written, or to off',
      once=True,
    )


def agree_across_processes(choice: str, names: tuple[str, ...]) -> str:
  """Process 0's choice, on every process (module docstring, Several processes): broadcast as
  its index in `names`, the signature's candidates, which every process lists alike."""
  if jax.process_count() == 1:
    return choice
  from jax.experimental import multihost_utils

  index = multihost_utils.broadcast_one_to_all(np.int32(names.index(choice)))
  return names[int(index)]


@dataclasses.dataclass
class Decision:
  """One signature's choice ('xla', 'pallas' or 'pallas@QxK'), its times in ms (name -> ms,
  None for a candidate that failed; empty where process 0 timed), and where it came from:
  'timed', 'disk' or 'process 0'."""

  signature: Signature
  choice: str
  ms: dict
  source: str


class Tuner:
  """Decides among a `Signature`'s candidates ('xla', 'pallas', 'pallas@QxK'), caching in
  memory and in the file `path`; with `compile_ahead`, compiles a signature's candidates at
  once before timing them (`compile_concurrently`)."""

  def __init__(
    self,
    path: Path | None,
    *,
    timer: Timer = measure,
    force: bool = False,
    agree: Callable[[str, tuple[str, ...]], str] = agree_across_processes,
    compile_ahead: bool = True,
  ):
    self.path, self.timer, self.force, self.agree = path, timer, force, agree
    self.compile_ahead = compile_ahead
    self.memory: dict[Signature, str] = {}
    self.decisions: list[Decision] = []  # every decision taken or read, in order

  def enabled(self) -> bool:
    """Whether 'auto' is tuned here (GPU, or forced), rather than 'xla' outright."""
    return self.force or jax.default_backend() == 'gpu'

  def choose(self, signature: Signature, candidates: Mapping[str, Callable[[], Any]]) -> str:
    """The fastest of `candidates` (name -> zero-argument call; 'xla' first, then the default
    or given tiles' Pallas name) at `signature`, by `pick`'s rule: from memory, the disk
    cache, or timed now (then logged and written)."""
    if signature in self.memory:
      return self.memory[signature]
    names = tuple(candidates)
    key = cache_key(signature)
    leader = jax.process_index() == 0
    entry = read_cache(self.path).get(key) if leader else None
    if entry is not None and entry['choice'] not in names:
      warn(
        f'ignoring the choice {entry["choice"]!r} the autotune cache {self.path} holds for '
        f'{signature.text()} (not one of {", ".join(names)}): it is timed again',
        once=True,
      )
      entry = None
    source = 'disk' if entry else 'timed'
    if entry is None and leader:
      entry = signals.call_in_thread(self._time, signature, candidates)
    elif entry is not None:
      logging.info(
        'relpos autotune: %s -> %s (cached: %s)', signature.text(), entry['choice'], entry['ms']
      )
    # A collective: run outside the caller's trace too.
    choice = signals.call_in_thread(self.agree, entry['choice'] if entry else 'xla', names)
    if entry is None:  # another process timed
      entry, source = {'choice': choice, 'ms': {}}, 'process 0'
    # 'xla' and the default (or given) tiles are expected to run: their failure may pass, so a
    # later run tries again; an extra tiling's failure (over shared memory) is kept.
    if source == 'timed' and all(entry['ms'].get(name) is not None for name in names[:2]):
      write_cache(self.path, key, entry)
    self.memory[signature] = choice
    self.decisions.append(Decision(signature, choice, entry['ms'], source))
    return choice

  def _time(self, signature: Signature, candidates) -> dict:
    """{'choice', 'ms': name -> ms or None if it failed}, logged in one line. The candidates
    are compiled first, all at once (`compile_concurrently`, with `compile_ahead`), then
    timed one by one."""
    seconds, failed = {}, compile_concurrently(candidates) if self.compile_ahead else {}
    for name, run in candidates.items():
      try:
        if name in failed:
          raise failed[name]
        seconds[name] = float(self.timer(name, run))
      except Exception as error:  # noqa: BLE001 - a kernel that fails is never chosen
        logging.warning('relpos autotune: %s failed at %s: %r', name, signature.text(), error)
        seconds[name] = math.inf
    choice = pick(seconds)
    ms = {name: (s * 1e3 if math.isfinite(s) else None) for name, s in seconds.items()}
    times = ', '.join(
      f'{name} {"failed" if ms[name] is None else f"{ms[name]:.3f} ms"}' for name in ms
    )
    logging.info('relpos autotune: %s -> %s (%s)', signature.text(), choice, times)
    return {'choice': choice, 'ms': ms}


def default_cache_path() -> Path | None:
  """`runtime.autotune_cache_path` for this process's environment and JAX's cache directory."""
  return runtime.autotune_cache_path(os.environ, jax.config.jax_compilation_cache_dir)


_TUNER: Tuner | None = None


def tuner() -> Tuner:
  """The process's tuner (created on first use)."""
  global _TUNER
  if _TUNER is None:
    _TUNER = Tuner(default_cache_path())
  return _TUNER


@contextlib.contextmanager
def tuning(
  *,
  timer: Timer = measure,
  cache_path: Path | None = None,
  force: bool = True,
  agree: Callable[[str, tuple[str, ...]], str] = agree_across_processes,
  compile_ahead: bool = False,
) -> Iterator[Tuner]:
  """A fresh tuner for the block (empty memory; `cache_path`, None for no file), tuning on any
  backend when `force`: how tests run the mechanism on a CPU with an injected `timer` (which
  need not run a candidate, so nothing is compiled ahead unless `compile_ahead`)."""
  global _TUNER
  saved, _TUNER = (
    _TUNER,
    Tuner(cache_path, timer=timer, force=force, agree=agree, compile_ahead=compile_ahead),
  )
  try:
    yield _TUNER
  finally:
    _TUNER = saved


def choose(
  signature_fn: Callable[[], Signature], candidates_fn: Callable[[Signature], Mapping]
) -> str:
  """'auto' resolved: 'xla' where tuning is off (not a GPU), else the current tuner's choice
  at `signature_fn()` ('xla', 'pallas' or 'pallas@QxK': `implementations.resolve_implementation`
  turns it into an implementation and tiles), with `candidates_fn(signature)` built only when
  needed."""
  current = tuner()
  if not current.enabled():
    choice = 'xla'
  else:
    signature = signature_fn()
    choice = current.memory.get(signature) or current.choose(signature, candidates_fn(signature))
  for choices in _RECORDERS:
    choices.append(choice)
  return choice


_RECORDERS: list[list[str]] = []


@contextlib.contextmanager
def recorded_choices() -> Iterator[list[str]]:
  """A list of what every 'auto' traced inside the block resolved to ('xla', 'pallas',
  'pallas@QxK', 'cudnn' or 'mosaic': one entry per call traced, from memory, disk or timed
  now, and 'xla' where tuning is off). `resolve_implementation` turns a choice into the same
  implementation and tiles as naming it would, so a step whose every call chose one name is the
  program that naming it builds: the step benchmarks use this not to build that twice."""
  choices: list[str] = []
  _RECORDERS.append(choices)
  try:
    yield choices
  finally:
    _RECORDERS.remove(choices)


# ------------------------------------------------------------------------------------------
# Checking 'auto' in the step benchmarks (pre-tuning a config: relpos.tools.pretune).

GUARANTEE = 0.03  # issue 36: 'auto' within 3% of the faster kernel


def auto_line(name: str, auto_seconds: float, kernel_seconds: Mapping[str, float]) -> str:
  """One line comparing a step with 'auto' against the same step with each kernel named:
  e.g. `auto check xl: auto 60.1 ms, xla 59.7 ms, pallas 119.4 ms; auto / faster 1.007
  (within 3%: yes)`. For the step benchmarks."""
  faster = min(kernel_seconds.values())
  ratio = auto_seconds / faster
  kernels = ', '.join(f'{k} {s * 1e3:.1f} ms' for k, s in kernel_seconds.items())
  verdict = 'yes' if ratio <= 1.0 + GUARANTEE else 'NO'
  return (
    f'auto check {name}: auto {auto_seconds * 1e3:.1f} ms, {kernels}; auto / faster '
    f'{ratio:.3f} (within {GUARANTEE:.0%}: {verdict})'
  )
