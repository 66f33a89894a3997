"""benchmarks/attention.py at tiny sizes: every kernel it times compiles and runs (Pallas
interpreted) and the Pallas ones agree with XLA, the kernel list is checked, and the FLOP
count and peak lookup are what the docstring says."""

import re
import warnings

import jax.numpy as jnp
import pytest
from helpers import REPO, load_config, load_module, one_error_line

with warnings.catch_warnings():
  warnings.simplefilter('ignore', DeprecationWarning)
  bench = load_module(REPO / 'benchmarks' / 'attention.py', 'attention_benchmark')


def _config(preset, **overrides):
  config = load_config('attention_benchmark', preset)
  config.update(overrides)
  return config


@pytest.mark.slow
def test_every_kernel_of_the_gpu_preset_runs_and_is_measured_on_cpu(capsys):
  names = bench.kernel_names(_config('gpu'), 'cpu')
  out = capsys.readouterr().out
  assert 'cudnn: skipped' in out and 'flash_mosaic: skipped' in out
  assert names == ['vanilla', 'flash_pallas', 'shaw', 'shaw_pallas', 'xl', 'xl_pallas']
  lowered, arguments = bench.lower_row(
    names, 17, 3, batch=2, heads=2, head_dim=8, dtype=jnp.bfloat16
  )
  compiled, failed = bench.compile_all(lowered, threads=2)
  assert not failed
  seconds, memory, errors = bench.measure_row(compiled, arguments, rounds=1, repeats=2)
  assert set(seconds) == {(name, mode) for name in names for mode in ('fwd', 'fwd+bwd')}
  assert all(s > 0 for s in seconds.values()) and set(memory) == set(seconds)
  # Each Pallas kernel agrees with its XLA implementation (bf16 inputs: a few 1e-3).
  checked = ('flash_pallas', 'shaw_pallas', 'xl_pallas')
  pallas = {(name, mode) for name in checked for mode in ('fwd', 'fwd+bwd')}
  assert set(errors) == pallas and all(0 < e < 3e-2 for e in errors.values()), errors


def test_a_failed_compile_leaves_out_only_its_own_function():
  class Compiles:
    def compile(self):
      return 'executable'

  class Fails:
    def compile(self):
      raise RuntimeError('shared memory exceeded')

  compiled, failed = bench.compile_all({'a': Compiles(), 'b': Fails()}, threads=2)
  assert compiled == {'a': 'executable'}
  assert list(failed) == ['b'] and 'shared memory' in str(failed['b'])


def test_relative_error_is_the_largest_difference_over_the_largest_reference():
  got = (jnp.array([1.0, 2.0]), jnp.array([[3.0]]))
  want = (jnp.array([1.5, 2.0]), jnp.array([[4.0]]))
  assert bench.relative_error(got, want) == 1.0 / 4.0
  assert bench.relative_error(want, want) == 0.0


def test_kernel_names_put_vanilla_first_and_refuse_unknown_ones():
  assert bench.kernel_names(_config('full', kernels=('xl', 'vanilla')), 'cpu') == ['vanilla', 'xl']
  with pytest.raises(ValueError, match=r"unknown \['flash'\]"):
    bench.kernel_names(_config('full', kernels=('vanilla', 'flash')), 'cpu')


def test_kernel_names_take_tiles():
  assert bench.split_tiles('shaw_pallas@128x64') == ('shaw_pallas', (128, 64))
  assert bench.split_tiles('xl') == ('xl', None)
  for bad, message in (('xl@64', 'tiles must be QxK'), ('vanilla@64x64', 'only shaw_pallas')):
    with pytest.raises(ValueError, match=message):
      bench.kernel_names(_config('full', kernels=(bad,)), 'cpu')


@pytest.mark.slow  # tilings are opt-in for 'auto' since none won on an H200 (docs/gpu.md)
def test_pallas_kernels_run_at_odd_tiles():
  config = _config('full', kernels=('vanilla', 'shaw', 'shaw_pallas@8x4'))
  names = bench.kernel_names(config, 'cpu')
  lowered, arguments = bench.lower_row(
    names, 11, 2, batch=1, heads=2, head_dim=8, dtype=jnp.float32
  )
  compiled, failed = bench.compile_all(lowered, threads=2)
  assert not failed
  _, _, errors = bench.measure_row(compiled, arguments, rounds=1)
  assert max(errors.values()) < 1e-5  # odd tiles, checked against the XLA implementation


def test_profile_traces_the_named_kernels_fwd_and_bwd(capsys):
  """`config.profile` traces each named kernel's fwd+bwd after the table, at every (n, k), and
  prints where its time went; kernels not named are not traced."""
  config = _config(
    'quick', lengths=(16,), distances=(2,), kernels=('vanilla', 'xl'), profile=('xl',), rounds=1
  )
  bench.main(config)
  out = capsys.readouterr().out
  assert '### profile: xl fwd+bwd at n = 16, k = 2' in out
  assert out.count('### profile:') == 1 and '| longest ops (of ' in out
  assert '| backward |' in out  # the pass table: the gradient's ops are the backward


def test_flops_and_peaks():
  fwd = bench.vanilla_causal_flops(8, batch=2, heads=3, head_dim=4, mode='fwd')
  assert fwd == 2 * 2 * 3 * 8 * 8 * 4  # half of the dense 4·B·H·n²·d
  assert bench.vanilla_causal_flops(8, batch=2, heads=3, head_dim=4, mode='fwd+bwd') == 3.5 * fwd
  gpu = _config('gpu')
  assert bench.peak_tflops(gpu, 'NVIDIA H100 80GB HBM3') == 989.4
  assert bench.peak_tflops(gpu, 'NVIDIA H100 PCIe') == 756.0
  assert bench.peak_tflops(gpu, 'cpu') == 0.0
  assert bench.peak_tflops(_config('full'), 'NVIDIA H100 80GB HBM3') == 494.7  # float32: TF32
  assert bench.peak_tflops(_config('full'), 'cpu') == 0.0
  assert bench.peak_tflops(_config('full', peak_tflops=5.0), 'cpu') == 5.0


def test_plot_ratios_draws_a_png(tmp_path):
  ratios = {
    ('fwd', 'vanilla', 16): {32: 1.0, 64: 1.0},
    ('fwd', 'shaw', 16): {32: 1.5, 64: 1.3},
    ('fwd+bwd', 'xl', 16): {32: 1.7, 64: 1.6},
  }
  out = bench.plot_ratios(ratios, tmp_path / 'ratios.png')
  assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_jax_flash_ceilings_run_or_are_left_out_with_their_reason(capsys):
  """flash_pallas (JAX's Triton flash attention, interpreted here) agrees with vanilla attention
  forward and backward; flash_mosaic is GPU-only (said, not run); a kernel whose lowering
  raises is left out of its row with its error, and the rest still compile."""
  config = _config('quick', kernels=('flash_pallas', 'flash_mosaic'))
  names = bench.kernel_names(config, 'cpu')
  assert 'flash_mosaic: skipped, it needs an NVIDIA GPU' in capsys.readouterr().out
  assert names == ['vanilla', 'flash_pallas']
  lowered, arguments = bench.lower_row(
    names + ['flash_mosaic'], 128, 0, batch=1, heads=2, head_dim=16, dtype=jnp.float32
  )
  assert isinstance(lowered['flash_mosaic', 'fwd+bwd'], Exception)  # no CUDA, no causal bwd
  compiled, failed = bench.compile_all(lowered, threads=2)
  assert {name for name, _ in failed} == {'flash_mosaic'}
  seconds, _, errors = bench.measure_row(compiled, arguments, rounds=1)
  assert set(seconds) == {(name, mode) for name in names for mode in ('fwd', 'fwd+bwd')}
  assert set(errors) == {('flash_pallas', 'fwd'), ('flash_pallas', 'fwd+bwd')}
  assert all(e < 1e-4 for e in errors.values()), errors


@pytest.mark.parametrize(
  'overrides, message',
  [
    ({'rounds': 0}, 'config.rounds must be >= 1, got 0'),
    ({'lengths': ()}, 'config.lengths must be a non-empty list, got ()'),
    ({'lengths': (0,)}, 'config.lengths: each entry must be >= 1, got 0'),
    ({'distances': ()}, 'config.distances must be a non-empty list'),
    ({'distances': (-4,)}, 'config.distances: each entry must be >= 0, got -4'),
    ({'dtype': 'bogus'}, "config.dtype must be one of ('float32', 'bfloat16', 'float16')"),
    ({'kernels': ('bogus',)}, "config.kernels: unknown ['bogus']; choose from vanilla"),
    ({'profile': ('xl_palas',)}, "config.profile: unknown ['xl_palas']; choose from vanilla"),
  ],
)
def test_a_config_it_cannot_run_is_refused_naming_the_field(overrides, message):
  bench.check_config(_config('quick'))  # the presets pass
  bench.check_config(_config('gpu', kernels=('vanilla', 'shaw_pallas@128x64')))  # gpu_figures.sh
  with pytest.raises(ValueError, match=re.escape(message)):
    bench.check_config(_config('quick', **overrides))


QUICK = '--config=configs/attention_benchmark.py:quick'


@pytest.mark.parametrize(
  'args, message',
  [
    (['--config=configs/char_tiny.py'], '--config: config.heads is missing: this command reads'),
    ([QUICK, '--config.rounds=0'], 'config.rounds must be >= 1, got 0'),
    ([QUICK, '--config.dtype=bogus'], 'config.dtype must be one of'),
    ([QUICK, '--config.roundz=1'], '--config.roundz: the config has no field roundz'),
    (['--config=configs/nope.py'], '--config=configs/nope.py: configs/nope.py does not exist'),
  ],
)
def test_the_command_refuses_a_bad_config_in_one_line(commands, args, message):
  result = commands.run(['benchmarks/attention.py', *args], timeout=120)
  assert message in one_error_line(result)
