"""The one training loop of every task (`train`), and the checks train.py makes before it.

A task (`relpos.training.task_base.Task`) supplies a `Training`: the state, the jitted step, the
global batch of step s and a validation function. `train` owns the cadence around them, the
same for every task:

- the data mesh (`relpos.training.mesh`) and the config check, before any data is read;
- the run's config recorded in the workdir (a rerun with another config is refused);
- resume from the newest readable checkpoint (the step fixes the data position, so resumed
  runs follow the uninterrupted trajectory exactly);
- progress lines with throughput, MFU (where the devices' peak is known) and ETA,
  metrics.jsonl and TensorBoard;
- a stop on a non-finite loss (checked before each save too: no checkpoint holds one),
  periodic validation and checkpoints;
- SIGTERM, agreed across processes, which saves the reached step and stops, or, while a
  single-process run starts (nothing to save yet), stops it at once (`PreemptionSignal`);
- faults around the run (a full disk, a bad workdir or one of another task, a checkpoint that
  does not commit, XLA out of memory) as one line naming the step, the last good checkpoint
  and what to do (`train`, docs/faults.md);
- the final checkpoint, then the task's evaluation (`Task.evaluate`).
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import TYPE_CHECKING

import jax
import numpy as np
from flax import nnx

from relpos import flops as flops_lib
from relpos.config.model_fields import EVALUATION_FREE_FIELDS
from relpos.config.recorded import (
  changes_from_recorded,
  check_config_change,
  config_changes,
  record_config,
)
from relpos.faults import error_path, filesystem_fault, is_write_fault, rerun_remedy
from relpos.messages import warn
from relpos.signals import PreemptedError, PreemptionSignal
from relpos.training import data_record, finished_run, optim, workdir_lock
from relpos.training import mesh as mesh_lib
from relpos.training.checkpoints import Checkpoints, finished_steps, last_good_in, steps_text
from relpos.training.device_memory import (
  is_out_of_memory,
  out_of_memory_fault,
  step_memory_warning,
)
from relpos.training.metric_writer import TRAINING_LOSS, MetricWriter
from relpos.training.progress import Progress
from relpos.training.restore import all_finite, checkpoints_gone
from relpos.training.run_config import check_task, has_run, not_a_run, read_config
from relpos.training.train_step import eval_model, one_step_in_flight
from relpos.training.workdir_setup import (
  files_a_start_makes,
  leave_no_trace,
  prepare_workdir,
  remove_unrecorded,
)

if TYPE_CHECKING:
  from relpos.training.task_base import Task


def check_before_run(task: Task, config, mesh, workdir=None) -> None:
  """The checks train.py makes before a run trains: the config against its declaration and
  the devices of `mesh` (`Task.check_config`), then the evaluation that follows the training
  against the checkpoints the run will keep (`check_evaluation_plan`; `workdir` None: a fresh
  run's); then the schedule's warning (`warn_of_schedule`).
  `relpos.tools.show_config` runs these (on the devices of the machine it runs on), so that
  it refuses what train.py refuses before training."""
  task.check_config(config, mesh)
  check_evaluation_plan(config, workdir)
  warn_of_schedule(config, workdir)


def warn_of_schedule(config, workdir=None) -> None:
  """`optim.schedule_warning` as one `warning:` line, for a run that has not started in
  `workdir` (None: a fresh one), from process 0, once a process (a sweep's runs share the
  schedule: each would repeat the line)."""
  schedule_warning = optim.schedule_warning(config)
  fresh = workdir is None or not has_run(workdir)
  if schedule_warning and fresh and mesh_lib.is_writer():
    warn(schedule_warning, once=True)


def check_evaluation_plan(config, workdir=None) -> None:
  """ValueError naming the field when the checkpoints a run will keep (config.train's
  schedule: every checkpoint_every steps and the last, the newest keep_checkpoints of those and
  of the workdir's own) cannot give config.eval.step or config.eval.average_checkpoints: a run
  would train to the end and then fail to evaluate. `workdir` None: a fresh run's plan, with no
  checkpoints of its own."""
  train_config, eval_config = config.train, config.eval
  every, last = train_config.checkpoint_every, train_config.steps
  existing = set(finished_steps(workdir)) if workdir is not None else set()
  # A resumed run saves only past its newest checkpoint: the schedule's earlier steps are
  # there already, or were never saved, or evicted.
  first = max(existing, default=0) + 1
  planned = {step for step in range(every, last + 1, every) if step >= first} if every else set()
  planned |= {last} if last >= first else set()
  # Only a save evicts: a finished run re-run to evaluate keeps what it has.
  kept = (
    sorted(planned | existing)[-train_config.keep_checkpoints :] if planned else sorted(existing)
  )
  schedule = (
    f'config.train.checkpoint_every={every}, keep_checkpoints='
    f'{train_config.keep_checkpoints}, steps={last}'
  )
  step = eval_config.step or kept[-1]
  if step not in kept:
    raise ValueError(
      f'config.eval.step={step}: the run will keep checkpoints {steps_text(kept)} ({schedule}); '
      'give one of them, or 0 for the newest'
    )
  upto = [s for s in kept if s <= step]
  if eval_config.average_checkpoints > len(upto):
    raise ValueError(
      f'config.eval.average_checkpoints={eval_config.average_checkpoints}: the run will keep '
      f'{len(upto)} checkpoint(s) up to step {step} ({steps_text(upto)}; {schedule}); set it '
      f'to {len(upto)} or less, or keep more checkpoints'
    )


class DivergedError(FloatingPointError):
  """The run's loss or parameters became non-finite (a USER_ERRORS error: train.py prints it
  as one line). `what` says what, `step` where; a sweep records the run as diverged
  (`relpos.studies.sweep`) and goes on with the others."""

  def __init__(self, what: str, step: int, message: str):
    super().__init__(message)
    self.what, self.step = what, step


def train(task: Task, config, workdir, preemption: PreemptionSignal, *, allow_config_change):
  """Trains `task` for config.train.steps from the latest checkpoint in `workdir`.

  Faults around the run end it with a `RunFaultError` of one line (docs/faults.md): an
  OSError writing into the workdir (its config, vocabulary, metrics) is a
  `FilesystemFaultError`, as is a checkpoint that does not commit (`Checkpoints`), and XLA's
  out-of-memory is a `DeviceMemoryError` with the step's shapes and what would fit. Each names
  the step reached and the last good checkpoint. A workdir of another task is a
  `TaskMismatchError` before anything is written, and one where another run trains now a
  `WorkdirInUseError` (`workdir_lock`). A new run is refused (ValueError) in a directory that
  holds a sweep's root or only an evaluation (`run_config.not_a_run`); a run already there
  resumes; one whose checkpoints are gone since it was trained and scored is refused
  (`restore.checkpoints_gone`). A start that stops before its run is recorded removes the
  vocabulary it made (`remove_unrecorded`), and one that stops before writing anything the
  workdir it made (`leave_no_trace`). A signal while a single-process run starts, and a
  second Ctrl-C, end the process at once (`preemption`, `stopped_without_save`'s line),
  leaving what a killed start or run leaves.
  """
  workdir = Path(workdir)
  reached = {'step': 0, 'checkpoints': None}
  preemption.unsaved = lambda: stopped_without_save(workdir, reached['step'], preemption.starting)
  preemption.starting = jax.process_count() == 1  # multi-process: agreed after the first step
  check_task(workdir, config.get('task'))  # before anything else: the workdir's run
  not_a_new_run = not has_run(workdir) and not_a_run(workdir, f'--workdir={workdir}')
  if not_a_new_run:  # a sweep's root, an evaluation's directory: a run there would mix in
    raise ValueError(f'{not_a_new_run}; a new run needs a directory of its own')
  if gone := checkpoints_gone(workdir):  # trained and scored: not trained again in silence
    raise FileNotFoundError(gone)
  mesh = mesh_lib.data_mesh()
  task.check_config(config, mesh)  # before writing, reading data or compiling anything
  made = prepare_workdir(workdir, config.train.steps)

  def last_good() -> str:
    checkpoints = reached['checkpoints']
    return checkpoints.last_good() if checkpoints else last_good_in(workdir)

  lock = workdir_lock.hold(workdir) if mesh_lib.is_writer() else contextlib.nullcontext()
  try:
    with lock:  # one run at a time in a workdir
      made_files = files_a_start_makes(task, config, workdir)
      try:
        _train(task, config, workdir, mesh, preemption, allow_config_change, reached)
      except BaseException:  # a start refused before it wrote anything leaves no trace
        if mesh_lib.is_writer():  # (the others hold no lock: the writer's to remove)
          remove_unrecorded(workdir, made_files)
          leave_no_trace(workdir, made)
        raise
  except OSError as error:
    path = error_path(error)
    if not is_write_fault(error, workdir, path):
      raise  # not the workdir's: a data file, reported as it is
    raise filesystem_fault(
      error, f'cannot write {path or workdir} at step {reached["step"]}', last_good=last_good()
    ) from error
  except (jax.errors.JaxRuntimeError, ValueError, MemoryError) as error:
    if not is_out_of_memory(error):
      raise
    resumes = bool(finished_steps(workdir))
    raise out_of_memory_fault(
      config,
      reached['step'] + 1,
      last_good(),
      fixed=task.resume_shapes(config)[0] if resumes else (),
      resumes=resumes,
    ) from error


def _dotted(config, field: str):
  section, name = field.split('.')
  return config[section].get(name)


def _resumed_config(workdir: Path):
  """The config of the run a start in `workdir` would resume (one recorded, with
  checkpoints), None where there is none to resume or its config.json is damaged (that is
  `check_config_change`'s line to say)."""
  if not has_run(workdir) or not finished_steps(workdir):
    return None
  try:
    return read_config(workdir)
  except (OSError, ValueError):
    return None


def check_resume_shapes(task: Task, config, workdir: Path) -> None:
  """Refuses (ValueError) to resume the run in `workdir` with another shape of the state its
  checkpoints carry from step to step (`Task.resume_shapes`: the character LM's memory, by
  config.train.batch_size and mem_len), with or without --allow_config_change. Such a resume
  read intact checkpoints as unreadable, one by one, and then said none was readable; the
  line now names the field, the shape the checkpoints hold and what does fit: the same rows
  in parts (config.train.grad_accum_steps), or another --workdir. A workdir without a
  recorded run or checkpoints has nothing to resume; a damaged config.json is left to
  `check_config_change`'s line."""
  if (recorded := _resumed_config(workdir)) is None:
    return
  before, held = task.resume_shapes(recorded)
  fields = list(dict.fromkeys([*before, *task.resume_shapes(config)[0]]))
  changed = [field for field in fields if _dotted(recorded, field) != _dotted(config, field)]
  if not changed:
    return
  given = ', '.join(
    f'config.{field}={_dotted(config, field)} (the run has {_dotted(recorded, field)})'
    for field in changed
  )
  remedies = ['another --workdir trains with it from step 0']
  rows = _dotted(recorded, 'train.batch_size')
  if 'train.batch_size' in changed and rows and _dotted(config, 'train.batch_size') < rows:
    remedies.insert(
      0,
      f'--config.train.grad_accum_steps=N (with config.train.batch_size={rows}) runs the '
      "run's rows in N parts, in less memory (with --allow_config_change)",
    )
  raise ValueError(
    f'{given}: the checkpoints in {workdir / "checkpoints"} were saved with {held}, and a '
    f'resume restores them as saved: the run cannot go on with another '
    f'{" or ".join("config." + field for field in fields)}, not even '
    f'with --allow_config_change; {"; ".join(remedies)}'
  )


def check_same_parameters(task: Task, config, workdir: Path) -> None:
  """Refuses (ValueError) to resume the run in `workdir` with a config.model that has other
  parameters than its checkpoints hold (another position scheme, width, k, layer count),
  with or without --allow_config_change, naming the fields and the first parameter that
  differs. Such a resume was offered --allow_config_change, then read every intact
  checkpoint as unreadable, one by one, and said none was readable. A change of a field that
  leaves the parameters as they are (dropout, rope_base, pre_layer_norm) is
  `check_config_change`'s to allow; the fields of how the model is computed
  (`model_fields.EVALUATION_FREE_FIELDS`) are no model change (scan_layers' model holds the
  loop's parameters, layer by layer). The parameters are shapes (`nnx.eval_shape`): nothing
  is initialised."""
  if (recorded := _resumed_config(workdir)) is None:
    return
  free = dict.fromkeys(EVALUATION_FREE_FIELDS)
  changed = config_changes(
    recorded.model.to_dict() | free, config.model.to_dict() | free, 'config.model'
  )
  if not changed:
    return
  trained, wanted = _parameter_shapes(task, recorded), _parameter_shapes(task, config)
  if trained == wanted:
    return
  paths = sorted(set(trained) | set(wanted))
  first = next(path for path in paths if trained.get(path) != wanted.get(path))
  if first not in trained:
    differs = f'{first} is not in them'
  elif first not in wanted:
    differs = f'they hold {first}, which it lacks'
  else:
    differs = f'{first} is {list(wanted[first])} in it, {list(trained[first])} in them'
  raise ValueError(
    f'{"; ".join(changed)}: another model than the checkpoints in {workdir / "checkpoints"} '
    f'hold ({differs}), which not even --allow_config_change continues; use a new --workdir, '
    "or the run's own config.model"
  )


def _parameter_shapes(task: Task, config) -> dict[str, tuple[int, ...]]:
  """{'path.to.param': shape} of the model of `config`, abstract (built under eval_shape),
  over a vocabulary of any fixed size (the run's own is checked with its data)."""
  model = nnx.eval_shape(lambda: task.build_model(config, _ANY_VOCABULARY))
  leaves = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))[0]
  return {
    jax.tree_util.keystr(path, simple=True, separator='.').removesuffix('.value'): x.shape
    for path, x in leaves
  }


_ANY_VOCABULARY = 32


def untrained_changes(task: Task, config, workdir: Path, same_data, other_data) -> list[str]:
  """The changes --allow_config_change lets a finished run take (its newest checkpoint at
  config.train.steps) that no step will use: each field only training reads
  (`Task.training_only`: config.optim's, config.train's but steps, config.seed, the training
  files) that `config` changes from the run's recorded config, and each training file whose
  data changed
  since (`other_data`, `data_record.changes`' lines), as 'config.<field>'. Continued, such a
  run restored its last checkpoint, trained nothing, recorded the new config as the run's and
  scored again; a later rerun then called it finished 'with this config', though no step ever
  used it. Told once, as a warning (`_train`), while the config is still recorded as it was:
  a change of what the evaluation reads (config.eval, the eval files) is scored, and one of
  config.train.steps trains on."""
  changed = changes_from_recorded(config, workdir, same_data, change='{field}')
  files = [
    field
    for field in task.data_files(config, workdir)
    if any(line.startswith(f'{field}: ') for line in other_data)
  ]
  return [
    field
    for field in dict.fromkeys([*changed, *files])
    if task.training_only(field.removeprefix('config.'))
  ]


def stopped_without_save(workdir: Path, step: int, starting: bool) -> str:
  """What `error: stopped by <signal>` goes on with where a signal ends the run in `workdir`
  at once (`PreemptionSignal.unsaved`): during start-up (`starting`), or at `step` (a second
  Ctrl-C). Told from the checkpoints on disk as it comes, which are what a rerun resumes from:
  a save in flight is no checkpoint until orbax renames it into place, and the next run
  removes what it left (`Checkpoints`)."""
  last = last_good_in(workdir)
  if starting:
    where = 'during start-up, before any step (nothing to save)'
  else:
    where = f'at step {step}, without a save'
  return f' {where}; {last}; {rerun_remedy(last)}'


def _checked_data(task: Task, config, workdir: Path, allow_config_change) -> tuple:
  """(the run's data files, whether they are the recorded data, what changed in them) once the
  run in `workdir` may go on with `config`: the checks of a resume that come before any write
  or any data read. Raises ValueError naming what stops it."""
  data_files = task.data_files(config, workdir)
  # Another spelling of the run's data (its file, or its bytes) is no config change.
  same_data = data_record.same_data(workdir, data_files)
  # First: --allow_config_change cannot help there.
  check_same_parameters(task, config, workdir)
  check_resume_shapes(task, config, workdir)
  check_config_change(  # before any write
    config, workdir, allow_change=allow_config_change, same_data=same_data
  )
  # Not even with --allow_config_change: the checkpoints' ids are the recorded vocabulary's.
  data_record.check_vocabulary(workdir, data_files)
  other_data = data_record.changes(workdir, data_files)
  if other_data and not allow_config_change:
    # Finished: nothing would train; the data would be scored.
    if finished_run.trained_to_the_end(config, workdir):
      raise ValueError(
        f'{workdir} holds a run trained on other data ({"; ".join(other_data)}), finished at '
        f'step {config.train.steps} (config.train.steps): it trains no further, and '
        'would be scored on the data as it is now; pass --allow_config_change for that, score '
        'it with eval.py --output_dir=<another directory> (which warns of the data), or use a '
        'new --workdir to train on this data'
      )
    raise ValueError(
      f'{workdir} holds a run trained on other data ({"; ".join(other_data)}): resumed, it '
      'would read other text at its data position; use a new --workdir, or pass '
      '--allow_config_change to continue this run on the data as it is now'
    )
  if other_data:
    warn(f'continuing on other data than the run trained with ({"; ".join(other_data)})')
  return data_files, same_data, other_data


def _restored(checkpoints: Checkpoints, run, train_config, workdir: Path) -> tuple:
  """(the step the run goes on from, its state, whether a checkpoint was found): the latest
  checkpoint of `checkpoints`, or step 0 and `run`'s fresh state. Warns of a batch plan that
  changed since; raises ValueError for a run already past config.train.steps."""
  found = checkpoints.restore_latest(run.state)  # every item of the state, pure dicts
  if not found:
    return 0, run.state, False
  start_step, state, saved_meta = found
  plan_warning = batch_plan_warning(saved_meta, run.checkpoint_meta, start_step)
  if plan_warning and mesh_lib.is_writer():
    warn(plan_warning)
  if start_step > train_config.steps:  # a shortened run: its last save would be misnamed
    raise ValueError(
      f'config.train.steps={train_config.steps}: the run in {workdir} is already at step '
      f'{start_step} (checkpoints {checkpoints.all_steps()}); to score an earlier one, run '
      'eval.py with --config.eval.step=N, or give config.train.steps of at least '
      f'{start_step}'
    )
  print(f'resumed from {checkpoints.directory / str(start_step)}', flush=True)
  return start_step, state, True


def _record_run(task: Task, config, workdir: Path, data, finished: bool, allow_config_change):
  """Writes config.json and the data record (the writer process only), once the checkpoint took
  `config`, so config.json stays the run's; warns where a finished run's changed fields would
  train nothing. `data`: `_checked_data`'s triple."""
  data_files, same_data, other_data = data
  untrained = untrained_changes(task, config, workdir, same_data, other_data) if finished else []
  record_config(config, workdir, allow_change=allow_config_change, same_data=same_data)
  if untrained:
    warn(
      f'the run in {workdir} is finished at step {config.train.steps} (config.train.steps): '
      f'nothing trains with the changed fields only training reads ({", ".join(untrained)}), '
      "though config.json records them as the run's now; to train with them, raise "
      'config.train.steps (the run goes on from this step with them) or give another '
      '--workdir (a new run)'
    )
  read_as_lines = [f'config.data.{name}' for name in task.data_read_as_lines]
  data_record.record(workdir, data_files, read_as_lines)


def _train(task: Task, config, workdir: Path, mesh, preemption, allow_config_change, reached: dict):
  """`train`'s run over `mesh` (its config checked): the checks of a resume, the restore, then
  the step loop with its cadence of progress lines, validation and saves; `reached` keeps the
  step reached and the checkpoints, for its faults."""
  data = _checked_data(task, config, workdir, allow_config_change)
  run = task.training(config, workdir, mesh)
  warn_of_schedule(config, workdir)  # once its data loaded: not before a refusal for missing data
  train_config = config.train

  checkpoints = Checkpoints(workdir, keep=train_config.keep_checkpoints, writer=True)
  reached['checkpoints'] = checkpoints
  start_step, state, found = _restored(checkpoints, run, train_config, workdir)
  reached['step'] = start_step
  if mesh_lib.is_writer():
    finished = found and start_step == train_config.steps
    _record_run(task, config, workdir, data, finished, allow_config_change)

  writer = MetricWriter(workdir)
  dtype = config.model.get('dtype', 'float32')
  progress = Progress(
    train_config.steps,
    start_step,
    flops_lib.devices_peak(mesh.devices.flat, dtype),
    checkpoint_every=train_config.checkpoint_every,
  )
  interval_sums = []

  def diverged(what: str, step: int) -> DivergedError:
    """The error of a run that diverged, naming the last good checkpoint (`save` writes no
    other: each save is checked first; the one in flight, already checked, is committed so
    that it can be named)."""
    checkpoints.commit()
    return DivergedError(
      what,
      step,
      f'{what}: the run diverged; {checkpoints.last_good()}; a lower '
      'config.optim.learning_rate or a config.optim.clip_norm may help (--allow_config_change '
      'continues this run with them)',
    )

  def interval_totals(done: int) -> tuple[dict, float]:
    """(the sums of the steps since the last progress line, their mean loss), a device sync.

    Raises:
      DivergedError: the loss is not finite.
    """
    totals = jax.tree.map(lambda *xs: float(np.sum(xs)), *jax.device_get(interval_sums))
    loss = totals['loss'] / max(totals['tokens'], 1)
    if not math.isfinite(loss):
      raise diverged(f'loss is {loss} at step {done}', done)
    return totals, loss

  def save(step):
    """Saves the state reached at `step`, refusing a non-finite one: the losses since the last
    progress line (checked there only, so a save in between syncs for them) and the
    parameters (the update of the last step may be the first to overflow). Off the training's
    clock, as validation is: it stops once the step is done (the loss check waits for it), so
    the parameter check (its first call compiles) and the save itself are not counted."""
    if interval_sums:
      interval_totals(step)
    jax.block_until_ready(state['model'])  # done already, where the loss check waited
    progress.stop_clock()
    if not all_finite(state['model']):
      raise diverged(f'the parameters are not finite at step {step}', step)
    checkpoints.save(step, state, {'step': step, **run.checkpoint_meta})
    progress.start_clock(saved=True)

  def log(done):
    totals, loss = interval_totals(done)
    interval_sums.clear()
    tokens_per_second, speed = progress.report(done, int(totals['tokens']))
    scalars = {
      TRAINING_LOSS: loss,
      **task.train_scalars(totals),
      'train/tok_per_s': tokens_per_second,
      **({} if progress.mfu is None else {'train/mfu': progress.mfu}),
    }
    writer.write(done, scalars)
    extras = ''.join(
      f' | {name.split("/")[-1]} {value:.4f}'
      for name, value in scalars.items()
      if name not in (TRAINING_LOSS, 'train/tok_per_s', 'train/mfu')
    )
    print(f'step {done}/{train_config.steps} | loss {loss:.4f}{extras} | {speed}', flush=True)

  wait_for_previous = one_step_in_flight(mesh)
  if start_step < train_config.steps:
    warning = step_memory_warning(run.step, state, lambda: run.batch(start_step))
    if warning:
      warn(warning)
  batch_shapes = set()  # those the step has been compiled for in this process
  try:
    for step in range(start_step, train_config.steps):
      batch = run.batch(step)
      shape = tuple(np.shape(leaf) for leaf in jax.tree.leaves(batch))
      compiles = shape not in batch_shapes  # and, on a GPU, tunes 'auto' at new shapes
      batch_shapes.add(shape)
      if (wait_for_previous or compiles) and interval_sums:
        jax.block_until_ready(interval_sums[-1])
      if compiles:
        progress.stop_clock()
      state, sums = run.step(state, batch)
      preemption.starting = False  # compiled and running: a signal now saves after the step
      interval_sums.append(sums)
      done = step + 1
      if compiles:
        progress.exclude_step(int(jax.device_get(sums['tokens'])))  # waits for the step
        seconds = progress.start_clock()
        new = 'the step' if step == start_step else f'the step for batch shape {shape[0]}'
        print(f'step {done}: {seconds:.1f} s, compiling {new} and running it once', flush=True)
      elif run.step_flops is not None and progress.peak_flops:
        progress.count(run.step_flops(batch))
      if done % train_config.log_every == 0 or done == train_config.steps:
        log(done)
      reached['step'] = done
      # The last step too, whether or not eval_every divides steps: the validation curve ends
      # at the trained model (the final evaluation scores config.eval's split and settings).
      every = train_config.eval_every
      if every and (done % every == 0 or done == train_config.steps):
        jax.block_until_ready(sums)  # off the training's clock
        progress.stop_clock()
        writer.write(done, run.validate(eval_model(run.graphdef, state), done))
        progress.start_clock()
      if train_config.checkpoint_every and done % train_config.checkpoint_every == 0:
        save(done)
      if mesh_lib.any_process(preemption.requested):
        if checkpoints.latest_step() != done:
          save(done)
        checkpoints.commit()  # "saved" only once it is
        raise PreemptedError.saved(done, checkpoints.directory / str(done), preemption.signum)
    if checkpoints.latest_step() != train_config.steps:
      save(train_config.steps)
  except BaseException:
    try:
      writer.close()
    except OSError:  # a full disk: the error in flight says so
      pass
    checkpoints.close(check=False)  # the error in flight is the one to report
    raise
  writer.close()
  checkpoints.close()  # a final save that did not commit is a FilesystemFaultError


def batch_plan_warning(saved_meta: dict, meta: dict, step: int) -> str | None:
  """The warning for a resume from checkpoint `step` (its meta `saved_meta`) whose batches are
  planned otherwise now (`meta`, this run's `Training.checkpoint_meta`), or None.

  A step's batch is a pure function of the step, the seed and the plan; translation plans
  batches of global rows that are a multiple of the device count (times
  config.train.grad_accum_steps), rounded down from max_tokens // padded length, and each
  process shuffles its own shard. Resumed on another device or process count, the run trains
  other batches from `step` on than the uninterrupted run would (an epoch may repeat some pairs
  and skip others). That is allowed (a preempted job may come back on another slice) but said.
  A checkpoint without a recorded plan (an older run) is not compared.
  """
  before, now = saved_meta.get('batch_plan'), meta.get('batch_plan')
  if before is None or now is None or before == now:
    return None

  def described(meta, plan):
    return (
      f'{meta.get("devices", "?")} device(s) in {plan["processes"]} process(es): rows '
      f'{plan["rows"]}, {plan["batches_per_epoch"]} batches per epoch'
    )

  return (
    f'resumed from step {step} with batches planned otherwise than when it was saved (then '
    f'{described(saved_meta, before)}; now {described(meta, now)}): batch rows are a multiple '
    'of the device count (times config.train.grad_accum_steps) and each process shuffles its '
    "own pairs, so from here on the data order differs from the uninterrupted run's; resume "
    'on the device and process count it was saved with to follow it'
  )
