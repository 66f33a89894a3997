"""Translation resume after a real SIGKILL: the rerun continues the uninterrupted run exactly.

The character LM's counterpart is in test_preemption.py. Here `train.py` trains a tiny
translation Transformer three times with one command: straight through, killed with SIGKILL
once it has written a checkpoint mid-run, and again in the killed run's workdir. The rerun must
resume from a checkpoint (not start over) and log the straight run's train loss at every step,
bit for bit; its final checkpoint, translations and BLEU must equal the straight run's. The
straight run trains beside the killed one and its rerun, which keeps the test short.
"""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from helpers import write_pair_corpus

REPO = Path(__file__).resolve().parent.parent
STEPS, CHECKPOINT_EVERY = 30, 10
# The kill comes once a checkpoint is finished and this step is logged, early enough that the
# run is still training when the poll sees it (steps take milliseconds).
KILL_AFTER = 13


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
  return write_pair_corpus(tmp_path_factory.mktemp('corpus'))


def _train_command(corpus, workdir):
  return [
    sys.executable,
    'train.py',
    '--config=configs/translate_tiny.py:shaw',
    f'--workdir={workdir}',
    f'--config.data.train_src={corpus / "train.en"}',
    f'--config.data.train_tgt={corpus / "train.de"}',
    f'--config.data.eval_src={corpus / "eval.en"}',
    f'--config.data.eval_tgt={corpus / "eval.de"}',
    '--config.data.moses_detokenize=False',
    '--config.data.max_eval_examples=4',
    '--config.data.vocab_size=40',
    '--config.data.max_length=16',
    '--config.data.max_tokens=256',
    '--config.data.length_buckets=1',  # one batch shape: one train-step compile per run
    '--config.model.encoder_layers=1',
    '--config.model.decoder_layers=1',
    '--config.model.d_model=32',
    '--config.model.num_heads=2',
    '--config.model.d_ff=64',
    '--config.model.max_relative_position=3',
    '--config.optim.warmup_steps=5',
    f'--config.train.steps={STEPS}',
    '--config.train.log_every=1',
    '--config.train.eval_every=0',
    f'--config.train.checkpoint_every={CHECKPOINT_EVERY}',
    '--config.eval.beam_size=2',
    '--config.eval.batch_size=4',
    '--config.eval.max_decode_extra=4',
  ]


def _records(workdir) -> list[dict]:
  """metrics.jsonl's train records in order; a line cut by the kill is skipped."""
  path = workdir / 'metrics.jsonl'
  records = []
  for line in path.read_text().splitlines() if path.exists() else []:
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      continue
    if 'train/loss' in record:
      records.append(record)
  return records


def _last_step(workdir) -> int:
  return max((record['step'] for record in _records(workdir)), default=0)


def _checkpoint_steps(workdir) -> list[int]:
  """Finished checkpoints (orbax renames a checkpoint to its step once it is complete)."""
  directory = workdir / 'checkpoints'
  if not directory.exists():
    return []
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _checkpoint_arrays(checkpoint: Path) -> dict:
  """Every array of every pytree item of a checkpoint, by item and path (PRNG keys as data),
  read onto this process's first device whatever devices saved it (train.py's default CPU
  devices are not this test process's)."""
  arrays = {}
  checkpointer = ocp.StandardCheckpointer()
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  for item in sorted(p for p in checkpoint.iterdir() if (p / '_METADATA').exists()):
    stored = checkpointer.metadata(item).item_metadata.tree
    like = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), stored)
    tree = checkpointer.restore(item, like)
    for path, leaf in jax.tree.leaves_with_path(tree):
      if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
      arrays[item.name, jax.tree_util.keystr(path)] = np.asarray(leaf)
  return arrays


def _results(workdir) -> dict:
  """eval_results.json with the workdir's own path taken out, and the translation files."""
  text = (workdir / 'eval_results.json').read_text()
  for prefix in {str(workdir.resolve()), str(workdir)}:
    text = text.replace(prefix, '<workdir>')
  translations = {p.name: p.read_text() for p in workdir.glob('translations*.txt')}
  assert translations, f'no translations in {workdir}'
  return {'eval_results': json.loads(text), 'translations': translations}


def _start(corpus, workdir: Path) -> subprocess.Popen:
  """train.py on `workdir`, its output going to `workdir`.log."""
  with open(workdir.with_suffix('.log'), 'a') as log:
    return subprocess.Popen(
      _train_command(corpus, workdir), cwd=REPO, stdout=log, stderr=subprocess.STDOUT
    )


def _output(workdir: Path) -> str:
  return workdir.with_suffix('.log').read_text()


def _finish(process: subprocess.Popen, workdir: Path, timeout=300) -> str:
  """The last output line of a run that must succeed."""
  try:
    process.wait(timeout=timeout)
  finally:
    if process.poll() is None:
      process.kill()
  assert process.returncode == 0, _output(workdir)[-3000:]
  return _output(workdir).strip().splitlines()[-1]


@pytest.mark.slow
def test_sigkill_then_rerun_continues_the_same_translation_run(corpus, tmp_path):
  straight, killed = tmp_path / 'straight', tmp_path / 'killed'
  straight_run = _start(corpus, straight)
  try:
    process = _start(corpus, killed)
    try:
      deadline = time.monotonic() + 240
      while not _checkpoint_steps(killed) or _last_step(killed) < KILL_AFTER:
        assert process.poll() is None, 'ended before the kill:\n' + _output(killed)[-3000:]
        assert time.monotonic() < deadline, f'no checkpoint and step {KILL_AFTER} in 240 s'
        time.sleep(0.02)
    finally:
      process.send_signal(signal.SIGKILL)
      process.wait()
    assert process.returncode == -signal.SIGKILL
    logged_before_kill, killed_at = len(_records(killed)), _last_step(killed)
    newest_checkpoint = _checkpoint_steps(killed)[-1]
    assert killed_at < STEPS, 'the poll saw the run only after its training had ended'
    rerun_last_line = _finish(_start(corpus, killed), killed)
    straight_last_line = _finish(straight_run, straight)
  finally:
    if straight_run.poll() is None:
      straight_run.kill()
      straight_run.wait()

  rerun_steps = [r['step'] for r in _records(killed)[logged_before_kill:]]
  resumed_from = rerun_steps[0] - 1
  assert resumed_from == newest_checkpoint, 'did not resume from the newest finished checkpoint'
  assert rerun_steps == list(range(resumed_from + 1, STEPS + 1))
  expected = {r['step']: r['train/loss'] for r in _records(straight)}
  resumed = {r['step']: r['train/loss'] for r in _records(killed)}  # the rerun's, where both
  assert sorted(expected) == sorted(resumed) == list(range(1, STEPS + 1))
  assert resumed == expected, 'the loss trajectory changed after the SIGKILL'

  # The same final model: every array of the last checkpoint, and what evaluation made of it.
  assert _checkpoint_steps(straight)[-1] == _checkpoint_steps(killed)[-1] == STEPS
  final = Path('checkpoints') / str(STEPS)
  want, got = _checkpoint_arrays(straight / final), _checkpoint_arrays(killed / final)
  assert want and sorted(want) == sorted(got)
  for name, array in want.items():
    np.testing.assert_array_equal(got[name], array, err_msg=str(name))
  assert _results(killed) == _results(straight)
  assert rerun_last_line == straight_last_line and rerun_last_line.startswith('bleu=')
