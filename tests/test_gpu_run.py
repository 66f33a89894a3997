"""benchmarks/gpu_run.sh's plumbing without a GPU: its dry run (PYTHON=echo: every part prints
its commands) writes a markdown log listing every part as "dry run", the budget skips parts, and
benchmarks/gpu_run.py's loss checker compares a resumed run with a reference."""

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from gpu_run import compare_losses, main, read_losses, split_runs

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / 'benchmarks' / 'gpu_run.sh'
PARTS = (
  'env native mosaic_native resume translate_bleu steps_xl steps_shaw translate_step steps_bf16 '
  'steps_bf16_shaw translate_step_bf16 flags_off oom kernels xl_official mosaic steps_mosaic '
  'long_context autotune'
).split()

needs_bash = pytest.mark.skipif(
  shutil.which('bash') is None or shutil.which('timeout') is None, reason='needs bash and timeout'
)


def dry_run(tmp_path, *parts, budget=480, peers=True, **settings):
  if peers:  # what gpu_prepare.sh copies from the maintainers' shared folder
    (tmp_path / 'carry' / 'peers' / 'gpu').mkdir(parents=True, exist_ok=True)
  environ = {
    'PATH': '/usr/bin:/bin',
    'PYTHON': 'echo',
    'OUT': str(tmp_path / 'out'),
    'GPU_RUN_WORK': str(tmp_path / 'work'),
    'GPU_CARRY': str(tmp_path / 'carry'),
    'GPU_RUN_BUDGET': str(budget),
    **settings,
  }
  result = subprocess.run(
    ['bash', str(SCRIPT), *parts], env=environ, capture_output=True, text=True, timeout=60
  )
  log = tmp_path / 'out' / 'gpu_run.md'
  return result, log.read_text() if log.exists() else ''


@needs_bash
def test_dry_run_lists_every_part_with_its_commands(tmp_path):
  result, log = dry_run(tmp_path)
  assert result.returncode == 0, result.stderr
  for name in PARTS:
    assert f'| {name} | dry run | 0 |' in log, name
    assert f'## {name}' in log, name
  assert (tmp_path / 'out' / 'raw_logs.tar.gz').exists()
  assert sorted(p.name for p in (tmp_path / 'out').iterdir()) == ['gpu_run.md', 'raw_logs.tar.gz']
  # The commands each part would run, as the GPU will get them.
  # 'auto' first, then the kernels it chose between, one position a part (builds take ~50 s).
  assert '--variants=xl,xl_xla,xl_pallas --seconds=150' in log
  assert '--variants=shaw,shaw_xla,shaw_pallas --seconds=150' in log
  bf16 = 'xl,xl_cudnn,xl_xla,xl_pallas,xl_nodropout,xl_hash_dropout'
  assert f'--variants={bf16} --seconds=250' in log  # in order of need, under the part's limit
  assert '--profile_steps=2 --variants=shaw,shaw_xla,shaw_pallas --seconds=160' in log
  flags_off = log.split('## flags_off\n')[1].split('\n## ')[0]
  assert '--variants=xl_pallas,shaw_pallas --seconds=110' in flags_off
  # The translation pipeline with XLA's kernels and 3 buckets, the Mosaic tests named verbosely.
  bleu = log.split('## translate_bleu\n')[1].split('\n## ')[0]
  assert '--config.model.attention_implementation=xla --config.data.length_buckets=3' in bleu
  assert '-k native or ragged_length -m slow or not slow -n 4 -rA -v' in log
  # The Mosaic kernels, never run on a GPU, only in the last parts and processes of their own.
  assert '--variants=xl,xl_xla,shaw,shaw_xla,xl_mosaic,shaw_mosaic --seconds=100' in log
  for name in ('autotune', 'steps_xl', 'steps_shaw', 'translate_step', 'steps_bf16', 'kernels'):
    section = log.split(f'## {name}\n')[1].split('\n## ')[0]
    assert '_mosaic' not in section and 'AUTOTUNE_MOSAIC' not in section, name
  assert 'cudnn_native' in log
  assert 'benchmarks/mosaic_shaw.py --lengths=2048 --distances=16,64 --batch=16' in log
  assert '--lengths=512 --memory=512 --distances=16 --batch=22' in log
  assert 'benchmarks/mosaic_xl.py --lengths=512 --memory=512 --batch=22' in log
  assert '--config.model.dtype=bfloat16' in log and '--profile_steps=2' in log
  assert 'resume --config=configs/enwik8_base.py' in log and '--kill_after=130' in log
  assert 'configs/translate_tiny.py:shaw' in log and 'tatoeba_ende/train.en.gz' in log
  assert '--attention_implementations=auto,xla,pallas' in log
  translate_bf16 = log.split('## translate_step_bf16\n')[1].split('\n## ')[0]
  assert 'configs/wmt_base.py:shaw' in translate_bf16
  assert '--profile_steps=1 --config.model.dtype=bfloat16' in translate_bf16
  assert 'bfloat16' not in log.split('## translate_step\n')[1].split('\n## ')[0]
  assert 'torch_attention.py 2048 64' in log and 'xl_official_step.py' in log
  assert 'long_context --config=configs/enwik8_base.py' in log and '--start=4096' in log
  assert '--starts=xla:4096,pallas:65536,mosaic:65536' in log
  assert '--implementations=mosaic,pallas,xla -- --config.model.scan_layers=True' in log
  assert '--config.model.dtype=bfloat16' in log


@needs_bash
def test_a_dry_run_says_so_prints_its_commands_and_writes_no_gpu_out(tmp_path):
  """A dry run printed only each part's start and end lines, marked every part "ok" as if it
  had passed, and wrote the repository's gpu_out/gpu_run.md (a real run's log, replaced)."""
  result, _ = dry_run(tmp_path, 'steps_xl', OUT='')  # no OUT: the default
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  ended = next(i for i, line in enumerate(lines) if ' end steps_xl: ' in line)
  # The seconds are the clock's whole seconds between start and end: 1 where they straddle one.
  assert re.search(r'end steps_xl: dry run \(exit 0, [01] s\)$', lines[ended]), result.stdout
  command = 'python benchmarks/char_lm_step.py --config=configs/enwik8_base.py --rounds=10'
  assert lines[ended + 1].startswith(f'    {command}'), result.stdout
  out = tmp_path / 'work' / 'out'
  assert f'log: {out}/gpu_run.md;' in result.stdout
  log = (out / 'gpu_run.md').read_text()
  assert '| steps_xl | dry run | 0 |' in log and '- dry run (PYTHON=echo): nothing ran' in log
  assert f'{command} --variants=xl,xl_xla,xl_pallas' in log.split('## steps_xl\n')[1]


@needs_bash
def test_without_the_peers_their_comparisons_are_skipped_and_said_so(tmp_path):
  """A GPU of one's own has no gpu_carry/peers (they come from the maintainers' shared
  folder): the official XL step and the torch kernels were run anyway and failed."""
  result, log = dry_run(tmp_path, 'xl_official', 'kernels', peers=False)
  assert result.returncode == 0, result.stderr
  assert '| xl_official | dry run | 0 |' in log and '| kernels | dry run | 0 |' in log
  assert 'xl_official_step.py' not in log and 'torch_attention.py' not in log
  for name in ('xl_official', 'kernels'):
    assert 'RESULT: skipped: no peers in ' in log.split(f'## {name}\n')[1].split('\n## ')[0]
  assert 'benchmarks/attention.py' in log  # relpos's own kernels are still timed


@needs_bash
def test_budget_skips_parts_and_unknown_parts_stop(tmp_path):
  result, log = dry_run(tmp_path, 'oom', 'kernels', budget=5)
  assert result.returncode == 0, result.stderr
  assert '| oom | skipped: budget spent |' in log and '| kernels | skipped: budget spent |' in log
  assert '| env |' not in log
  result, _ = dry_run(tmp_path / 'again', 'nonsense')
  assert result.returncode == 2 and 'no part nonsense' in result.stderr


@needs_bash
@pytest.mark.parametrize(
  'parts, settings, message',
  [
    (('nonsense',), {}, 'gpu_run: no part nonsense; parts: env native'),
    (('--body',), {}, 'gpu_run: --body needs a part name'),
    (('--body', 'nonsense'), {}, 'gpu_run: no part nonsense'),
    (('env',), {'GPU_RUN_BUDGET': 'abc'}, 'gpu_run: GPU_RUN_BUDGET=abc: must be a whole number'),
    (('env',), {'GPU_RUN_SLOW': '1.5'}, 'gpu_run: GPU_RUN_SLOW=1.5: must be a whole number'),
  ],
)
def test_a_wrong_command_line_is_one_line_and_leaves_no_folders(tmp_path, parts, settings, message):
  result, _ = dry_run(tmp_path, *parts, **settings)
  assert result.returncode == 2 and result.stderr.splitlines() == [result.stderr.strip()]
  assert result.stderr.startswith(message), result.stderr
  assert not (tmp_path / 'out').exists() and not (tmp_path / 'work').exists()


def _metrics(path, rows):
  path.write_text(''.join(json.dumps({'step': s, 'train/loss': v}) + '\n' for s, v in rows))
  return path


def test_losses_checker(tmp_path, capsys):
  reference = read_losses(_metrics(tmp_path / 'ref.jsonl', [(10, 3.0), (20, 2.5), (30, 2.0)]))
  # Step 30 logged before the kill (2.9), then again after the resume at 20: the later counts.
  resumed_path = _metrics(tmp_path / 'resumed.jsonl', [(10, 3.0), (20, 2.5), (30, 2.9), (30, 2.0)])
  resumed = read_losses(resumed_path)
  passed, lines = compare_losses(reference, resumed, after=20)
  assert passed and 'identical' in lines[-1] and '| 30 | 2.00000000 | 2.00000000 |' in lines
  off = read_losses(_metrics(tmp_path / 'off.jsonl', [(10, 3.0), (20, 2.5), (30, 2.0 + 1e-6)]))
  passed, lines = compare_losses(reference, off, after=20)
  assert not passed and 'at step 30' in lines[-1]
  assert compare_losses(reference, off, tolerance=1e-5, after=20)[0]
  assert not compare_losses(reference, {10: 3.0})[0]
  assert not compare_losses({}, resumed)[0]
  assert main(['losses', str(tmp_path / 'ref.jsonl'), str(resumed_path), '--after=20']) == 0
  assert 'RESULT: PASS' in capsys.readouterr().out


def test_split_runs_finds_the_resumed_run_in_one_metrics_file(tmp_path):
  """A run killed after step 40 and resumed from its step-20 checkpoint appends steps 30 and
  40 again: two runs, whose common steps are what the resume check compares. Records without
  a train/loss (evaluations) neither start nor end a run."""
  path = tmp_path / 'metrics.jsonl'
  rows = [(10, 3.0), (20, 2.5), (30, 2.2), (40, 2.0), (30, 2.2), (40, 2.0), (50, 1.9)]
  _metrics(path, rows)
  with path.open('a') as handle:
    handle.write(json.dumps({'step': 50, 'eval/bpc': 2.7}) + '\n\n')
  first, second = split_runs(path)
  assert first == {10: 3.0, 20: 2.5, 30: 2.2, 40: 2.0}
  assert second == {30: 2.2, 40: 2.0, 50: 1.9}
  twice = {step: loss for step, loss in first.items() if step > 20}
  passed, lines = compare_losses(twice, second, after=20, names=('before', 'after'))
  assert (
    passed and lines[0] == '| step | before loss | after loss |' and '2 logged steps' in lines[-1]
  )
  second[40] = 2.01
  assert not compare_losses(twice, second, after=20)[0]
  assert split_runs(_metrics(tmp_path / 'one.jsonl', [(10, 3.0), (20, 2.0)])) == [
    {10: 3.0, 20: 2.0}
  ]


def test_pack_cache_keeps_the_decisions_and_autotuning_first_then_small_executables(tmp_path):
  """Under the size cap: relpos's decisions and XLA's autotuning whatever their size, then
  JAX's executables smallest first; what does not fit is left out, and the tar unpacks to the
  cache folder's own layout."""
  cache = tmp_path / 'cache'
  (cache / 'xla_gpu_per_fusion_autotune_cache_dir').mkdir(parents=True)
  (cache / 'relpos-autotune.json').write_text('{}')
  (cache / 'xla_gpu_per_fusion_autotune_cache_dir' / 'fusion.textproto').write_bytes(b'a' * 600_000)
  (cache / 'jit_step-big-cache').write_bytes(b'b' * 600_000)
  (cache / 'jit_kernel-small-cache').write_bytes(b'c' * 1_000)
  out = tmp_path / 'out' / 'jax_cache.tar'
  assert main(['pack_cache', f'--cache={cache}', f'--out={out}', '--max_mib=1']) == 0
  with tarfile.open(out) as tar:
    names = tar.getnames()
  assert sorted(names) == [
    'jit_kernel-small-cache',
    'relpos-autotune.json',
    'xla_gpu_per_fusion_autotune_cache_dir/fusion.textproto',
  ]
  assert main(['pack_cache', f'--cache={tmp_path / "none"}', f'--out={out}']) == 0  # no cache
  with tarfile.open(out) as tar:
    assert tar.getnames() == []


def test_long_context_starts():
  from gpu_run import parse_starts

  assert parse_starts('xla:4096,pallas:65536') == {'xla': 4096, 'pallas': 65536}
  assert parse_starts('') == {}
  with pytest.raises(SystemExit, match='implementation:n pairs'):
    parse_starts('xla=4096')


def test_char_config_applies_the_overrides_it_is_given():
  """The overrides passed in count, not the process's own sys.argv (a caller's arguments): a
  process of its own, since the config flag is defined once per process."""
  code = (
    'import sys; from gpu_run import char_config; '
    "config = char_config('configs/enwik8_base.py', ['--config.model.dtype=bfloat16', "
    "'--config.train.mem_len=64']); print(config.model.dtype, config.train.mem_len)"
  )
  result = subprocess.run(
    [sys.executable, '-c', code],
    cwd=ROOT,
    env={**os.environ, 'PYTHONPATH': str(ROOT / 'benchmarks')},
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.split() == ['bfloat16', '64']
