"""The step benchmarks the peer harness runs, as it runs them: scripts in
their own process, with relpos's CPU defaults (here 2 host devices, so every batch must split
between them)."""

import os
import subprocess
import sys

import pytest
import timing  # benchmarks/timing.py, on pytest's pythonpath
from helpers import REPO, TINY_CHAR_LM_FLAGS, refusal, write_pair_corpus, write_word_corpus

from relpos import runtime

pytestmark = pytest.mark.usefixtures('attention_test_config')


def _run_flags_without_a_device_count() -> str:
  """This run's XLA_FLAGS (conftest's fast-compile flag among them) less any device count."""
  flags = os.environ.get('XLA_FLAGS', '').split()
  return ' '.join(flag for flag in flags if not flag.startswith(runtime.DEVICES_FLAG))


def _run(script: str, *flags: str) -> str:
  # XLA's optimisations are mostly off here as in the whole run (conftest): nothing checked
  # depends on them (XLA's FLOP count is read from the lowered, unoptimised module; the rates
  # are only checked to be positive and ordered). The run's XLA_FLAGS stay (conftest's
  # fast-compile flag: popping them made the 4 compiles of the char LM's test ~25% slower),
  # less any device count, so that RELPOS_CPU_DEVICES=2 sets it.
  env = {**os.environ, 'RELPOS_CPU_DEVICES': '2', 'RELPOS_COMPILATION_CACHE': 'off'}
  env['XLA_FLAGS'] = _run_flags_without_a_device_count()
  done = subprocess.run(
    [sys.executable, str(REPO / 'benchmarks' / script), *flags],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stdout


def _table_rows(stdout: str) -> dict:
  """{first cell: the other cells} of the markdown table the benchmark prints."""
  rows = [line.strip('|').split('|') for line in stdout.splitlines() if line.startswith('| ')]
  return {cells[0].strip(): [cell.strip() for cell in cells[1:]] for cells in rows[1:]}


@pytest.mark.slow
def test_translate_step_times_split_batches_with_prng_lowerings_shaw_thresholds_and_kernels(
  tmp_path,
):
  corpus = write_pair_corpus(tmp_path / 'pairs')
  # 256 tokens over rows of 17 positions is 15 rows unless rows are a multiple of the devices.
  stdout = _run(
    'translate_step.py',
    '--config=configs/translate_tiny.py',
    f'--config.data.train_src={corpus / "train.en"}',
    f'--config.data.train_tgt={corpus / "train.de"}',
    f'--config.data.eval_src={corpus / "eval.en"}',
    f'--config.data.eval_tgt={corpus / "eval.de"}',
    '--config.data.moses_detokenize=False',
    '--config.data.vocab_size=40',
    '--config.data.max_length=16',
    '--config.data.max_tokens=256',
    '--config.data.length_buckets=1',
    '--config.model.encoder_layers=1',
    '--config.model.decoder_layers=1',
    '--config.model.d_model=16',
    '--config.model.num_heads=2',
    '--config.model.d_ff=32',
    '--batches=2',
    '--rounds=1',
    '--positions=shaw',
    '--threefry=unrolled,rolled',
    '--shaw_dense_max_kv_len=0,64',  # the banded kernel, then the dense form (≤ 17 keys)
    '--attention_implementations=xla',
    '--dropout_bits=hash',
  )
  rows = _table_rows(stdout)
  names = {
    f'shaw, {lowering}, dense ≤ {threshold} keys, xla kernels, hash dropout bits'
    for lowering in ('unrolled', 'rolled')
    for threshold in (0, 64)
  }
  assert set(rows) == names, stdout
  first = 'shaw, unrolled, dense ≤ 0 keys, xla kernels, hash dropout bits'
  assert float(rows[first][2]) == 1.0  # / the first
  assert all(float(cells[1]) > 0 for cells in rows.values())  # target tokens/s
  assert 'peak: the float32 matmul rate on these 2 CPU device(s), ' in stdout
  for cells in rows.values():  # model and XLA GFLOP / step, model GFLOP/s, MFU (all, visible)
    model_gflop, xla_gflop, gflops, mfu, mfu_visible = map(float, cells[3:])
    assert 0 < model_gflop < xla_gflop  # XLA adds softmax, LayerNorm, Adam, the one-hot forms
    assert gflops > 0 and 0 < mfu_visible < mfu  # the decoder's masked pairs left out


# In the default run (18-24 s of one worker, 2026-11-29) since the GPU sessions' step parts
# run this script: a crash here would cost device minutes.
def test_char_lm_step_times_the_variants_asked_for(tmp_path):
  # Memory's share of the FLOPs is test_flops' (mem_len 0 against 2); each variant here is
  # one more program to build (xl_mem0 was: about 5 s).
  text = write_word_corpus(tmp_path / 'text.txt')
  stdout = _run(
    'char_lm_step.py',
    '--config=configs/char_tiny.py',
    f'--config.data.path={text}',
    *TINY_CHAR_LM_FLAGS,
    '--config.train.batch_size=4',
    '--rounds=1',
    '--variants=none,xl,xl_xla,xl_hash_dropout',
  )
  rows = _table_rows(stdout)
  assert list(rows) == ['none', 'xl', 'xl, xla kernels', 'xl, hashed dropout bits'], stdout
  assert '| step time / none |' in stdout and float(rows['none'][2]) == 1.0  # the first named
  # Model and XLA FLOP counts: XL's position terms add work to the model without positions.
  for column in (3, 4):
    assert 0 < float(rows['none'][column]) < float(rows['xl'][column])
  # On a CPU 'auto' is 'xla' at every call: the same program, built and timed once.
  assert "xl, xla kernels: not built again: every attention call of 'xl' chose" in stdout
  assert rows['xl, xla kernels'][:5] == rows['xl'][:5]
  # The hashed bits: the same model's FLOPs, another program.
  assert rows['xl, hashed dropout bits'][3] == rows['xl'][3]
  assert all(0 < float(cells[7]) < float(cells[6]) for cells in rows.values())  # MFU


def test_a_repeated_row_takes_its_auto_variants_time_and_counts_in_the_order_named():
  model_flops = {'auto': 7.0, 'pallas': 9.0}
  seconds = timing.with_repeated_rows(
    {'auto': 1.0, 'pallas': 2.0}, {'xla': 'auto'}, ['auto', 'xla', 'pallas'], model_flops
  )
  assert list(seconds.items()) == [('auto', 1.0), ('xla', 1.0), ('pallas', 2.0)]
  assert model_flops == {'auto': 7.0, 'pallas': 9.0, 'xla': 7.0}


def test_char_lm_step_refuses_unknown_variants(commands):
  done = commands.run(
    [
      str(REPO / 'benchmarks' / 'char_lm_step.py'),
      '--config=configs/char_tiny.py',
      '--variants=shaw,shaw_triton',
    ]
  )
  assert done.returncode != 0
  assert '--variants: one or more of xl, xl_mem0, shaw' in done.stderr


def test_peak_memory_line_reads_the_devices_allocator_stats(monkeypatch):
  class Device:
    def __init__(self, stats):
      self.stats = stats

    def memory_stats(self):
      return self.stats

  monkeypatch.setattr(timing.jax, 'local_devices', lambda: [Device(None)])
  assert timing.peak_memory_line() == ''  # XLA:CPU keeps no statistics
  devices = [Device({'peak_bytes_in_use': 2**30}), Device({'peak_bytes_in_use': 3 * 2**30})]
  monkeypatch.setattr(timing.jax, 'local_devices', lambda: devices)
  assert timing.peak_memory_line().startswith('peak device memory: 3.00 GiB (the largest of 2')


def _gpu_figures(out, *parts):
  """Runs benchmarks/gpu_figures.sh with every command echoed instead of run (PYTHON=echo)."""
  done = subprocess.run(
    ['bash', str(REPO / 'benchmarks' / 'gpu_figures.sh'), str(out), str(out.parent), *parts],
    cwd=REPO,
    env={**os.environ, 'PYTHON': 'echo'},
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert done.returncode == 0, done.stderr
  return (out / 'summary.txt').read_text()


def test_gpu_figures_launches_every_part_and_only_those_asked_for(tmp_path):
  """Every part's command starts (so none exits 127, as the attention parts did when they
  called a shell function under `timeout`), each logs to its own file, and summary.txt records
  each part's exit status; parts not asked for do not run."""
  summary = _gpu_figures(tmp_path / 'all')
  parts = 'native attention_2048 char_lm translate attention_512 attention_8192 tiles xl_tiles'
  for part in parts.split():
    assert f'end {part}: exit 0' in summary, summary
    log = (tmp_path / 'all' / f'{part}.log').read_text()
    assert ('pytest' if part == 'native' else 'benchmarks/') in log, log
  assert 'xl_xla' in (tmp_path / 'all' / 'char_lm.log').read_text()
  _gpu_figures(tmp_path / 'one', 'tiles')
  assert sorted(path.name for path in (tmp_path / 'one').iterdir()) == [
    'env.log',
    'summary.txt',
    'tiles.log',
  ]


def test_step_flops_counts_every_devices_share_and_matmul_rate_picks_a_shape():
  """On 2 devices, XLA's count for a row-split matmul is the whole matmul's 2·m·k·n (a
  partitioned module's own count would be half), and the matmul rate names one of the shapes."""
  script = """
import jax, jax.numpy as jnp, timing
from relpos.training.mesh import data_mesh, row_sharded
mesh = data_mesh()
matmul = jax.jit(jnp.matmul, in_shardings=(row_sharded(mesh), None))
print(mesh.size, timing.step_flops(matmul, jnp.ones((64, 16)), jnp.ones((16, 8))))
rate = timing.MatmulRate(mesh, [(64, 16, 8), (33, 8, 16)], rounds=2)
print(rate.gflops, rate.shape)
"""
  env = {
    **os.environ,
    # The device count first (XLA stops reading at a word without '--'), the run's flags after.
    'XLA_FLAGS': f'{runtime.DEVICES_FLAG}=2 {_run_flags_without_a_device_count()}'.strip(),
    'PYTHONPATH': str(REPO / 'benchmarks'),
  }
  done = subprocess.run(
    [sys.executable, '-c', script], env=env, capture_output=True, text=True, timeout=120
  )
  assert done.returncode == 0, done.stderr[-3000:]
  counted, rate = done.stdout.splitlines()
  assert counted.split() == ['2', str(float(2 * 64 * 16 * 8))]
  gflops, shape = rate.split(maxsplit=1)
  assert float(gflops) > 0 and shape in ('(64, 16, 8)', '(32, 8, 16)')  # 33 rows: 32 split evenly


def test_build_within_a_budget_leaves_the_last_out_and_says_so(capsys):
  """Builds of 10 s each (a fake clock) under 100 s, 60% of it for building: after five, the
  sixth is expected to end at 60 s (within), after six the seventh at 70 s (over): six built."""
  now = [0.0]

  def build(name):
    now[0] += 10.0
    return name.upper()

  names = [f'v{i}' for i in range(9)]
  built, left_out = timing.build_within(names, build, 100.0, clock=lambda: now[0])
  assert built == {name: name.upper() for name in names[:6]}
  assert left_out == 'time budget: left out v6, v7, v8 (building 6 took 60 s of --seconds=100)'
  printed = capsys.readouterr().out.splitlines()
  assert printed[:6] == [f'built v{i} in 10.0 s' for i in range(6)] and printed[6] == left_out
  now[0] = 0.0
  assert timing.build_within(names, build, 0.0, clock=lambda: now[0]) == (
    {name: name.upper() for name in names},
    '',
  )
  now[0] = 0.0
  slow = timing.build_within(names, lambda name: now.__setitem__(0, 1e3), 1.0, clock=lambda: now[0])
  assert list(slow[0]) == ['v0']  # the first is always built


def test_check_then_time_checks_times_and_leaves_out_a_failing_kernel():
  """The Mosaic benchmarks' loop (timing.check_then_time) on toy kernels: each kernel's error
  against the reference, forward and backward, then ms, TFLOP/s and the ratio to 'xla' of the
  same pass; a kernel that raises gets one 'failed' line and is not timed."""
  import jax.numpy as jnp

  def reference(x, y):
    return jnp.tanh(x) * y

  def broken(x, y):
    raise RuntimeError('no kernel here\nsecond line')

  x, y = jnp.linspace(-1, 1, 8), jnp.linspace(1, 2, 8)
  fns = {'xla': reference, 'scaled': lambda x, y: reference(x, y) * 1.5, 'broken': broken}
  lines = timing.check_then_time(
    fns, reference, (x, y), jnp.ones(8), label='n=8', flops=1e6, check_only=False, rounds=2
  )
  assert 'n=8 xla: error vs xla 0.00e+00, first call' in lines[0]
  assert lines[2].startswith('n=8 scaled: error vs xla 5.00e-01')  # 1.5x the reference
  assert 'n=8 broken: failed: RuntimeError: no kernel here' in lines
  timed = [line for line in lines if ' ms, ' in line]
  assert [line.split(':')[0] for line in timed] == ['n=8 xla', 'n=8 xla+bwd', 'n=8 scaled'] + [
    'n=8 scaled+bwd'
  ]
  assert timed[0].endswith('1.00x xla') and timed[3].endswith('x xla+bwd')
  checked = timing.check_then_time(
    fns, reference, (x, y), jnp.ones(8), label='n=8', flops=1e6, check_only=True
  )
  assert not [line for line in checked if ' ms, ' in line]


_CHAR = ('--config=configs/char_tiny.py', '--variants=none')
_TRANSLATE = (
  '--config=configs/translate_tiny.py',
  '--batches=1',
  '--rounds=1',
  '--positions=absolute',
)
_A_FILE = str(REPO / 'README.md')


@pytest.mark.parametrize(
  ('script', 'flags', 'message'),
  [
    ('char_lm_step.py', (*_CHAR, '--rounds=0'), '--rounds=0: 0 is not a positive integer'),
    ('char_lm_step.py', (*_CHAR, '--rounds=-2'), '--rounds=-2: -2 is not a positive integer'),
    ('char_lm_step.py', (*_CHAR, '--profile_steps=-1'), '-1 is not a non-negative integer'),
    (
      'char_lm_step.py',
      (*_CHAR, '--profile_steps=1', f'--profile_dir={_A_FILE}/sub'),
      f'{_A_FILE} is not a folder',
    ),
    ('char_lm_step.py', (*_CHAR, '--profile_dir=traces'), 'give --profile_steps=N'),
    ('char_lm_step.py', (*_CHAR, '--seconds=-1'), '-1.0 is not a non-negative number'),
    ('char_lm_step.py', (*_CHAR, '--config.train.batch_size=3'), 'make it a multiple of 2'),
    ('char_lm_step.py', (*_CHAR, '--config.train.batch_size=0'), 'batch_size must be >= 1'),
    (
      'char_lm_step.py',
      ('--config=configs/translate_tiny.py',),
      "task char_lm; the one given has config.task='translate'",
    ),
    (
      'char_lm_step.py',
      ('--config=configs/char_tiny.py', '--variants=none,xl_cudnn'),
      "--variants=xl_cudnn: config.model.attention_implementation='cudnn' needs",
    ),
    ('char_lm_step.py', ('--config=configs/nope.py',), 'configs/nope.py'),
    ('char_lm_step.py', (*_CHAR, '--config.train.tgt_lenn=8'), 'no field train.tgt_lenn'),
    ('translate_step.py', (*_TRANSLATE, '--threefry=bogus'), '--threefry takes one or more of'),
    ('translate_step.py', (*_TRANSLATE, '--positions=bogus'), '--positions=bogus: config.model'),
    ('translate_step.py', (*_TRANSLATE, '--positions='), '--positions takes one or more'),
    ('translate_step.py', (*_TRANSLATE, '--batches=0'), '--batches=0: 0 is not a positive'),
    ('translate_step.py', (*_TRANSLATE, '--batches=-1'), '--batches=-1: -1 is not a positive'),
    ('translate_step.py', (*_TRANSLATE, '--rounds=0'), '--rounds=0: 0 is not a positive'),
    ('translate_step.py', (*_TRANSLATE, '--profile_steps=-2'), '-2 is not a non-negative'),
    (
      'translate_step.py',
      ('--config=configs/char_tiny.py',),
      "task translate; the one given has config.task='char_lm'",
    ),
    ('mosaic_xl.py', ('--lengths=0',), '--lengths=0: each must be at least 1'),
    ('mosaic_xl.py', ('--lengths=5x',), '--lengths=5x: give integers, comma-separated'),
    ('mosaic_xl.py', ('--kernels=flash',), "--kernels: unknown ['flash']; choose from mosaic"),
    ('mosaic_xl.py', ('--batch=0',), '--batch=0: 0 is not a positive integer'),
    ('mosaic_xl.py', (), 'needs an NVIDIA GPU; pass --interpret on a CPU'),
    ('mosaic_shaw.py', ('--distances=-1',), '--distances=-1: each must be at least 0'),
    ('mosaic_shaw.py', ('--block_kv=0',), '--block_kv=0: 0 is not a positive integer'),
    ('mosaic_shaw.py', ('stray',), "unexpected arguments ['stray']"),
    ('triton_compile.py', ('--dtypes=int8',), "--dtypes: unknown ['int8']"),
    ('triton_compile.py', ('--block_sizes=64by64',), '--block_sizes'),
    ('triton_compile.py', ('--distances=k',), '--distances=k: give integers, comma-separated'),
  ],
)
def test_step_benchmarks_refuse_bad_flags_and_configs_in_one_line(commands, script, flags, message):
  """A bad count, list, folder, config value or config of the other task: one `error:` line
  before anything is built or read (translate_tiny's Tatoeba files need not exist), not a
  traceback, a `nan` table or a row timed with another setting than its label."""
  assert message in refusal(commands, REPO / 'benchmarks' / script, *flags)
