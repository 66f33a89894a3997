"""benchmarks/kernel_cost.py: the Triton IR reader (loops, branches, dots, loads and stores),
the causal tile-pair count against brute force, and the model read off the real kernels
lowered for 'cuda' on this CPU."""

import itertools

import jax.numpy as jnp
import kernel_cost
import pytest
from helpers import one_error_line
from kernel_cost import Work, causal_tile_pairs, read_ir

IR = """module {
  tt.func public @kernel(%arg0: !tt.ptr<bf16> {tt.divisibility = 32 : i32}) {
    %0 = tt.load %p0 : tensor<32x64x!tt.ptr<bf16>>
    %1:2 = scf.for %i = %c0 to %n step %c1 iter_args(%a = %z, %b = %z) -> (tensor<32x64xf32>, tensor<32x1xf32>)  : i32 {
      %2 = tt.load %p1 : tensor<32x64x!tt.ptr<bf16>>
      %3 = tt.dot %0, %2, %acc, inputPrecision = tf32 : tensor<32x64xbf16> * tensor<64x32xbf16> -> tensor<32x32xf32>
      %4 = "tt.reduce"(%3) <{axis = 1 : i32}> ({
      ^bb0(%x: f32, %y: f32):
        %5 = arith.maxnumf %x, %y : f32
        tt.reduce.return %5 : f32
      }) : (tensor<32x32xf32>) -> tensor<32xf32>
      %6 = scf.if %band -> (tensor<32x32xf32>) {
        %7 = tt.load %p2 : tensor<32x32x!tt.ptr<f32>>
        scf.yield %7 : tensor<32x32xf32>
      } else {
        %8 = tt.load %p3 : tensor<32x1x!tt.ptr<f32>>
        scf.yield %3 : tensor<32x32xf32>
      }
      scf.yield %a, %b : tensor<32x64xf32>, tensor<32x1xf32>
    }
    tt.store %p4, %1#0 : tensor<32x64x!tt.ptr<f32>>
    tt.return
  }
}
"""  # noqa: E501


def test_the_reader_splits_program_trip_and_branch_work():
  work = read_ir(IR)
  assert work.program == Work(bytes=32 * 64 * 2 + 32 * 64 * 4)
  assert work.trip == Work(flops=2 * 32 * 64 * 32, bytes=32 * 64 * 2)
  assert work.branch == Work(bytes=32 * 32 * 4 + 32 * 4)  # both arms, an upper bound


@pytest.mark.parametrize(
  ('q_len', 'kv_len', 'block_q', 'block_k', 'band'),
  [(64, 64, 16, 16, 0), (48, 80, 16, 32, 0), (70, 70, 32, 16, 0), (64, 64, 16, 16, 5)],
)
def test_causal_tile_pairs_counts_tiles_with_some_visible_pair(
  q_len, kv_len, block_q, block_k, band
):
  memory = kv_len - q_len
  tiles = set()
  for i, j in itertools.product(range(q_len), range(kv_len)):
    if j <= memory + i and (not band or abs(j - (memory + i)) < band):
      tiles.add((i // block_q, j // block_k))
  assert causal_tile_pairs(q_len, kv_len, block_q, block_k, band) == len(tiles)


def test_the_xl_forward_kernel_does_three_matmuls_per_tile_pair():
  """Read off the real XL kernels lowered for 'cuda' (n = 64, head_dim 16, 32 x 32 tiles, a
  64-row window of R): per tile pair q·kᵀ, (q + v)·R_windowᵀ and p·v, and four kernels."""
  schemes = kernel_cost.schemes(64, 16, [4], jnp.dtype('bfloat16'), batch=1, heads=2)
  fn, avals, _, _ = schemes['xl']
  calls = kernel_cost.triton_calls(kernel_cost._gradient(fn), avals)
  names = [name for name, _, _ in calls]
  assert names == ['xl_forward', 'xl_backward_dq', 'xl_backward_dkv', 'xl_backward_drel']
  forward = read_ir(calls[0][2])
  assert forward.trip.flops == 2 * 32 * 16 * (32 + 64) + 2 * 32 * 32 * 16
  assert forward.branch == Work()
  assert calls[0][1] == (1, 2, 2)  # batch, heads, query tiles


@pytest.mark.slow
def test_the_report_puts_shaw_at_flash_work_and_xl_above_it():
  lines = kernel_cost.report(128, 16, [4], jnp.dtype('bfloat16'), batch=1, heads=1)
  ratios = {
    line.split('|')[1].strip(): float(line.split('|')[2])
    for line in lines
    if line.startswith('| ') and line.count('|') == 4 and 'scheme' not in line
  }
  assert ratios['flash (jax.experimental.pallas.ops.gpu.attention)'] == 1.0
  assert 0.8 < ratios['shaw, k = 4'] < 1.3
  assert ratios['xl'] > 1.5


def test_mosaic_tile_matmuls_by_hand():
  """n = 128 over no memory: query tile 0 sees key tile 0, tile 1 sees tiles 0 and 1, 3 pairs.
  Flash: 2 and 5 each (7 with a split backward). XL: 3 and 19 each, and 1 more forward per
  query tile (the first key tile's upper window half, carried after it). Shaw at k = 3: both of
  tile 1's tiles are in its band (the far tile must have every pair at distance <= -3; tile
  0's last key is 63, tile 1's first query 64: distance -1), so all 3 pairs are band pairs, 2
  and 5 each. Shaw at k = 3 with
  a memory of 256: each query tile sees 5 or 6 tiles, 2 of them band, the rest far."""
  assert kernel_cost.mosaic_tile_matmuls('flash (FA2, one backward kernel)', 128, 0) == (6, 15)
  assert kernel_cost.mosaic_tile_matmuls('flash (split backward)', 128, 0) == (6, 21)
  assert kernel_cost.mosaic_tile_matmuls('mosaic xl', 128, 0) == (3 * 3 + 2, 57)
  assert kernel_cost.mosaic_tile_matmuls('mosaic shaw', 128, 0, 3) == (6, 15)
  far, band = 5 + 6 - 2 * 2, 2 * 2
  assert kernel_cost.mosaic_tile_matmuls('mosaic shaw', 128, 256, 3) == (
    2 * (far + band),
    7 * far + 5 * band,
  )
  lines = kernel_cost.mosaic_report(2048, 0, 64, [16], batch=16, heads=8)
  xl_row = next(line for line in lines if line.startswith('| mosaic xl |'))
  pairs, tiles = 32 * 33 // 2, 32
  xl = (3 + 19) * pairs + tiles  # against FA2's (2 + 5) per pair
  assert xl_row.split('|')[4].strip() == f'{xl / (7 * pairs):.2f}'


@pytest.mark.parametrize(
  'args, message',
  [
    (['--length=0'], 'flag --length=0: 0 is not a positive integer'),
    (['--length=-128'], 'flag --length=-128: -128 is not a positive integer'),
    (['--length=100'], 'flag --length=100: must be a power of two or a multiple of 128'),
    (['--distances=-4'], 'flag --distances=-4: each must be at least 1'),
    (['--distances=abc'], 'flag --distances=abc: give integers, comma-separated'),
    (['--distances='], 'flag --distances=: give one or more integers'),
    (['--dtype=bogus'], 'flag --dtype=bogus: value should be one of'),
    (['--heads=0'], 'flag --heads=0: 0 is not a positive integer'),
    (['stray'], "unexpected arguments ['stray']: every option is a flag"),
  ],
)
def test_a_bad_flag_is_one_error_line(commands, args, message):
  result = commands.run(['benchmarks/kernel_cost.py', '--length=128', '--batch=1', *args])
  assert message in one_error_line(result)
