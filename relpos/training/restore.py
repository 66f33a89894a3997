"""The trained model of a workdir, restored for evaluation and the tools that read a run.

A checkpoint holds the items 'model' (parameters and RNG state), 'optimizer' and the task's
carried state (the char LM's memory), so evaluation restores the model alone (`restore_model`)
and never builds an optimizer. `check_trained` is the check every reader makes first: that the
workdir holds a checkpoint, or what to do where it holds none yet.

No checkpoint a run writes holds non-finite parameters (the loop checks each save with
`all_finite`); a checkpoint of a diverged run from before that check is refused here, by the
same function, naming an earlier one.
"""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from relpos.models.multihead_attention import clip_shaw_tables
from relpos.training import mesh as mesh_lib
from relpos.training import workdir_lock
from relpos.training.checkpoints import (
  CHECKPOINTS,
  VANISHED_CHECKPOINT_TRIES,
  Checkpoints,
  UnreadableCheckpointError,
  VanishedCheckpointError,
  finished_steps,
  steps_text,
)
from relpos.training.metric_writer import METRICS_FILE, TRAINING_LOSS
from relpos.training.run_config import check_not_a_file, has_run, not_a_run, read_config
from relpos.training.run_results import DIVERGED, RESULTS_FILE, foreign_checkpoint, results_in


def check_trained(workdir) -> Checkpoints:
  """The workdir's checkpoints, opened as a reader (nothing in the workdir is made or
  changed); FileNotFoundError if the workdir is no directory or holds no checkpoint
  (evaluation and the tools check this before reading anything else), or a
  `WorkdirInUseError` (exit 75: try again later) where a run trains there now and has saved
  none yet (`workdir_lock.holder`), which named the remedy "train first"."""
  workdir = Path(workdir)
  check_not_a_file(workdir)
  if (workdir / CHECKPOINTS).exists() and not (workdir / CHECKPOINTS).is_dir():
    raise FileNotFoundError(f"{workdir / CHECKPOINTS} is a file, not the run's checkpoints")
  checkpoints = Checkpoints(workdir)
  if checkpoints.latest_step() is None:
    checkpoints.close()
    # A sweep's root or an evaluation's directory is named as such: "train first" there
    # would mix a run into it.
    if not_run := not has_run(workdir) and not_a_run(workdir, f'--workdir={workdir}'):
      raise FileNotFoundError(not_run)
    if training := workdir_lock.holder(workdir):  # "train first" while it does: wrong
      raise workdir_lock.WorkdirInUseError(
        f'--workdir={workdir} has no checkpoint yet: {training} trains there now (it holds '
        f'{workdir / workdir_lock.LOCK_FILE}); {_first_checkpoint(workdir)}: try again then'
      )
    if gone := checkpoints_gone(workdir):
      raise FileNotFoundError(gone)
    raise FileNotFoundError(
      f'no checkpoint in {checkpoints.directory}: train first (python train.py '
      f'--config=... --workdir={workdir})'
    )
  return checkpoints


def checkpoints_gone(workdir) -> str | None:
  """The line that says a run in `workdir` was trained but its checkpoints are gone (its
  checkpoints/ deleted to save disk, say), and what to do; None where it holds a finished
  checkpoint, or records no trained run. A trained run is one whose eval_results.json (its
  own: not scored from another workdir's checkpoint, `foreign_checkpoint`) names the step it
  was scored at, or that a sweep recorded as diverged at (`DIVERGED`): written only after
  training. Or, unscored (stopped, or killed while it scored), one whose recorded run logged a
  training step in metrics.jsonl and whose checkpoints/ folder is missing: a run makes that
  folder before it records its config, so a start killed before its first checkpoint leaves
  it, empty, and starts again as before. Such a run was trained again from step 0 in silence
  by train.py and a sweep (to score a new config.eval, its kept result then of another model
  than the new one's; its metrics.jsonl then held two runs), and eval.py said "train first".
  train.py (`loop.train`) and eval.py (`check_trained`) refuse it."""
  workdir = Path(workdir)
  if finished_steps(workdir):
    return None
  remedy = (
    f'restore them from a copy to use them, or remove {workdir} or give another --workdir to '
    'train it again'
  )
  results = results_in(workdir)
  if results is not None and not foreign_checkpoint(results, workdir, workdir):
    step = results.get(DIVERGED, results.get('step'))
    if isinstance(step, int) and not isinstance(step, bool) and step >= 1:
      return (
        f'the run in {workdir} was trained to step {step} ({workdir / RESULTS_FILE} records '
        f'it), but its checkpoints are gone ({workdir / CHECKPOINTS} holds none): {remedy}'
      )
  if has_run(workdir) and not (workdir / CHECKPOINTS).exists():
    logged = logged_training_step(workdir)
    if logged:
      return (
        f'the run in {workdir} trained to step {logged} at least ({workdir / METRICS_FILE} logs '
        f'it), but its checkpoints are gone ({workdir / CHECKPOINTS} is missing): {remedy}'
      )
  return None


def logged_training_step(workdir) -> int | None:
  """The last training step workdir/metrics.jsonl logs (a line with the training loss), or
  None: no such file, or no such line. Lines that do not parse (a killed run's last, cut) are
  skipped."""
  try:
    lines = (Path(workdir) / METRICS_FILE).read_text(errors='replace').splitlines()
  except OSError:
    return None
  steps = []
  for line in lines:
    try:
      record = json.loads(line)
    except ValueError:
      continue
    if not isinstance(record, dict) or TRAINING_LOSS not in record:
      continue
    step = record.get('step')
    if isinstance(step, int) and not isinstance(step, bool):
      steps.append(step)
  return max(steps, default=None)


def _first_checkpoint(workdir: Path) -> str:
  """When the run training in `workdir` now, which has saved none yet, saves its first
  checkpoint: at config.train.checkpoint_every, or at its last step where that comes first
  (`Checkpoints`' schedule), by the config it recorded; a run that has recorded none is still
  reading its data, before its first step."""
  try:
    train_config = read_config(workdir).train
  except (OSError, ValueError):  # none yet (or unreadable)
    return 'it has not started its first step, and saves its first checkpoint later'
  every, steps = train_config.checkpoint_every, train_config.steps
  first = min(every, steps) if every else steps
  return (
    f'its first checkpoint comes at step {first} (config.train.checkpoint_every={every}, '
    f'config.train.steps={steps})'
  )


def check_step(have: list[int], step: int, directory, field: str = 'config.eval.step') -> None:
  """Refuses checkpoint `step` (`field` gave it; 0: the newest) where `directory` holds only
  the steps `have`: FileNotFoundError naming the steps there are."""
  if step and step not in have:
    raise FileNotFoundError(
      f'{field}={step}: no such checkpoint in {directory} (have {steps_text(have)})'
    )


def steps_to_average(
  have: list[int],
  step: int,
  average: int,
  directory,
  field: str = 'config.eval.average_checkpoints',
) -> list[int]:
  """The last `average` of the steps `have` up to `step`: those an evaluation averages. Fewer
  there is a ValueError naming `field` (the config's, or a tool's flag) and what would do."""
  steps = [s for s in have if s <= step][-average:]
  if len(steps) < average:
    raise ValueError(
      f'{field}={average}: {directory} holds {len(steps)} checkpoint(s) up to step {step} '
      f'({steps_text(steps)}): set it to {len(steps)} or less'
    )
  return steps


def _read_checkpoints(checkpoints: Checkpoints, eval_config, like: dict):
  """(the steps there, the steps `restore_model` averages, their 'model' items shaped like
  `like`), read from `checkpoints` as they are listed now.

  Raises:
    VanishedCheckpointError: one was removed between the listing and its read.
  """
  have = checkpoints.all_steps()

  def restore(step: int, asked: str) -> dict:
    """The 'model' item of checkpoint `step`, which `asked` (the config field) names."""
    try:
      return checkpoints.restore(step, like)[0]['model']
    except VanishedCheckpointError:
      raise
    except UnreadableCheckpointError as error:
      others = [s for s in have if s != step]
      raise ValueError(
        f'{error}; its files are damaged: restore them from a copy, or set {asked} to '
        f'leave it out (other checkpoints: {others})'
      ) from None

  if eval_config.step:
    step = eval_config.step
    check_step(have, step, checkpoints.directory)
    newest = restore(step, 'config.eval.step')
  else:
    step, restored, _ = checkpoints.restore_latest(like)
    newest = restored['model']
  steps = steps_to_average(have, step, eval_config.average_checkpoints, checkpoints.directory)
  asked = 'config.eval.average_checkpoints (or config.eval.step)'
  return have, steps, [restore(s, asked) for s in steps[:-1]] + [newest]


def restore_model(model: nnx.Module, eval_config, workdir) -> tuple[nnx.Module, list[int], Path]:
  """(`model` with the checkpoint's parameters, the steps averaged, the checkpoint directory).

  The checkpoint is config.eval.step (0: the newest readable one); with
  config.eval.average_checkpoints = N > 1 the parameters are the mean of the last N
  checkpoints up to it. Only the 'model' item is read: evaluation needs no optimizer.
  With config.eval.max_relative_position = k' >= 0 (a field of relpos's own tasks,
  `relpos.config.shared`) the restored Shaw tables are clipped at k'
  (`relpos.models.multihead_attention.clip_shaw_tables`).

  Readers do not lock the workdir, so a run training there may evict a checkpoint (its
  keep_checkpoints) between the listing and the read: that checkpoint is not damaged, and the
  checkpoints are listed and read again, up to VANISHED_CHECKPOINT_TRIES times.

  Raises:
    FileNotFoundError: no checkpoint, or no checkpoint eval_config.step.
    ValueError: a checkpoint it needs is unreadable (`UnreadableCheckpointError`), or fewer
      than N checkpoints are there to average, or checkpoints vanished under every read.
    FloatingPointError: a checkpoint it needs holds non-finite parameters (a diverged run).
  """
  checkpoints = check_trained(workdir)
  try:
    graphdef, state = nnx.split(model)
    # Replicated like training's state, so every process of a run can read it back.
    state = mesh_lib.distribute(state, mesh_lib.replicated(mesh_lib.data_mesh()))
    like = {'model': nnx.to_pure_dict(state)}
    for attempt in range(1, VANISHED_CHECKPOINT_TRIES + 1):
      try:
        have, steps, trees = _read_checkpoints(checkpoints, eval_config, like)
        break
      except VanishedCheckpointError as vanished:  # the run training there evicted it
        if attempt == VANISHED_CHECKPOINT_TRIES:
          raise ValueError(
            f'{vanished}; the checkpoints changed under each of {attempt} reads: rerun once '
            'that run has ended, or with fewer config.eval.average_checkpoints'
          ) from None
        checkpoints.reload()
  finally:
    checkpoints.close()
  for at, tree in zip(steps, trees, strict=True):
    if not all_finite(tree):
      earlier = [s for s in have if s < at]
      raise FloatingPointError(
        f'checkpoint {checkpoints.directory / str(at)} holds non-finite parameters (its run '
        'diverged): '
        + (
          f'evaluate an earlier one, config.eval.step in {earlier}' if earlier else 'no earlier one'
        )
      )
  nnx.replace_by_pure_dict(state, trees[0] if len(trees) == 1 else _mean_of_trees(trees))
  model = nnx.merge(graphdef, mesh_lib.local_copy(state))
  clipped = eval_config.get('max_relative_position', -1)
  if clipped >= 0:
    clip_shaw_tables(model, clipped)
  return (
    model,
    steps,
    checkpoints.directory / str(steps[-1]),
  )


def all_finite(tree) -> bool:
  """Whether every float leaf of `tree` is finite: one jitted reduction over the leaves, one
  sync. (Op by op, each leaf shape compiled an isfinite and a reduction of its own: 18 small
  compiles at a tiny char model's first save.)"""
  floats = [leaf for leaf in jax.tree.leaves(tree) if _is_float(leaf)]
  return bool(_all_finite(floats)) if floats else True


@jax.jit
def _all_finite(leaves: list) -> jax.Array:
  return jnp.stack([jnp.isfinite(leaf).all() for leaf in leaves]).all()


def _is_float(leaf) -> bool:
  return jnp.issubdtype(leaf.dtype, jnp.floating)


@jax.jit
def _mean_of_trees(trees: list):
  """The leafwise mean of `trees` (checkpoints' 'model' items) for float leaves (parameters),
  the last tree's leaf for others (RNG keys and counts); jitted, one compile, where op by op
  every leaf shape compiled an add and a divide of its own."""
  return jax.tree.map(_mean_of_floats, *trees)


def _mean_of_floats(*leaves):
  """The mean of float leaves (parameters); the last of others (RNG keys and counts)."""
  if _is_float(leaves[-1]):
    return sum(leaves) / len(leaves)
  return leaves[-1]
