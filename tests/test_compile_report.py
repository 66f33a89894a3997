"""benchmarks/compile_report.py at tiny sizes: abstract builds compile, and the memory report
responds to scan and remat as it should."""

import warnings
from pathlib import Path

import pytest
from helpers import TINY_CHAR_LM, load_config, load_module

# Memory and compile reports are of XLA's optimised programs.
pytestmark = pytest.mark.xla_optimizations

_BENCHMARKS = Path(__file__).resolve().parent.parent / 'benchmarks'
with warnings.catch_warnings():
  warnings.simplefilter('ignore', DeprecationWarning)
  bench = load_module(_BENCHMARKS / 'compile_report.py', 'compile_report_benchmark')


@pytest.mark.slow
def test_remat_cuts_the_temporaries_and_keeps_the_arguments():
  config = load_config('char_tiny')
  config.model.update(TINY_CHAR_LM['model'], num_layers=3, d_model=32)
  config.train.update(batch_size=4, tgt_len=32, mem_len=32)
  rows = {
    variant: bench.measure(bench.variant_config(config, variant))
    for variant in ('loop', 'scan', 'scan+full')
  }
  assert rows['loop']['batch'] == '4 x 32 chars, mem 32'
  assert len({row['arguments'] for row in rows.values()}) == 1  # the same parameters and batch
  assert rows['scan+full']['temporaries'] < rows['scan']['temporaries']
  assert all(row['compile_s'] > 0 and row['output'] > 0 for row in rows.values())


@pytest.mark.slow
def test_translation_batch_is_the_longest_bucket():
  config = load_config('translate_tiny')
  config.model.update(encoder_layers=1, decoder_layers=1, d_model=32, num_heads=2, d_ff=64)
  config.data.update(vocab_size=64, max_length=15, max_tokens=64)
  assert bench.measure(bench.variant_config(config, 'loop'))['batch'] == '4 x 16 pieces'


def test_devices_needed_and_variant_names():
  gib = 2**30
  assert bench.devices_needed(10 * gib, 100 * gib, 80 * gib) == '2'
  assert bench.devices_needed(10 * gib, 1 * gib, 80 * gib) == '1'
  assert bench.devices_needed(90 * gib, 1 * gib, 80 * gib) == '-'
  config = bench.variant_config(load_config('char_tiny'), 'scan+dots')
  assert (config.model.scan_layers, config.model.remat) == (True, 'dots')
  with pytest.raises(ValueError, match="'unrolled' must start with loop or scan"):
    bench.variant_config(load_config('char_tiny'), 'unrolled')
