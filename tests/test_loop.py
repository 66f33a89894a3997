"""The one training loop, driven by a third task written here in a few lines (a linear
regression): the cadence, resume, the NaN stop and SIGTERM come from the loop alone."""

import dataclasses
import json
import os
import pathlib
import re
import shutil
import signal

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from relpos import flops as flops_lib
from relpos import signals
from relpos.config import checks, fields
from relpos.config.fields import field, section, subsection
from relpos.config.shared import EvalConfig, OptimConfig, RunFields, TrainConfig
from relpos.signals import PreemptedError
from relpos.training import finished_run, loop, restore, task_base, workdir_setup
from relpos.training import mesh as mesh_lib
from relpos.training import progress as loop_progress
from relpos.training import train_step as step_lib
from relpos.training.checkpoints import Checkpoints, finished_steps

_TRUE_WEIGHTS = np.array([[1.5], [-2.0], [0.5]], np.float32)


@section
class RegressionTrain(TrainConfig):
  batch_size: int = field(32, checks.integer(1), 'rows per step')
  steps = 8
  log_every = 2
  eval_every = 4
  checkpoint_every = 4
  keep_checkpoints = 5


@section
class RegressionModel:
  d_model: int = field(3, checks.integer(1), 'features of x')


@section
class RegressionConfig(RunFields):
  """The task's config, declared as relpos's own tasks declare theirs."""

  task = 'regression'
  model: type = subsection(RegressionModel, 'the linear model')
  optim: type = subsection(OptimConfig, 'Adam')
  train: type = subsection(RegressionTrain, 'training')
  eval: type = subsection(EvalConfig, 'evaluation')


class Regression(task_base.Task):
  """y = x·w on random x; the metric is the mean squared error of held-out rows."""

  metric = 'mse'
  declaration = RegressionConfig

  def check_combinations(self, config, mesh):
    if mesh is not None:
      mesh_lib.check_rows(config.train.batch_size, mesh, 'config.train.batch_size')

  @staticmethod
  def _rows(step: int, batch_size: int):
    x = np.random.default_rng(step).standard_normal((batch_size, 3)).astype(np.float32)
    return x, x @ _TRUE_WEIGHTS

  def _model(self, config):
    return nnx.Linear(3, 1, rngs=nnx.Rngs(config.seed))

  def training(self, config, workdir, mesh):
    graphdef, state = step_lib.init_state(self._model(config), config, mesh)

    def loss_fn(model, batch, carry):
      x, y = batch
      squared = jnp.sum((model(x) - y) ** 2, axis=-1)
      sums = {'loss': jnp.sum(squared), 'tokens': jnp.asarray(x.shape[0])}
      return sums['loss'], (sums, carry)

    train_step = step_lib.train_step_fn(graphdef, loss_fn, mesh)

    def batch(step):
      return mesh_lib.global_batch(self._rows(step, config.train.batch_size), mesh)

    def validate(model, step):
      return {'valid/mse': self._mse(model)}

    return task_base.Training(
      graphdef, state, train_step, batch, validate, step_flops=self.step_flops
    )

  step_flops = None  # a test sets it: the model FLOPs of a step on a batch

  def _mse(self, model) -> float:
    x, y = self._rows(10**6, 64)
    return float(jnp.mean((model(x) - y) ** 2))

  def score(self, config, workdir, output_dir=None):
    del output_dir  # it writes no files besides eval_results.json
    model, steps, _ = restore.restore_model(self._model(config), config.eval, workdir)
    return {'mse': self._mse(model), 'step': steps[-1]}

  def result_lines(self, result):
    return [f'mse={result["mse"]:.4f}']


TASK = Regression()


def _config(steps=8):
  config = fields.config_dict(RegressionConfig)
  config.optim.update(schedule='constant', learning_rate=0.2, clip_norm=0.0)
  config.train.steps = steps
  return config


def _records(workdir):
  return [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]


def test_a_new_task_trains_validates_checkpoints_and_evaluates(tmp_path, capsys):
  workdir = tmp_path / 'run'
  result = TASK.train_and_evaluate(_config(), workdir)
  records = _records(workdir)
  losses = {r['step']: r['train/loss'] for r in records if 'train/loss' in r}
  assert sorted(losses) == [2, 4, 6, 8] and losses[8] < losses[2]
  assert [r['step'] for r in records if 'valid/mse' in r] == [4, 8]  # the last step's too
  assert all('train/tok_per_s' in r for r in records if 'train/loss' in r)
  assert sorted(p.name for p in (workdir / 'checkpoints').iterdir()) == ['4', '8']
  assert result['step'] == 8 and result['mse'] < losses[2]
  assert 'step 8/8 | loss ' in capsys.readouterr().out
  assert (workdir / 'config.json').exists()


def test_a_rerun_of_a_finished_run_keeps_its_result(tmp_path, capsys, monkeypatch):
  """train.py rerun in the workdir of a finished, scored run re-read all its data (minutes of
  re-encoding a 1M-pair corpus) and scored it again, to the same score. Now it reads nothing:
  one line says the run is finished and its eval_results.json kept (and the eval.py command
  that scores it again), and the kept result is returned for the launcher's lines, its
  eval_results.json read once (the test of the run read it, then the kept result read it
  again). A config whose result that is not (other eval settings, more steps) trains or scores
  as before, and so does a run whose newest checkpoint is gone; a finished run whose result is
  stale is scored again after one line naming why (it was replaced without a word)."""
  workdir = tmp_path / 'run'
  result = TASK.train_and_evaluate(_config(), workdir)
  capsys.readouterr()
  stamp = (workdir / 'eval_results.json').stat().st_mtime_ns

  def refused(*args, **kwargs):
    raise AssertionError('a finished run was read or scored again')

  with monkeypatch.context() as patched:
    patched.setattr(TASK, 'training', refused)
    patched.setattr(TASK, 'score', refused)
    kept = TASK.train_and_evaluate(_config(), workdir, score_command='python eval.py X')
  assert kept['mse'] == result['mse'] and kept['step'] == 8
  assert capsys.readouterr().out == (
    f'the run in {workdir} is finished (step 8, this config) and scored: its '
    f'{workdir}/eval_results.json is kept, nothing is trained or scored again; '
    '`python eval.py X` scores it again\n'
  )
  assert (workdir / 'eval_results.json').stat().st_mtime_ns == stamp
  reads, read_text = [], pathlib.Path.read_text
  with monkeypatch.context() as patched:  # the decision reads its result and config once
    patched.setattr(
      pathlib.Path,
      'read_text',
      lambda path, *a, **k: reads.append(path.name) or read_text(path, *a, **k),
    )
    assert finished_run.kept_result(TASK, _config(), workdir, 'python eval.py X') == kept
  assert reads.count('eval_results.json') == reads.count('config.json') == 1
  capsys.readouterr()
  config = _config()
  config.eval.average_checkpoints = 2  # another evaluation: scored again, nothing trained
  TASK.train_and_evaluate(config, workdir)
  out = capsys.readouterr().out
  assert 'is finished' not in out
  assert out.splitlines()[0] == (  # why, in the words of the sweep's --collect_only warning
    f'the run in {workdir} is trained to step 8, but {workdir}/eval_results.json is not this '
    "config's result (scored with other config.eval fields (average_checkpoints)): scoring it "
    'again'
  )
  assert json.loads((workdir / 'eval_results.json').read_text())['eval']['average_checkpoints'] == 2
  shutil.rmtree(workdir / 'checkpoints' / '8')  # training not done: it trains to step 8 again
  TASK.train_and_evaluate(config, workdir)
  out = capsys.readouterr().out
  assert 'is finished' not in out and f'resumed from {workdir.resolve()}/checkpoints/4' in out
  TASK.train_and_evaluate(_config(steps=12), workdir, allow_config_change=True)
  assert 'step 12/12' in capsys.readouterr().out


def test_a_finished_run_continued_with_training_fields_changed_says_nothing_trains(
  tmp_path, capsys
):
  """train.py --allow_config_change with optim.learning_rate changed, on a run already at
  config.train.steps, 'resumed' at its last step, trained nothing, recorded the new config as
  the run's and scored again; a later rerun called the run finished 'with this config', though
  no step used it. Now one warning names the fields only training reads that nothing trains
  with, and how to train with them; changes an evaluation reads (config.eval), or more steps,
  are used, and no warning comes."""
  workdir = tmp_path / 'run'
  TASK.train_and_evaluate(_config(), workdir)
  capsys.readouterr()
  changed = _config()
  changed.optim.learning_rate = 0.1
  changed.train.log_every = 4
  changed.eval.average_checkpoints = 2
  changed.seed = 5
  TASK.train_and_evaluate(changed, workdir, allow_config_change=True)
  warnings = [line for line in capsys.readouterr().err.splitlines() if 'nothing trains' in line]
  assert warnings == [
    f'warning: the run in {workdir} is finished at step 8 (config.train.steps): nothing trains '
    'with the changed fields only training reads (config.optim.learning_rate, config.seed, '
    "config.train.log_every), though config.json records them as the run's now; to train with "
    'them, raise config.train.steps (the run goes on from this step with them) or give another '
    '--workdir (a new run)'
  ]
  more = _config(steps=12)
  more.optim.learning_rate = 0.05
  TASK.train_and_evaluate(more, workdir, allow_config_change=True)
  out, err = capsys.readouterr()
  assert 'step 12/12' in out and 'nothing trains' not in err
  assert TASK.training_only('optim.learning_rate') and TASK.training_only('model.dropout')
  assert not TASK.training_only('train.steps') and not TASK.training_only('model.d_model')
  assert not TASK.training_only('eval.step') and TASK.training_only('seed')


def test_validation_ends_at_the_last_step_where_eval_every_does_not_divide_steps(tmp_path):
  """steps=10 with eval_every=4 validated at 4 and 8 only, though the field's help said "the
  last step included": the validation curve stopped short of the trained model."""
  config = _config(steps=10)
  config.train.update(checkpoint_every=0, log_every=5)
  TASK.train_model(config, tmp_path / 'run')
  assert [r['step'] for r in _records(tmp_path / 'run') if 'valid/mse' in r] == [4, 8, 10]


def test_the_last_step_is_saved_where_checkpoint_every_does_not_divide_steps(tmp_path):
  """steps=6 with checkpoint_every=4: saves at 4 and at the last step, which is the one scored
  (the trained model, not the one two steps short of it)."""
  workdir = tmp_path / 'run'
  result = TASK.train_and_evaluate(_config(steps=6), workdir)
  assert finished_steps(workdir) == [4, 6] and result['step'] == 6


def test_the_evaluation_plan_keeps_the_newest_checkpoints_as_the_run_does(tmp_path):
  """keep_checkpoints evicts the oldest saves: steps=12, a save every 4 and two kept leave 8 and
  12, and `check_evaluation_plan` says so before any training (config.eval.step=4 would have
  trained to the end and then found no checkpoint 4)."""
  config = _config(steps=12)
  config.train.update(keep_checkpoints=2, log_every=4)
  config.eval.step = 4
  with pytest.raises(ValueError, match=re.escape('the run will keep checkpoints [8, 12] (')):
    loop.check_evaluation_plan(config)
  config.eval.step = 0
  config.eval.average_checkpoints = 3
  with pytest.raises(ValueError, match=re.escape('keep 2 checkpoint(s) up to step 12 ([8, 12];')):
    loop.check_evaluation_plan(config)
  config.eval.update(step=8, average_checkpoints=1)
  loop.check_evaluation_plan(config)
  TASK.train_model(config, tmp_path / 'run')
  assert finished_steps(tmp_path / 'run') == [8, 12]


def test_a_step_follows_the_gradient_of_the_mean_loss_over_the_batch_s_tokens(tmp_path):
  """`train_step_fn` divides the summed loss's gradient by sums['tokens']: a batch of the same
  rows twice over is the same step. With Adam's eps far above the gradient, its first update is
  lr * g / (|g| + eps), near proportional to g (with the configs' eps it is about lr * sign(g),
  whatever g's scale), so the gradient of the summed loss moves the parameters about twice as
  far."""
  config = _config()
  config.optim.eps = 1e3
  mesh = mesh_lib.data_mesh(jax.devices()[:1])
  x, y = Regression._rows(0, 8)
  params = []
  for copies in (1, 2):
    run = TASK.training(config, tmp_path, mesh)  # the same initial parameters (config.seed)
    start = [np.asarray(leaf) for leaf in jax.tree.leaves(run.state['model'])]
    batch = mesh_lib.global_batch((np.tile(x, (copies, 1)), np.tile(y, (copies, 1))), mesh)
    state, sums = run.step(run.state, batch)
    assert int(sums['tokens']) == 8 * copies
    params.append([np.asarray(leaf) for leaf in jax.tree.leaves(state['model'])])
  moved = max(float(np.max(np.abs(a - b))) for a, b in zip(params[0], start, strict=True))
  assert moved > 1e-5  # the step did update the parameters
  for once, twice in zip(*params, strict=True):
    np.testing.assert_allclose(twice, once, rtol=0, atol=1e-3 * moved)


def test_the_progress_line_gives_mfu_where_the_devices_peak_is_known(tmp_path, capsys, monkeypatch):
  """With the task's FLOPs per step and a device peak (a GPU's data sheet; faked here, a CPU
  has none), each progress line and metrics.jsonl give the model FLOPs utilisation."""
  flops_per_step = 6.0 * 3 * 32  # 3 × (2 · rows · 3 features · 1 output)
  monkeypatch.setattr(Regression, 'step_flops', staticmethod(lambda batch: flops_per_step))
  monkeypatch.setattr(flops_lib, 'devices_peak', lambda devices, dtype: 1e6)
  TASK.train_and_evaluate(_config(), tmp_path / 'run')
  out = capsys.readouterr().out.splitlines()
  lines = [line for line in out if re.match(r'step \d+/', line)]
  assert len(lines) == 4 and all(' | MFU ' in line and '% | ETA ' in line for line in lines)
  assert re.match(r'step 1: [\d.]+ s, compiling the step and running it once$', out[0])
  records = [r for r in _records(tmp_path / 'run') if 'train/loss' in r]
  assert all(0 < r['train/mfu'] for r in records)
  for record in records:  # MFU = FLOPs per second / peak; tokens per second = 32 rows per step
    seconds_per_step = 32 / record['train/tok_per_s']
    assert record['train/mfu'] == pytest.approx(flops_per_step / seconds_per_step / 1e6, rel=1e-6)


def test_no_mfu_without_a_peak(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(Regression, 'step_flops', staticmethod(lambda batch: 1.0))
  TASK.train_and_evaluate(_config(), tmp_path / 'run')  # on a CPU: devices_peak is None
  assert 'MFU' not in capsys.readouterr().out
  assert not any('train/mfu' in r for r in _records(tmp_path / 'run'))


def test_resume_follows_the_uninterrupted_trajectory(tmp_path):
  straight, resumed = tmp_path / 'straight', tmp_path / 'resumed'
  TASK.train_and_evaluate(_config(), straight)
  TASK.train_and_evaluate(_config(), resumed)
  shutil.rmtree(resumed / 'checkpoints' / '8')
  (resumed / 'metrics.jsonl').unlink()
  TASK.train_and_evaluate(_config(), resumed)
  expected = {r['step']: r['train/loss'] for r in _records(straight) if 'train/loss' in r}
  again = {r['step']: r['train/loss'] for r in _records(resumed) if 'train/loss' in r}
  assert again == {6: expected[6], 8: expected[8]}


def test_a_resume_under_another_batch_plan_is_named_once():
  """`batch_plan_warning`: only a recorded plan that differs from this run's is named (another
  device count with the same rows is the same data order; an older checkpoint has no plan)."""
  plan = {'rows': [14, 6], 'processes': 1, 'batches_per_epoch': 20}
  saved = {'step': 4, 'devices': 2, 'batch_plan': plan}
  assert loop.batch_plan_warning(saved, {'devices': 4, 'batch_plan': dict(plan)}, 4) is None
  assert loop.batch_plan_warning({'step': 4}, {'devices': 1, 'batch_plan': plan}, 4) is None
  assert loop.batch_plan_warning(saved, {}, 4) is None
  other = {'rows': [15, 6], 'processes': 1, 'batches_per_epoch': 19}
  warning = loop.batch_plan_warning(saved, {'devices': 1, 'batch_plan': other}, 4)
  assert warning.startswith(
    'resumed from step 4 with batches planned otherwise than when it was saved (then 2 '
    'device(s) in 1 process(es): rows [14, 6], 20 batches per epoch; now 1 device(s) in 1 '
    'process(es): rows [15, 6], 19 batches per epoch): '
  )
  assert '\n' not in warning


def test_a_non_finite_loss_stops_the_run(tmp_path):
  config = _config()
  config.optim.learning_rate = 1e30
  with pytest.raises(FloatingPointError, match=r'loss is (nan|inf) at step \d'):
    TASK.train_and_evaluate(config, tmp_path / 'run')


def _signal_at_batch(monkeypatch, index: int, *signums: int) -> None:
  """Makes TASK's training send `signums` to this process as the loop asks for the batch of
  step `index` (0: the first step, not yet compiled: the start-up), one after the other."""
  training = TASK.training

  def training_then_signals(*args):
    run = training(*args)

    def batch(step):
      if step == index:
        for signum in signums:
          os.kill(os.getpid(), signum)
      return run.batch(step)

    return dataclasses.replace(run, batch=batch)

  monkeypatch.setattr(TASK, 'training', training_then_signals)


def test_sigterm_saves_the_reached_step_and_stops(tmp_path, monkeypatch):
  _signal_at_batch(monkeypatch, 1, signal.SIGTERM)  # as the second step starts
  with pytest.raises(PreemptedError, match=r'^SIGTERM at step 2: saved '):
    TASK.train_and_evaluate(_config(), tmp_path / 'run')
  assert [p.name for p in (tmp_path / 'run' / 'checkpoints').iterdir()] == ['2']


@pytest.mark.parametrize('presses', [1, 2])
def test_ctrl_c_saves_and_stops_and_a_second_stops_at_once(tmp_path, monkeypatch, capfd, presses):
  """Ctrl-C once: as SIGTERM (a checkpoint at the step reached, then stop), exit 130, with a
  line saying so as it is pressed. Twice: stop at once, one line naming the last good
  checkpoint (none here), exit 130 (`signals.stop_now`: its KeyboardInterrupt could land in a
  garbage-collection callback, which swallowed it: tests/test_preemption.py); the handlers
  are the test session's again after."""
  before = signal.getsignal(signal.SIGINT)
  _signal_at_batch(monkeypatch, 1, *[signal.SIGINT] * presses)
  left = _stopped_at_exit(monkeypatch, [])
  workdir = tmp_path / 'run'
  with pytest.raises((PreemptedError, _ExitError)) as caught:
    TASK.train_and_evaluate(_config(), workdir)
  err = capfd.readouterr().err
  assert 'Ctrl-C: saving a checkpoint after this step, then stopping' in err
  assert signal.getsignal(signal.SIGINT) is before
  if presses == 1:
    assert caught.value.exit_code == 130
    assert str(caught.value).startswith('Ctrl-C (SIGINT) at step 2: saved ')
    assert [p.name for p in (workdir / 'checkpoints').iterdir()] == ['2']
  else:
    assert caught.value.args == (130,) and left == {}
    assert err.splitlines()[-1] == (
      'error: stopped by Ctrl-C at step 1, without a save; no checkpoint was written yet; '
      'rerun the same command to start again'
    )


@pytest.mark.parametrize(
  ('signum', 'named'), [(signal.SIGTERM, 'SIGTERM'), (signal.SIGINT, 'Ctrl-C')]
)
@pytest.mark.parametrize('resumed', [False, True])
def test_a_signal_during_start_up_stops_at_once(
  tmp_path, monkeypatch, capfd, signum, named, resumed
):
  """SIGTERM or Ctrl-C while a run starts (here as its data is read; SentencePiece's training,
  compiling the first step) was taken as a request to save after the first step, minutes
  later at real data sizes, so a preemption's SIGKILL came first. Before the first step
  there is nothing to save: the run ends at once, one line naming what is kept, exit 128 +
  the signal's number, and no checkpoint written."""
  workdir = tmp_path / 'run'
  if resumed:
    TASK.train_model(_config(steps=4), workdir)
  before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
  training = TASK.training

  def training_then_signal(*args):
    os.kill(os.getpid(), signum)
    return training(*args)

  monkeypatch.setattr(TASK, 'training', training_then_signal)
  checkpoints = workdir / 'checkpoints'
  left = _stopped_at_exit(monkeypatch, [checkpoints / '4', checkpoints / '8'])
  with pytest.raises(_ExitError) as stopped:
    TASK.train_and_evaluate(_config(steps=8), workdir, allow_config_change=resumed)
  assert stopped.value.args == (128 + signum,)
  kept = (
    f'the last good checkpoint is {checkpoints.resolve()}/4 (step 4), intact; rerun the same '
    'command to resume'
    if resumed
    else 'no checkpoint was written yet; rerun the same command to start again'
  )
  assert capfd.readouterr().err.splitlines()[-1] == (
    f'error: stopped by {named} during start-up, before any step (nothing to save); {kept}'
  )
  assert left == {checkpoints / '4': resumed, checkpoints / '8': False}
  assert {s: signal.getsignal(s) for s in before} == before


def test_a_stop_signal_to_another_process_is_named_as_such():
  stopped = PreemptedError.saved(7, 'w/checkpoints/7')
  assert (str(stopped), stopped.exit_code) == (
    'SIGTERM or Ctrl-C to another process of the run at step 7: saved w/checkpoints/7; rerun '
    'the same command to resume',
    143,
  )


def test_checkpoints_hold_the_model_apart_from_the_optimizer(tmp_path):
  """Evaluation reads the 'model' item alone; the averaged model is the mean of the last N."""
  workdir = tmp_path / 'run'
  TASK.train_and_evaluate(_config(), workdir)
  items = sorted(p.name for p in (workdir / 'checkpoints' / '8').iterdir() if p.is_dir())
  assert {'model', 'optimizer', 'meta'} <= set(items)
  weights = {}
  for step, average in ((4, 1), (8, 1), (8, 2)):
    eval_config = ml_collections.ConfigDict({'step': step, 'average_checkpoints': average})
    model, steps, _ = restore.restore_model(TASK._model(_config()), eval_config, workdir)
    weights[step, average] = np.asarray(model.kernel[...])
    assert steps == ([4, 8] if average == 2 else [step])
  np.testing.assert_allclose(weights[8, 2], (weights[4, 1] + weights[8, 1]) / 2, rtol=1e-6)
  assert not np.allclose(weights[4, 1], weights[8, 1])
  assert jax.tree.leaves(weights)


def test_a_checkpoint_evaluation_cannot_use_is_one_line_naming_it(tmp_path):
  """config.eval.step at a damaged checkpoint, or averaging over one, names it and the cause;
  averaging more checkpoints than there are names the field and what to set."""
  workdir = tmp_path / 'run'
  TASK.train_model(_config(), workdir)  # checkpoints 4 and 8
  for path in (workdir / 'checkpoints' / '4' / 'model').rglob('*'):
    if path.is_file():
      path.write_bytes(b'')  # the arrays are too small for data files of their own
  model = TASK._model(_config())
  for step, average, asked in (
    (4, 1, 'config.eval.step'),
    (8, 2, 'config.eval.average_checkpoints (or config.eval.step)'),
  ):
    eval_config = ml_collections.ConfigDict({'step': step, 'average_checkpoints': average})
    with pytest.raises(ValueError, match=f'^checkpoint {workdir}/checkpoints/4 is unreadable: '):
      restore.restore_model(model, eval_config, workdir)
    with pytest.raises(ValueError) as caught:
      restore.restore_model(model, eval_config, workdir)
    assert str(caught.value).endswith(
      f'its files are damaged: restore them from a copy, or set {asked} to leave it out '
      '(other checkpoints: [8])'
    )
  eval_config = ml_collections.ConfigDict({'step': 0, 'average_checkpoints': 3})
  with pytest.raises(ValueError) as caught:
    restore.restore_model(model, eval_config, workdir)
  assert str(caught.value) == (
    f'config.eval.average_checkpoints=3: {workdir}/checkpoints holds 2 checkpoint(s) up to '
    'step 8 ([4, 8]): set it to 2 or less'
  )


def _diverging_from(step: int, monkeypatch):
  """Makes TASK's run diverge at `step`: from its update on, the parameters and losses are
  NaN."""
  training = TASK.training

  def diverging(*args):
    run = training(*args)
    real_step = run.step

    def step_fn(state, batch):
      state, sums = real_step(state, batch)
      if int(state['optimizer']['step'][...]) >= step:
        state = {**state, 'model': jax.tree.map(lambda x: x * jnp.nan, state['model'])}
        sums = {**sums, 'loss': sums['loss'] * jnp.nan}
      return state, sums

    return dataclasses.replace(run, step=step_fn)

  monkeypatch.setattr(TASK, 'training', diverging)


def test_a_diverged_state_is_never_saved_and_the_error_names_the_last_good_one(
  tmp_path, monkeypatch
):
  """The loss is checked at each progress line and before each save (checkpoints in between
  would hold NaN), and the error names the last good checkpoint."""
  config = _config()
  config.train.update(log_every=8, checkpoint_every=2, eval_every=0)
  _diverging_from(5, monkeypatch)
  workdir = tmp_path / 'run'
  with pytest.raises(FloatingPointError) as caught:
    TASK.train_model(config, workdir)
  assert str(caught.value).startswith(
    f'loss is nan at step 6: the run diverged; the last good checkpoint is '
    f'{workdir}/checkpoints/4 (step 4), intact; a lower config.optim.learning_rate'
  ), caught.value
  assert sorted(int(p.name) for p in (workdir / 'checkpoints').iterdir()) == [2, 4]


def test_evaluation_refuses_non_finite_parameters(tmp_path, monkeypatch):
  """A checkpoint of NaN parameters (as runs before the check at saves could write) is one
  error naming it, not a NaN metric."""
  workdir = tmp_path / 'run'
  TASK.train_model(_config(), workdir)
  checkpoints = Checkpoints(workdir, writer=True)
  _, state = nnx.split(TASK._model(_config()))
  nan = jax.tree.map(lambda x: x * jnp.nan, nnx.to_pure_dict(state))
  checkpoints.save(9, {'model': nan}, {'step': 9})
  checkpoints.close()
  with pytest.raises(FloatingPointError) as caught:
    TASK.evaluate(_config(), workdir)
  assert str(caught.value) == (
    f'checkpoint {workdir}/checkpoints/9 holds non-finite parameters (its run diverged): '
    'evaluate an earlier one, config.eval.step in [4, 8]'
  )


def test_evaluating_a_run_a_sweep_recorded_as_diverged_says_so(tmp_path, capsys):
  """eval.py on a sweep's diverged run scored its last finite checkpoint and overwrote the
  record of the divergence with no word."""
  workdir = tmp_path / 'run'
  TASK.train_model(_config(steps=4), workdir)
  record = {'mse': None, 'diverged_at_step': 8, 'diverged': 'loss is nan at step 8'}
  (workdir / 'eval_results.json').write_text(json.dumps(record))
  capsys.readouterr()
  for output_dir in (tmp_path / 'eval', None):  # the record in the workdir, then overwritten
    TASK.evaluate(_config(steps=8), workdir, output_dir=output_dir)
  assert (
    capsys.readouterr().err
    == (
      f'warning: the run in {workdir} diverged at step 8 ({workdir}/eval_results.json recorded '
      'it): this is the score of its last finite checkpoint, step 4\n'
    )
    * 2
  )
  TASK.evaluate(_config(steps=8), workdir)  # the record is gone: nothing left to say
  assert capsys.readouterr().err == ''


def test_evaluation_refuses_a_config_of_another_model(tmp_path):
  """eval.py with other config.model fields than the run trained: one error naming each, with
  both values; evaluation settings and how the model is computed may differ."""
  workdir = tmp_path / 'run'
  TASK.train_model(_config(), workdir)
  config = _config()
  config.eval.average_checkpoints = 2
  config.train.steps = 99  # not evaluation's concern
  assert TASK.evaluate(config, workdir, output_dir=tmp_path / 'averaged')['step'] == 8
  config.model.d_model = 4
  with pytest.raises(ValueError) as caught:
    TASK.evaluate(config, workdir)
  assert str(caught.value) == (
    f'--workdir={workdir} holds a run of another model than the config builds '
    f'(model.d_model: trained 3, given 4): give the config it was trained with '
    f'({workdir}/config.json records it, and eval.py without --config reads it)'
  )


def test_one_step_in_flight_on_a_multi_device_cpu_only():
  one_device = mesh_lib.data_mesh(jax.devices()[:1])
  assert not step_lib.one_step_in_flight(one_device)
  two_devices = type('Mesh', (), {'devices': np.empty(2, object)})()
  assert step_lib.one_step_in_flight(two_devices) == (jax.default_backend() == 'cpu')


def test_with_one_step_in_flight_each_step_waits_for_the_previous(tmp_path, monkeypatch):
  """The loop blocks on step N - 1's sums before it dispatches step N (not before the first
  step, nor after a log line, which has waited for every step already), and on a step's sums
  before validating after it (validation is off the training's clock)."""
  dispatched, waited = [], []
  monkeypatch.setattr(loop, 'one_step_in_flight', lambda mesh: True)
  real_wait = jax.block_until_ready
  monkeypatch.setattr(jax, 'block_until_ready', lambda x: waited.append(x) or real_wait(x))
  original = Regression.training

  def training(self, config, workdir, mesh):
    run = original(self, config, workdir, mesh)

    def step(state, batch):
      state, sums = run.step(state, batch)
      dispatched.append(sums)
      return state, sums

    return dataclasses.replace(run, step=step)

  monkeypatch.setattr(Regression, 'training', training)
  TASK.train_and_evaluate(_config(steps=8), tmp_path / 'run')
  # log_every=2: steps 1, 3, 5, 7 are waited for by the next dispatch, 2, 4, 6, 8 by the log,
  # and steps 4 and 8 by the validation after them (eval_every=4) too.
  assert len(dispatched) == 8
  waits = [any(w is d for w in waited) for d in dispatched]
  assert waits == [True, False, True, True, True, False, True, True]


def test_what_is_off_the_clock_stays_out_of_the_next_reports_rate(monkeypatch):
  """`Progress`: a step done with the clock stopped (a compile) and validation are left out of
  the report's tokens/s, MFU and ETA; the steps before and after them are in."""
  from relpos.training.progress import Progress

  # start; step 1 (5 s); stop; the compiling step 2 (30 s); start; steps 3, 4 (2 s); stop;
  # validation (10 s); start; step 5 (1 s); report.
  clock = iter([0.0, 5.0, 35.0, 37.0, 47.0, 48.0])
  monkeypatch.setattr(loop_progress.time, 'perf_counter', lambda: next(clock))
  progress = Progress(total_steps=13, peak_flops=100.0)
  progress.count(8.0)  # step 1
  progress.stop_clock()
  progress.exclude_step(10)  # step 2: its tokens; its FLOPs are not counted
  assert progress.start_clock() == 30.0
  progress.count(8.0)  # steps 3 to 5
  progress.count(8.0)
  progress.stop_clock()
  assert progress.start_clock() == 10.0  # validation
  progress.count(8.0)
  tokens_per_second, text = progress.report(5, tokens=50)  # 5 steps' tokens, 10 each
  assert tokens_per_second == 40 / 8  # 4 steps timed in 5 + 2 + 1 s
  assert progress.mfu == 32.0 / 8 / 100.0
  assert text.endswith('| ETA 0m16s')  # 2 s a step, 8 steps left


def test_checkpoint_saves_stay_out_of_the_rate_and_their_mean_goes_into_the_eta(monkeypatch):
  """`Progress`: a save is off the clock, as validation is, and the ETA adds the mean time of the
  saves timed so far for each save still to come (every 2 steps here, and the last step's)."""
  from relpos.training.progress import Progress

  assert Progress(10, checkpoint_every=5).saves_after(3) == 2  # at 5 and 10
  assert Progress(10).saves_after(3) == 1 and Progress(10).saves_after(10) == 0  # the last
  # start; steps 1, 2 (2 s); stop; save (6 s); start; steps 3, 4 (2 s); report.
  clock = iter([0.0, 2.0, 8.0, 10.0])
  monkeypatch.setattr(loop_progress.time, 'perf_counter', lambda: next(clock))
  progress = Progress(total_steps=11, checkpoint_every=2)
  progress.stop_clock()
  assert progress.start_clock(saved=True) == 6.0
  tokens_per_second, text = progress.report(4, tokens=40)
  assert tokens_per_second == 10.0  # 40 tokens in 4 s
  assert progress.saves_after(4) == 4  # at 6, 8, 10 and the last step, 11
  assert text.endswith('| ETA 0m31s')  # 7 steps of 1 s, 4 saves of 6 s


def test_the_loop_times_checkpoint_saves_off_the_clock(tmp_path, capsys, monkeypatch):
  """W12: with checkpoint_every=2 the progress line's tok/s fell from ~50k to ~1k, each save's
  time counted as training; it is off the clock now and in the ETA instead."""

  class Clock:
    now = 0.0

    def perf_counter(self):
      self.now += 0.001  # every reading: a millisecond
      return self.now

  clock = Clock()
  monkeypatch.setattr(loop_progress, 'time', clock)
  save = Checkpoints.save

  def slow_save(self, *args, **kwargs):
    clock.now += 1000.0  # a save of 1000 s
    return save(self, *args, **kwargs)

  monkeypatch.setattr(Checkpoints, 'save', slow_save)
  all_finite = restore.all_finite

  def slow_check(tree):  # the save's parameter check: its first call compiles
    clock.now += 1000.0
    return all_finite(tree)

  monkeypatch.setattr(loop, 'all_finite', slow_check)
  config = _config()
  config.train.update(checkpoint_every=2, eval_every=0)
  TASK.train_and_evaluate(config, tmp_path / 'run')
  rates = [r['train/tok_per_s'] for r in _records(tmp_path / 'run') if 'train/loss' in r]
  assert len(rates) == 4 and min(rates) > 32 * 2 / 1.0  # 2 steps of 32 rows within a second
  lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith('step 4/')]
  assert lines and lines[0].endswith('| ETA 1h06m')  # saves at 6 and 8, 2000 s each


def test_an_interval_of_only_excluded_steps_reports_them(monkeypatch):
  from relpos.training.progress import Progress

  clock = iter([0.0, 0.0, 4.0, 4.0])
  monkeypatch.setattr(loop_progress.time, 'perf_counter', lambda: next(clock))
  progress = Progress(total_steps=3)
  progress.stop_clock()
  progress.exclude_step(20)
  progress.start_clock()
  tokens_per_second, text = progress.report(1, tokens=20)
  assert tokens_per_second == 5.0 and text.endswith('| ETA 0m08s')


def test_a_step_compiled_for_a_new_batch_shape_is_timed_apart(tmp_path, capsys, monkeypatch):
  """Translation's length buckets compile the step again at each new batch shape: that step
  gets its own line too, and its interval stays out of the next report's rate."""
  rows = Regression._rows
  monkeypatch.setattr(
    Regression, '_rows', staticmethod(lambda step, size: rows(step, 16 if step >= 4 else size))
  )
  TASK.train_and_evaluate(_config(), tmp_path / 'run')
  out = capsys.readouterr().out.splitlines()
  compiles = [line for line in out if 'compiling' in line]
  assert len(compiles) == 2 and compiles[0].startswith('step 1: ')
  assert re.match(r'step 5: [\d.]+ s, compiling the step for batch shape \(16, 3\)', compiles[1])
  records = {r['step']: r for r in _records(tmp_path / 'run') if 'train/loss' in r}
  assert sorted(records) == [2, 4, 6, 8] and all(r['train/tok_per_s'] > 0 for r in records.values())


class _ExitError(BaseException):
  """What the test's os._exit raises, with the status the program would have exited with (a
  BaseException, as SystemExit: no `except Exception` of the code it unwinds takes it)."""


@pytest.mark.parametrize(
  ('signum', 'named'), [(signal.SIGTERM, 'SIGTERM'), (signal.SIGINT, 'Ctrl-C')]
)
def test_a_signal_during_the_final_evaluation_says_the_run_is_trained_but_not_scored(
  tmp_path, monkeypatch, capfd, signum, named
):
  """SIGTERM while train.py scored its run ended it with status 143 and no line at all (Ctrl-C:
  'error: stopped by Ctrl-C'), leaving no eval_results.json. Now one line says that the run is
  trained, its last checkpoint, and the command that scores it; the handlers are the test
  session's again after."""
  before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
  evaluate = TASK.evaluate

  def signalled_evaluate(*args, **kwargs):
    os.kill(os.getpid(), signum)  # as if sent while scoring
    return evaluate(*args, **kwargs)

  def exit_now(status):
    raise _ExitError(status)

  monkeypatch.setattr(TASK, 'evaluate', signalled_evaluate)
  monkeypatch.setattr(os, '_exit', exit_now)
  workdir = tmp_path / 'run'
  with pytest.raises(_ExitError) as stopped:
    TASK.train_and_evaluate(_config(), workdir, score_command='python eval.py --workdir=W')
  assert stopped.value.args == (128 + signum,)
  steps = _config().train.steps
  assert capfd.readouterr().err.splitlines()[-1] == (
    f'error: stopped by {named} during the final evaluation: training finished and saved its '
    f'last checkpoint, {workdir}/checkpoints/{steps} (step {steps}), but the run is not scored: '
    'score it with `python eval.py --workdir=W`'
  )
  assert not (workdir / 'eval_results.json').exists()
  assert {s: signal.getsignal(s) for s in before} == before


def _stopped_at_exit(monkeypatch, watched):
  """Makes os._exit raise `_ExitError` (with the status) instead of ending the test session,
  after noting whether each of `watched` exists at that moment: what the program, which
  `signals.stop_at_signals` ends at once, leaves on disk (`evaluate`'s own clean-up of a
  refusal runs only as the test's error unwinds it, after)."""
  left = {}

  def exit_now(status):
    left.update({path: path.exists() for path in watched})
    raise _ExitError(status)

  monkeypatch.setattr(os, '_exit', exit_now)
  return left


def test_a_signal_as_eval_results_json_lands_says_it_is_written(tmp_path, monkeypatch, capfd):
  """SIGTERM in the instant after eval.py renamed eval_results.json into place said 'no
  eval_results.json', of a file written whole. The line is told from the disk when the signal
  comes (`workdir_setup.stopped_evaluation`): the results are written, and where."""
  workdir, output_dir = tmp_path / 'run', tmp_path / 'scores'
  TASK.train_model(_config(), workdir)
  write = task_base.write_atomically

  def written_then_stopped(path, content):
    write(path, content)
    os.kill(os.getpid(), signal.SIGTERM)  # the notice right after the rename
    signal.pthread_sigmask(signal.SIG_BLOCK, [])  # a bytecode boundary for the handler

  monkeypatch.setattr(task_base, 'write_atomically', written_then_stopped)
  left = _stopped_at_exit(monkeypatch, [output_dir / 'eval_results.json'])
  capfd.readouterr()
  with pytest.raises(_ExitError) as stopped:
    with signals.stop_at_signals(workdir_setup.stopped_evaluation(output_dir)):
      TASK.evaluate(_config(), workdir, output_dir=output_dir)
  assert stopped.value.args == (143,)
  assert capfd.readouterr().err.splitlines()[-1] == (
    f'error: stopped by SIGTERM after eval.py wrote its results, {output_dir}/eval_results.json, '
    'whole: the run is scored; that file holds what eval.py would have printed'
  )
  assert left == {output_dir / 'eval_results.json': True}
  assert json.loads((output_dir / 'eval_results.json').read_text())['step'] == 8


@pytest.mark.parametrize('output_dir_before', ['missing', 'empty', 'scored'])
def test_a_signal_before_eval_py_writes_leaves_no_output_dir_it_made(
  tmp_path, monkeypatch, capfd, output_dir_before
):
  """eval.py stopped by SIGTERM while it scored left the --output_dir it had made, empty (a
  refused evaluation removes it: `leave_no_trace`). Now so does the signal; a directory that
  was there before stays, and an eval_results.json there from before is named as an earlier
  evaluation's, not as missing."""
  workdir, output_dir = tmp_path / 'run', tmp_path / 'new' / 'scores'
  TASK.train_model(_config(), workdir)
  if output_dir_before != 'missing':
    output_dir.mkdir(parents=True)
  if output_dir_before == 'scored':
    TASK.evaluate(_config(), workdir, output_dir=output_dir)
  score = TASK.score

  def stopped_while_scoring(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    signal.pthread_sigmask(signal.SIG_BLOCK, [])  # a bytecode boundary for the handler
    return score(*args, **kwargs)

  monkeypatch.setattr(TASK, 'score', stopped_while_scoring)
  left = _stopped_at_exit(monkeypatch, [output_dir, output_dir.parent])
  capfd.readouterr()
  with pytest.raises(_ExitError) as stopped:
    with signals.stop_at_signals(workdir_setup.stopped_evaluation(output_dir)):
      TASK.evaluate(_config(), workdir, output_dir=output_dir)
  assert stopped.value.args == (143,)
  there = {
    'missing': 'no eval_results.json',
    'empty': 'no eval_results.json',
    'scored': "the eval_results.json there is an earlier evaluation's",
  }[output_dir_before]
  assert capfd.readouterr().err.splitlines()[-1] == (
    f'error: stopped by SIGTERM before eval.py wrote its results ({there}): the run is '
    'unchanged; rerun the same command to score it'
  )
  kept = output_dir_before != 'missing'
  assert left == {output_dir: kept, output_dir.parent: kept}
