"""What the fused attention kernels should reach on a GPU, from their own code: a cost model
read off each kernel's Triton IR, beside JAX's Pallas flash attention read the same way.

    python benchmarks/kernel_cost.py                       # n = 2048, head_dim 64, k = 16, 64
    python benchmarks/kernel_cost.py --length=512 --distances=16

For each scheme (flash: `jax.experimental.pallas.ops.gpu.attention.mha`, no relative terms;
relpos's Shaw at each k; relpos's XL), lowers the forward pass and the gradient of causal
self-attention for 'cuda' (`jax.export`, as benchmarks/triton_compile.py does, no GPU needed)
and reads every `pallas_call`'s Triton IR:

- per loop trip (one query tile against one key tile, or for XL's dR kernel one tile of
  distances): the FLOPs of its `tt.dot`s (2·m·k·n each: the tensor-core work), and the bytes
  its `tt.load`s and `tt.store`s move (tiles of keys, values, R's window, the mask, Shaw's
  per-row tables);
- per program, outside the loop: the same (the query tile, the output, the logsumexp);
- the grid (`grid_x/y/z` of the call).

The loop's trip count is not in the IR (the kernels read their tile ranges at run time): the
model counts the tile pairs a causal mask leaves (`causal_tile_pairs`, for each kernel's own
tiles: a tile pair is visited when some query in it may see some key), which is what relpos's
and JAX's kernels skip to. FLOPs are exact for that count; bytes are what the loads and stores
name, an upper bound on DRAM traffic (a tile read by several programs may hit in L2).

Two floors per kernel, at a GPU's data-sheet figures (`GPUS`): its tensor FLOPs at the dense
bf16 peak (no kernel does better; flash kernels reach 35-75% of it), and its bytes at the HBM
bandwidth were every load a miss in L2 (a ceiling on the traffic, not a floor: flash kernels
reread each key tile from L2). The ratio of a scheme's FLOPs to flash's is what its design
allows against flash, whatever the implementation quality: a kernel that does 2.5x flash's
tensor work runs within 2x of cuDNN only by using the tensor cores better than cuDNN does.
What the GPU measured goes beside these in docs/kernels.md.
"""

import dataclasses
import math
import re
import sys

import jax
import jax.numpy as jnp
from absl import flags

from relpos import flag_types, runtime
from relpos import flops as flops_lib
from relpos.attention import shaw_attention, xl_attention
from relpos.attention.pallas_common import DEFAULT_BLOCK
from relpos.attention.pallas_xl import DEFAULT_XL_BLOCK

# (dense bf16 TFLOP/s from relpos.flops.PEAKS, memory bandwidth in TB/s from the NVIDIA H100 SXM
# (3.35 TB/s HBM3) and H200 (4.8 TB/s HBM3e) data sheets), by the device kind JAX reports.
GPUS = {
  name: (flops_lib.device_peak(kind, 'bfloat16').tflops, tb_per_s)
  for name, kind, tb_per_s in (
    ('H100 SXM', 'NVIDIA H100 80GB HBM3', 3.35),
    ('H200', 'NVIDIA H200', 4.8),
  )
}

# JAX's flash attention tiles, as its mha defaults: the forward kernel, the backward kernel (its
# dk/dv loop and its dq loop take the same 32 x 32 tiles).
FLASH_BLOCKS = {'forward': (128, 128), 'backward': (32, 32)}

_DOT = re.compile(r'tt\.dot .*: tensor<(\d+)x(\d+)x\w+> \* tensor<(\d+)x(\d+)x\w+> -> ')
_MEMORY = re.compile(r'tt\.(load|store) .*: tensor<([\dx]+)x!tt\.ptr<(\w+)>>')
_BYTES = {'bf16': 2, 'f16': 2, 'f32': 4, 'i8': 1, 'i1': 1, 'i32': 4, 'f64': 8, 'i64': 8}


@dataclasses.dataclass(frozen=True)
class Work:
  """FLOPs of tensor-core matmuls and bytes loaded/stored."""

  flops: float = 0.0
  bytes: float = 0.0

  def __add__(self, other):
    return Work(self.flops + other.flops, self.bytes + other.bytes)

  def scaled(self, factor):
    return Work(self.flops * factor, self.bytes * factor)


@dataclasses.dataclass(frozen=True)
class KernelWork:
  """A kernel's work per program outside its loops, per loop trip, and per loop trip inside a
  branch (`scf.if`: Shaw's band tiles, the only branches in these kernels)."""

  program: Work
  trip: Work
  branch: Work


def read_ir(text: str) -> KernelWork:
  """The KernelWork of one kernel's Triton IR (MLIR text); a loop nested in a loop counts as a
  trip of the outer one."""
  program, trip, branch = Work(), Work(), Work()
  regions = []  # 'loop', 'branch' or '' per open region
  for line in text.splitlines():
    stripped = line.strip()
    if stripped.startswith('}') and regions:
      regions.pop()
      if stripped.startswith('} else {'):
        regions.append('branch')
        continue
    work = Work()
    if match := _DOT.search(line):
      m, k, k2, n = (int(x) for x in match.groups())
      assert k == k2, line
      work = Work(flops=2.0 * m * k * n)
    elif match := _MEMORY.search(line):
      _, dims, dtype = match.groups()
      work = Work(bytes=float(math.prod(map(int, dims.split('x'))) * _BYTES.get(dtype, 4)))
    if 'loop' not in regions:
      program += work
    elif 'branch' in regions[regions.index('loop') :]:
      branch += work
    else:
      trip += work
    if stripped.endswith('{'):
      if 'scf.for' in stripped or 'scf.while' in stripped:
        regions.append('loop')
      else:
        regions.append('branch' if 'scf.if' in stripped else '')
  return KernelWork(program, trip, branch)


def _visible(q_len, kv_len, block_q, block_k, query_tile, key_tile) -> bool:
  """Whether some query of the query tile may see some key of the key tile under a causal mask
  (query i sees keys j <= kv_len - q_len + i)."""
  first_key = key_tile * block_k
  last_query = min((query_tile + 1) * block_q, q_len) - 1
  return first_key <= kv_len - q_len + last_query and first_key < kv_len


def causal_tile_pairs(q_len: int, kv_len: int, block_q: int, block_k: int, band: int = 0) -> int:
  """The (query tile, key tile) pairs of a causal mask where some query may see some key; with
  `band` > 0, only those where some such pair is at |j - pos_i| < band (Shaw's band tiles)."""
  count = 0
  for qt in range(-(-q_len // block_q)):
    for kt in range(-(-kv_len // block_k)):
      if not _visible(q_len, kv_len, block_q, block_k, qt, kt):
        continue
      # A visible tile's closest pair is its first position against its last key (or 0 apart
      # where the key range reaches the positions).
      first_position = qt * block_q + kv_len - q_len
      last_key = min((kt + 1) * block_k, kv_len) - 1
      if band and first_position - last_key >= band:
        continue
      count += 1
  return count


@dataclasses.dataclass(frozen=True)
class KernelCost:
  """One pallas_call of a pass: its name, tiles, grid, visited tile pairs (0: it has no loop)
  and total work."""

  name: str
  blocks: tuple[int, int]
  grid: tuple[int, ...]
  tile_pairs: int
  work: Work


def triton_calls(fn, avals):
  """[(name, grid, Triton IR text)] of every pallas_call of `fn` lowered for 'cuda'."""
  from triton_compile import triton_kernels

  return triton_kernels(fn, avals, with_grid=True)


def kernel_costs(fn, avals, *, batch_heads: int, q_len: int, kv_len: int, blocks, band=0):
  """A KernelCost per pallas_call of `fn` (its forward pass and gradient, causal); `blocks`:
  a function of the call's name giving its (block_q, block_k); the grid's programs each do the
  program work once, and each batch and head visits the causal tile pairs of the call's tiles,
  doing the trip work on each and the branch work on the band tiles (`band`: Shaw's k; 0: on
  every tile pair, an upper bound)."""
  costs = []
  for name, grid, text in triton_calls(fn, avals):
    work = read_ir(text)
    block_q, block_k = blocks(name)
    programs = 1
    for g in grid:
      programs *= g
    pairs = causal_tile_pairs(q_len, kv_len, block_q, block_k)
    band_pairs = causal_tile_pairs(q_len, kv_len, block_q, block_k, band) if band else pairs
    total = (
      work.program.scaled(programs)
      + work.trip.scaled(pairs * batch_heads)
      + work.branch.scaled(band_pairs * batch_heads)
    )
    looped = work.trip.flops or work.trip.bytes or work.branch.flops or work.branch.bytes
    costs.append(KernelCost(name, (block_q, block_k), tuple(grid), pairs if looped else 0, total))
  return costs


def _gradient(fn):
  """fn's forward value and gradient in one function of the same arguments (the last one,
  if `fn` takes a mask, is not differentiated)."""

  def both(*args):
    def total(*xs):
      return jnp.sum(fn(*xs).astype(jnp.float32))

    return jax.value_and_grad(total, argnums=tuple(range(len(args))))(*args)

  return both


def schemes(length: int, head_dim: int, distances, dtype, *, batch: int, heads: int):
  """{scheme: (function, avals, {call name pattern: tiles}, band)}: flash, shaw at each k, xl;
  causal self-attention, no dropout, default tiles; band: Shaw's k (its band tiles branch)."""
  from jax.experimental.pallas.ops.gpu import attention as flash

  sds = jax.ShapeDtypeStruct
  qkv = [sds((batch, length, heads, head_dim), dtype)] * 3

  def flash_attention(q, k, v):
    return flash.mha(q, k, v, None, sm_scale=head_dim**-0.5, causal=True)

  out = {
    'flash (jax.experimental.pallas.ops.gpu.attention)': (flash_attention, qkv, FLASH_BLOCKS, 0)
  }
  shaw_blocks = {'': (min(DEFAULT_BLOCK, length),) * 2}
  for k in distances:

    def shaw(q, key, v, wk, wv):
      return shaw_attention(q, key, v, wk, wv, causal=True, implementation='pallas')

    tables = [sds((2 * k + 1, head_dim), dtype)] * 2
    out[f'shaw, k = {k}'] = (shaw, [*qkv, *tables], shaw_blocks, k)

  def xl(q, key, v, r, u, bias_v):
    return xl_attention(q, key, v, r, u, bias_v, implementation='pallas')

  xl_inputs = [sds((length, heads, head_dim), dtype)] + [sds((heads, head_dim), dtype)] * 2
  out['xl'] = (xl, [*qkv, *xl_inputs], {'': (min(DEFAULT_XL_BLOCK, length),) * 2}, 0)
  return out


def _blocks_of(table):
  def blocks(name):
    for pattern, tiles in table.items():
      if pattern and pattern in name:
        return tiles
    return table.get('', next(iter(table.values())))

  return blocks


def report(length, head_dim, distances, dtype, *, batch, heads, gpu='H100 SXM') -> list[str]:
  """The markdown lines: a row per kernel and a total per scheme, then each scheme against
  flash attention."""
  tflops, tb_per_s = GPUS[gpu]
  lines = [
    f'causal self-attention, forward + backward, batch {batch}, {heads} heads, n = {length}, '
    f'head_dim {head_dim}, {jnp.dtype(dtype).name}, default tiles; {gpu}: {tflops:g} TFLOP/s '
    f'dense bf16, {tb_per_s:g} TB/s HBM (data sheet)',
    '',
    '| scheme | pallas_call | tiles | tile pairs per batch and head | tensor GFLOP | ms at peak '
    'FLOP/s | MB loaded + stored | ms at HBM bandwidth, every load from HBM |',
    '|---|---|---|---|---|---|---|---|',
  ]

  def cells(work):
    return (
      f'{work.flops / 1e9:.1f} | {work.flops / (tflops * 1e12) * 1e3:.3f} | '
      f'{work.bytes / 1e6:.0f} | {work.bytes / (tb_per_s * 1e12) * 1e3:.3f}'
    )

  totals = {}
  for scheme, (fn, avals, table, band) in schemes(
    length, head_dim, distances, dtype, batch=batch, heads=heads
  ).items():
    costs = kernel_costs(
      _gradient(fn),
      avals,
      batch_heads=batch * heads,
      q_len=length,
      kv_len=length,
      blocks=_blocks_of(table),
      band=band,
    )
    for cost in costs:
      tiles = f'{cost.blocks[0]} × {cost.blocks[1]}' if cost.tile_pairs else '—'
      lines.append(
        f'| {scheme} | {cost.name} | {tiles} | {cost.tile_pairs or "—"} | {cells(cost.work)} |'
      )
    totals[scheme] = sum((c.work for c in costs), Work())
    lines.append(f'| **{scheme}, all** | | | | {cells(totals[scheme])} |')
  flash = next(iter(totals.values()))
  lines += [
    '',
    '| scheme | tensor FLOPs / flash | bytes loaded + stored / flash |',
    '|---|---|---|',
    *(
      f'| {scheme} | {work.flops / flash.flops:.2f} | {work.bytes / flash.bytes:.2f} |'
      for scheme, work in totals.items()
    ),
  ]
  return lines


# Tile-matmuls (bq x d by d x bk, 2·64·64·d FLOPs at 64 x 64 tiles) per visited tile pair of the
# Mosaic GPU kernels, counted from their structure (their module docstrings): their lowered
# programs are Mosaic GPU custom calls whose loops this reader does not parse. Flash attention:
# forward S and P·V; backward as one kernel with atomic dq (FA2's: S, dP, dV, dK, dQ: 5) or split
# into a dq and a dk/dv kernel without atomics (3 + 4 = 7: JAX's attention_mgpu, and the split
# relpos's Mosaic kernels use).
MOSAIC_TILE_MATMULS = {
  'flash (FA2, one backward kernel)': {'far': (2, 5)},
  'flash (split backward)': {'far': (2, 7)},
  'mosaic shaw': {'far': (2, 7), 'band': (2, 5)},  # band: no recomputation of the band p, dS
  # XL: the position window is 2 wide, but the forward carries its upper half from the last key
  # tile (1, and 2 once per query tile: 'per_query_tile'); each backward kernel recomputes it.
  'mosaic xl': {'far': (3, 19), 'per_query_tile': (1, 0)},
}


def mosaic_tile_matmuls(scheme: str, length: int, memory: int, k: int = 0, block: int = 64):
  """(forward, backward) tile-matmuls per batch and head of `scheme` (a key of
  MOSAIC_TILE_MATMULS) for `length` causal queries over `memory` + `length` keys: every visited
  tile pair's count, and for Shaw its band tiles' (the `num_band` tiles ending at each query
  tile's diagonal, `mosaic_shaw.band_tiles`) instead of the far tiles', plus the scheme's
  count per query tile."""
  from relpos.attention.mosaic_shaw import band_tiles

  kv_len = memory + length
  counts = MOSAIC_TILE_MATMULS[scheme]
  pairs = causal_tile_pairs(length, kv_len, block, block)
  band = 0
  if 'band' in counts:
    num_band = band_tiles(length, k, block, block, memory)
    visible = [(memory + (t + 1) * block) // block for t in range(length // block)]
    band = sum(min(num_band, v) for v in visible)
  (far_fwd, far_bwd), (band_fwd, band_bwd) = counts['far'], counts.get('band', counts['far'])
  far = pairs - band
  first_fwd, first_bwd = counts.get('per_query_tile', (0, 0))
  tiles = length // block
  return (
    far * far_fwd + band * band_fwd + tiles * first_fwd,
    far * far_bwd + band * band_bwd + tiles * first_bwd,
  )


def mosaic_report(length, memory, head_dim, distances, *, batch, heads, gpu='H100 SXM'):
  """Markdown lines: the Mosaic GPU kernels' tensor work against flash attention's, forward
  and backward, and its time at the GPU's dense bf16 peak."""
  tflops, _ = GPUS[gpu]
  matmul = 2 * 64 * 64 * head_dim * batch * heads
  flashes = [name for name in MOSAIC_TILE_MATMULS if name.startswith('flash')]
  rows = [*((name, 0) for name in flashes), *(('mosaic shaw', k) for k in distances)]
  rows.append(('mosaic xl', 0))
  flash = sum(mosaic_tile_matmuls(flashes[0], length, memory))
  lines = [
    f'Mosaic GPU kernels, from their structure: causal, n = {length} over {memory} + {length} '
    f'keys, 64 x 64 tiles, batch {batch}, {heads} heads, head_dim {head_dim}; {gpu} '
    f"{tflops:g} TFLOP/s dense bf16 (XLA's work before and after the kernels not counted)",
    '',
    '| kernel | tile-matmuls fwd / bwd per batch and head | tensor GFLOP fwd+bwd | / FA2 | '
    'ms at peak |',
    '|---|---|---|---|---|',
  ]
  for scheme, k in rows:
    forward, backward = mosaic_tile_matmuls(scheme, length, memory, k)
    name = f'{scheme}, k = {k}' if scheme == 'mosaic shaw' else scheme
    gflop = (forward + backward) * matmul / 1e9
    lines.append(
      f'| {name} | {forward} / {backward} | {gflop:.1f} | {(forward + backward) / flash:.2f} | '
      f'{gflop / tflops:.3f} |'
    )
  return lines


def main(argv):
  del argv  # none: `run_main` refuses positional arguments
  f = flags.FLAGS
  lines = report(
    f.length,
    f.head_dim,
    f.distances,
    jnp.dtype(f.dtype),
    batch=f.batch,
    heads=f.heads,
  )
  lines += ['', *mosaic_report(f.length, 0, f.head_dim, f.distances, batch=f.batch, heads=f.heads)]
  print('\n'.join(lines))


def _check_length(n: int) -> bool:
  """Whether the kernels lower at length n: the Triton lowering takes power-of-two tiles (each
  kernel's default, or n below it), and JAX's flash forward 128-row tiles above 128."""
  if n & (n - 1) and n % FLASH_BLOCKS['forward'][0]:
    raise flags.ValidationError('must be a power of two or a multiple of 128 (the tiles)')
  return True


def define_flags():
  flags.DEFINE_integer('length', 2048, 'Query and key length n.', lower_bound=1)
  flags.DEFINE_integer('head_dim', 64, 'Head dimension.', lower_bound=1)
  flags.DEFINE_integer('batch', 16, 'Batch size.', lower_bound=1)
  flags.DEFINE_integer('heads', 8, 'Heads.', lower_bound=1)
  # k = 0 would read as "no band" in `kernel_costs`, and no k would leave Shaw out of the table.
  flag_types.define_int_list('distances', '16,64', "Shaw's clipping distances k.", minimum=1)
  flags.DEFINE_enum('dtype', 'bfloat16', ['bfloat16', 'float16', 'float32'], 'Input dtype.')
  flags.register_validator('length', _check_length)


if __name__ == '__main__':
  sys.setrecursionlimit(10_000)
  runtime.apply_defaults()
  define_flags()
  from relpos.cli import run_main  # after apply_defaults: it imports jax, as train.py

  run_main(main)
