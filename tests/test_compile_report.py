"""benchmarks/compile_report.py at tiny sizes: abstract builds compile, and the memory report
responds to scan and remat as it should."""

import warnings
from pathlib import Path

import pytest
from helpers import TINY_CHAR_LM, load_config, load_module, one_error_line

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


def test_every_default_row_and_a_preset_pass_the_checks():
  names = ['enwik8_base', 'enwik8_large', 'wmt_base', 'wmt_big', 'char_tiny:shaw']
  rows = bench.planned_rows(names, ['loop', 'scan+full'])
  assert [(name, variant) for name, variant, _ in rows][-2:] == [
    ('char_tiny:shaw', 'loop'),
    ('char_tiny:shaw', 'scan+full'),
  ]
  assert rows[-1][2].model.position == 'shaw' and rows[-1][2].model.remat == 'full'


@pytest.mark.parametrize(
  'args, message',
  [
    (['--configs=nope'], 'error: --configs=nope: no config file '),
    (
      ['--configs=char_tiny:bogus'],
      "--configs=char_tiny:bogus: unknown preset 'bogus': use one of xl,",
    ),
    (['--configs=attention_benchmark'], '--configs=attention_benchmark: not a training config'),
    (['--variants=bogus'], "--variants: 'bogus' must start with loop or scan"),
    (['--variants=loop+bogus'], '--variants=loop+bogus: config.model.remat must be one of'),
    (['--variants='], 'flag --variants=[]: must name at least one'),
    (['--configs='], 'flag --configs=[]: must name at least one'),
    (['--device_gib=-1'], 'flag --device_gib=-1.0: must be > 0'),
  ],
)
def test_a_bad_flag_is_one_error_line_before_the_table(commands, args, message):
  result = commands.run(['benchmarks/compile_report.py', '--configs=char_tiny', *args])
  assert message in one_error_line(result)
  assert result.stdout == ''  # not even the table's header
