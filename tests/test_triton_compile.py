"""benchmarks/triton_compile.py without Triton: the Pallas kernels' Triton IR is taken out of a
'cuda' export, one file per pallas_call; compiling needs a Python with Triton."""

import json
import re
import sys
import warnings
from pathlib import Path

import jax.numpy as jnp
import pytest
from helpers import load_module

_BENCHMARKS = Path(__file__).resolve().parent.parent / 'benchmarks'
with warnings.catch_warnings():
  warnings.simplefilter('ignore', DeprecationWarning)
  bench = load_module(_BENCHMARKS / 'triton_compile.py', 'triton_compile_benchmark')


@pytest.mark.parametrize('blocks,warps', [((16, 16), 4), ((128, 64), 8)])
def test_writes_each_pallas_call_as_triton_ir(tmp_path, blocks, warps):
  fn, avals = bench._attention('shaw', 48, 16, 2, jnp.float32, blocks)
  stems = bench.write_kernels(fn, avals, tmp_path, 'shaw')
  names = ['shaw_forward', 'shaw_backward_dq', 'shaw_backward_dkv']
  assert list(stems.values()) == [(name, warps) for name in names]
  for stem in stems:
    text = (tmp_path / f'{stem}.ttir').read_text()
    assert 'tt.func public' in text and 'tt.dot' in text, stem
    # Tiles over 64 x 64 pairs get 8 warps (`pallas_common.triton_warps`).
    assert json.loads((tmp_path / f'{stem}.json').read_text())['num_warps'] == warps
  # Shaw's kernels read the per-row tables at computed addresses and scatter into them.
  assert 'tt.store' in (tmp_path / 'shaw_0.ttir').read_text()


def test_compiling_without_triton_says_so(tmp_path):
  (tmp_path / 'k.ttir').write_text('module {}')
  (tmp_path / 'k.json').write_text(json.dumps(dict(num_warps=4, num_stages=3)))
  try:
    import triton  # noqa: F401

    pytest.skip('Triton is installed here')
  except ImportError:
    pass
  with pytest.raises(RuntimeError, match='could not compile the kernels'):
    bench.compile_with_triton(sys.executable, tmp_path)


def test_bad_flags_and_interpreters_get_one_clear_error(tmp_path):
  assert bench.parse_block_sizes(['default', '128x64']) == [None, (128, 64)]
  with pytest.raises(ValueError, match='--block_sizes'):
    bench.parse_block_sizes(['64by64'])
  with pytest.raises(RuntimeError, match='^cannot run it'):
    bench.compile_with_triton('/nonexistent/python', tmp_path)


def test_xl_kernels_skew_with_a_register_gather(tmp_path):
  """XL's relative shift lowers to Triton's `tt.gather` (`pallas_gather`) in all four kernels,
  with no three-dimensional array left (the one-hot reductions it replaced were
  [block_q, block_k, window])."""
  fn, avals = bench._attention('xl', 48, 16, None, jnp.float32, (16, 16))
  stems = bench.write_kernels(fn, avals, tmp_path, 'xl')
  names = ['xl_forward', 'xl_backward_dq', 'xl_backward_dkv', 'xl_backward_drel']
  assert [name for name, _ in stems.values()] == names
  for stem in stems:
    text = (tmp_path / f'{stem}.ttir').read_text()
    assert 'tt.gather' in text, stem
    assert re.search(r'tensor<\d+x\d+x\d+x', text) is None, stem
