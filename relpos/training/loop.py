"""The one training loop of every task.

A task (`relpos.training.char_lm_task`, `relpos.training.translation_task`) is a `Task`: it checks
its
config, builds its data and model, and supplies a `Training` — the state, the jitted step, the
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
- SIGTERM, agreed across processes, which saves the reached step and stops;
- faults around the run (a full disk, a bad workdir or one of another task, a checkpoint that
  does not commit, XLA out of memory) as one line naming the step, the last good checkpoint
  and what to do (`train`, docs/faults.md);
- the final checkpoint, then the task's evaluation.

Evaluation restores the model alone from the run's checkpoints (`relpos.training.restore`).

Adding a task takes one module with a `Task` subclass, its
config's declaration (`relpos.config.fields`) and an entry in `relpos.training.tasks`.
"""

import abc
import contextlib
import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from relpos import flops as flops_lib
from relpos import runtime
from relpos.attention.pallas_common import check_runs_on
from relpos.config import checks, fields
from relpos.config.recorded import CONFIG_FILE, check_config_change, record_config
from relpos.files import check_takes_files, write_atomically
from relpos.messages import warn
from relpos.training import data_record, optim, workdir_lock
from relpos.training import mesh as mesh_lib
from relpos.training.checkpoints import (
  CHECKPOINTS,
  Checkpoints,
  FilesystemFaultError,
  error_path,
  filesystem_fault,
  finished_steps,
  is_write_fault,
  last_good_in,
  rerun_remedy,
)
from relpos.training.device_memory import (
  evaluation_memory_fault,
  is_out_of_memory,
  out_of_memory_fault,
  step_memory_warning,
)
from relpos.training.metric_writer import MetricWriter
from relpos.training.preemption import (
  InterruptedRunError,
  PreemptedError,
  PreemptionSignal,
)
from relpos.training.progress import Progress
from relpos.training.restore import all_finite, check_trained
from relpos.training.run_config import (
  RESULTS_FILE,
  check_model,
  check_task,
  check_unread_settings,
  data_changes,
  has_run,
  not_a_run,
  read_config,
  recorded_divergence,
)
from relpos.training.train_step import eval_model, one_step_in_flight
from relpos.training.workdir_setup import (
  files_a_start_makes,
  leave_no_trace,
  missing_directories,
  prepare_workdir,
  remove_unrecorded,
)


@dataclasses.dataclass
class Training:
  """What a task hands the loop.

  Attributes:
    graphdef: of the pair (model, optimizer).
    state: {'model': ..., 'optimizer': ..., **carry}, pure dicts of arrays (`init_state`);
      the carry (e.g. the char LM's memory) is a dict of arrays that the step updates and
      checkpoints keep.
    step: (state, batch) -> (state, sums), jitted over the mesh; `sums` holds device scalars
      summed over the global batch, at least 'loss' (what the gradient is of, times 'tokens')
      and 'tokens'. The loop averages them over each logging interval.
    batch: the global batch of step s (a pure function of s: resume needs no data state).
    validate: (model on this process's first device, step) -> scalars to log; prints its own
      line.
    checkpoint_meta: JSON-able facts saved with every checkpoint. Its 'batch_plan' (with
      'devices'), where a task's batches depend on the device count (translation's rows), is
      compared on resume: `batch_plan_warning`.
    step_flops: the model FLOPs of a training step on a batch (`relpos.flops`: 3 × the forward
      count, every attention pair counted), or None; with a known device peak the progress
      line and metrics.jsonl ('train/mfu') give the model FLOPs utilisation.
  """

  graphdef: Any
  state: dict
  step: Callable[[dict, Any], tuple[dict, dict]]
  batch: Callable[[int], Any]
  validate: Callable[[nnx.Module, int], dict]
  checkpoint_meta: dict = dataclasses.field(default_factory=dict)
  step_flops: Callable[[Any], float] | None = None


def check_platform(config, platform: str) -> None:
  """ValueError of one line if config.model.attention_implementation does not run on devices
  of `platform` (`pallas_common.check_runs_on`): e.g. a run trained with 'cudnn' on a GPU and
  evaluated on a CPU, where any other implementation gives the same scores."""
  if 'attention_implementation' in config.model:
    where = 'config.model.attention_implementation'
    check_runs_on(config.model.attention_implementation, platform, where=where)


def checkpoint_text(result: dict) -> str:
  """'checkpoint <path>' of an evaluation's `result`, with the steps it averaged where
  config.eval.average_checkpoints made it more than one ('(averaged steps [4, 8])'): the
  launchers' line of what was scored, the same for every task (`result_lines`)."""
  steps = result.get('averaged_steps') or []
  averaged = f' (averaged steps {_steps_text(steps)})' if len(steps) > 1 else ''
  return f'checkpoint {result["checkpoint"]}{averaged}'


# `Task.data_files`' key of the vocabulary a run makes in its workdir (spm.model, vocab.json).
VOCABULARY = 'the vocabulary'


class Task(abc.ABC):
  """A task train.py and eval.py run; `config.task` names it (`relpos.training.tasks`)."""

  metric: str  # the name of the final metric, printed last as `<metric>=<value>`
  # The task's config, declared (`relpos.config.fields`): its ConfigDict's fields, defaults
  # and rules. config.model is checked by the model's typed config (`check_combinations`).
  declaration: type
  # The config.data fields only training reads (the training files, how its batches are
  # made): an evaluation given other values scores the same sentences, so it warns of them
  # but never refuses to score into the workdir (`check_other_data`).
  training_only_data: tuple[str, ...] = ()
  # The config.data fields whose files the task reads as lines ('\r\n' read as '\n':
  # `relpos.data.data_file.decode_lines`), so that a file's data is its lines, not its bytes:
  # one converted to CRLF line endings, or back, is the run's data all the same
  # (`data_record.record`). Files read otherwise (the character LM's bytes) are compared by
  # their bytes.
  data_read_as_lines: tuple[str, ...] = ()

  def check_config(self, config: ml_collections.ConfigDict, mesh=None) -> None:
    """Raises ValueError naming the field for any config the run cannot honour: a field the
    declaration does not hold, every field's rule, the model's typed config, and the rules
    across fields (with `mesh`, those of the batch against the devices, and the attention
    implementation against their platform)."""
    self.check_complete(config)
    # config.model's own fields are checked by its typed config (`check_combinations`).
    unknown = fields.undeclared(config.to_dict(), self.declaration, skip=('model',))
    if unknown:  # else recorded in config.json, which every later read would refuse
      raise ValueError(
        f'config.{unknown[0]} is not a field of the {config.get("task")} config (config files '
        'list every field; `python -m relpos.tools.show_config` shows them): remove it'
      )
    checks.check(config, fields.rules(self.declaration, skip=('model',)))
    optim.check_schedule(config)
    self.check_combinations(config, mesh)
    devices = getattr(mesh, 'devices', None)
    if devices is not None:
      check_platform(config, devices.flat[0].platform)

  def check_complete(self, config: ml_collections.ConfigDict) -> None:
    """Raises ValueError naming the first field the declaration holds that `config` lacks (a
    config file that deleted a field or returned only some sections), or a missing
    config.model (whose fields its typed config names): the first of the config checks, since
    every other check, and every early check of a command (`check_evaluation_plan`, a
    sweep's --field), reads those fields."""
    checks.check_present(config, [*fields.leaves(self.declaration, skip=('model',)), 'model'])

  @abc.abstractmethod
  def check_combinations(self, config: ml_collections.ConfigDict, mesh) -> None:
    """The model config and the rules across fields; `mesh` None skips those of devices."""

  @property
  def metrics(self) -> tuple[str, ...]:
    """The numbers of eval_results.json a sweep may tabulate (the metric first)."""
    return (self.metric,)

  def unread_fields(self, config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The config.model fields the model of `config` never reads (`ModelConfig.unread_fields`),
    which a sweep refuses to vary."""
    del config
    return ()

  def unread_run_fields(self, config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """Fields outside config.model (dotted, e.g. 'eval.clamp_len') that the model of `config`
    never reads, which a sweep refuses to vary too."""
    del config
    return ()

  def scored_data_changes(self, config: ml_collections.ConfigDict, workdir: Path) -> list[str]:
    """The changes from the data the run in `workdir` trained on (`run_config.data_changes`,
    `data_record.changes`) that change what an evaluation of `config` scores: those of every
    data field and file but `training_only_data`."""
    return self._data_changes(config, workdir, training_only=False)

  def training_data_changes(self, config: ml_collections.ConfigDict, workdir: Path) -> list[str]:
    """The changes of `training_only_data` alone (`scored_data_changes`' complement), which
    change nothing an evaluation scores."""
    return self._data_changes(config, workdir, training_only=True)

  def _data_changes(self, config, workdir: Path, *, training_only: bool) -> list[str]:
    """The data changes of the fields and files only training reads (`training_only`), or of
    all the others."""

    def selected(field: str) -> bool:
      return (field.removeprefix('config.data.') in self.training_only_data) == training_only

    files = {
      field: path for field, path in self.data_files(config, workdir).items() if selected(field)
    }
    left_out = tuple(name for name in config.get('data', {}) if not selected(name))
    return data_changes(workdir, config, files, free=left_out) + data_record.changes(workdir, files)

  def data_files(self, config: ml_collections.ConfigDict, workdir: Path) -> dict[str, Path]:
    """{'config.data.<field>': path} of the data files the config names, and the vocabulary
    the run makes of them in `workdir`, which a run records and checks for changes
    (`data_record`); none by default."""
    del config, workdir
    return {}

  @abc.abstractmethod
  def training(self, config, workdir: Path, mesh) -> Training:
    """Reads the data, builds the model and optimizer (`init_state`): the run's `Training`."""

  @abc.abstractmethod
  def score(self, config, workdir: Path, output_dir: Path | None = None) -> dict:
    """The evaluation of the workdir's checkpoint (`restore_model`): {metric: value, ...}.
    Files it writes (translations) go to `output_dir`, the workdir by default."""

  def evaluate(self, config, workdir, *, output_dir=None, after_training=False) -> dict:
    """`score` after the config check, with config.eval added; process 0 writes it to
    `output_dir`/eval_results.json (default: the workdir, which evaluating it with other
    config.eval settings then overwrites). That the directory takes files is checked before
    anything is scored (`check_takes_files`, as train.py checks its workdir before training):
    a read-only one failed only at the write, after the whole set was scored. Its faults'
    remedies name --output_dir, given or not (eval.py's); `after_training`: train.py's
    evaluation of the run it has just trained, which takes no --output_dir, so they name
    --workdir, as they do for an `output_dir` given as the workdir itself (a sweep scoring a
    run in place). A workdir with no checkpoint is a FileNotFoundError, and a config of
    another model than the run's a ValueError (`check_model`), before anything else is read.
    Other data than the run's (`run_config.data_changes`: a config.data field, or a data
    file changed since, `data_record.changes`) is scored only into another directory than
    the workdir, with a warning line, and the result records config.data beside config.eval;
    into the workdir it is refused before anything is scored (`check_other_data`, but for the
    fields only training reads, `training_only_data`): the score, of other sentences,
    replaced the run's own eval_results.json and translations, and a sweep tabulated it as
    the run's. A vocabulary changed since (spm.model, vocab.json) is refused into any
    directory (`check_vocabulary`): the model's ids are its pieces. train.py's final
    evaluation never gets here with a file changed while it
    trained (`train_and_evaluate`: the run is left unscored). A run a sweep recorded as
    diverged (`recorded_divergence`) is scored at its last finite checkpoint, with a warning
    line that says so. eval.py scores
    it only into another directory than the record's (`run_config.check_output_dir`);
    train.py's final evaluation, of the run it has just trained on, replaces the record. An
    evaluation refused after it made `output_dir` (data it cannot read, out of memory)
    removes what it made, where it holds nothing (`leave_no_trace`)."""
    workdir = Path(workdir)
    check_task(workdir, config.get('task'))  # before anything else: the workdir's run
    self.check_config(config)  # before anything reads its fields
    check_model(workdir, config, self.unread_fields(config))
    trained = read_config(workdir, known_fields=False).to_dict() if has_run(workdir) else None
    check_unread_settings(
      config,
      self.unread_run_fields(config),
      trained,
      f'leave it as the run has it ({workdir / CONFIG_FILE} records it)',
    )
    data_files = self.data_files(config, workdir)
    check_vocabulary(workdir, data_files)  # not other data: other ids (into any directory)
    given_output_dir = output_dir is not None
    output_dir = workdir if output_dir is None else Path(output_dir)
    in_workdir = output_dir.resolve() == workdir.resolve()
    if scored := self.scored_data_changes(config, workdir):
      if in_workdir and not after_training:
        check_other_data(workdir, scored)
      warn(f'scoring other data than the run trained with ({"; ".join(scored)})')
    if training_only := self.training_data_changes(config, workdir):
      warn(
        f"fields only training reads differ from the run's ({'; '.join(training_only)}): "
        'they change nothing this evaluation scores'
      )
    check_platform(config, jax.default_backend())
    check_trained(workdir).close()
    diverged = recorded_divergence(output_dir, workdir)

    def fault(error: OSError, what: str) -> FilesystemFaultError:
      return filesystem_fault(
        error,
        what,
        last_good=f'the checkpoints in {workdir} are unchanged',
        resume=False,
        # A sweep gives its runs' own directory as output_dir where it scores them in place.
        flag='--workdir' if after_training or given_output_dir and in_workdir else '--output_dir',
        flag_given=given_output_dir,
      )

    # Only the writer makes it (`_score_into`), so only the writer removes it.
    made = missing_directories(output_dir) if mesh_lib.is_writer() else []
    try:
      return self._score_into(config, workdir, output_dir, fault, diverged)
    except BaseException:
      leave_no_trace(output_dir, made)  # a refused evaluation leaves no empty --output_dir
      raise

  def _score_into(self, config, workdir: Path, output_dir: Path, fault, diverged) -> dict:
    """`evaluate`'s scoring into `output_dir`, once the run and config are checked: the
    directory checked to take files (made where it is missing), the score, eval_results.json.
    `fault`: the FilesystemFaultError of an OSError writing there. What it made of
    `output_dir` is removed again by `evaluate` where it stops before writing anything
    (`leave_no_trace`, as train.py's workdir)."""
    if mesh_lib.is_writer():  # eval_results.json goes there, and `score` may write files
      try:
        check_takes_files(output_dir)
      except OSError as error:
        what = f'cannot write the evaluation to {output_dir}, checked before scoring'
        raise fault(error, what) from error
    try:
      result = {**self.score(config, workdir, output_dir), 'eval': config.eval.to_dict()}
      if diverged:
        warn(
          f'the run in {workdir} diverged at step {diverged[0]} ({diverged[1]} recorded it): '
          f'this is the score of its last finite checkpoint, step {result["step"]}'
        )
      if 'data' in config:  # what was scored: eval.py may be given other data
        result['data'] = config.data.to_dict()
      if mesh_lib.is_writer():
        write_atomically(output_dir / 'eval_results.json', json.dumps(result, indent=2))
    except (jax.errors.JaxRuntimeError, ValueError, MemoryError) as error:
      if not is_out_of_memory(error):
        raise
      raise evaluation_memory_fault(config, workdir) from error
    except OSError as error:
      written = Path(error.filename or '/').resolve()
      if output_dir.resolve() not in (written, *written.parents):
        raise  # a data file's error, as the task reports it
      # The file itself where the error names one (`write_atomically`'s do: eval_results.json,
      # translations), else output_dir, which could not be made.
      target = output_dir / written.relative_to(output_dir.resolve())
      raise fault(error, f'cannot write the evaluation to {target}') from error
    return result

  @abc.abstractmethod
  def result_lines(self, result: dict) -> list[str]:
    """What the launchers print; the very last line is `<metric>=<value>`."""

  def train_scalars(self, totals: dict) -> dict:
    """The task's train scalars besides the loss (e.g. bits-per-char) from the sums of a
    logging interval."""
    del totals
    return {}

  def train_model(self, config, workdir, *, allow_config_change: bool = False) -> None:
    """Trains for config.train.steps, resuming from the latest checkpoint (a finished run
    only restores)."""
    # SIGTERM is caught from the start, so that a notice during setup (reading data,
    # compiling) stops the run after its first step, with a checkpoint, instead of killing
    # this process and stranding the others of a multi-process run at their next collective.
    with PreemptionSignal() as preemption:
      train(self, config, workdir, preemption, allow_config_change=allow_config_change)

  def train_and_evaluate(
    self,
    config,
    workdir,
    *,
    allow_config_change: bool = False,
    score_command: str | None = None,
  ) -> dict:
    """`train_model`, then `evaluate`; an evaluation the run's checkpoints cannot serve is
    refused first (`check_evaluation_plan`), not after the training; the config check comes
    before that, which reads its fields (`train` checks it again with the devices). A data
    file that is gone by the evaluation (deleted or moved while the run trained) is an
    `UnscoredRunError`: the data reader's own line ('set data.path to an existing file')
    would invite scoring the finished run on other data. So is one the evaluation reads
    rewritten while the run trained (`scored_data_changes`, against the record the run made
    as it started; training has read the rest already): scored,
    that was other text than the run's, with a warning line and an eval_results.json that a
    sweep tabulates like any other. SIGTERM or Ctrl-C during the evaluation ends the program
    at once with one line saying that the run is trained but not scored, and how to score it
    (`relpos.runtime.stop_at_signals`): there is nothing to save. `score_command`: the eval.py
    command that scores the run (the launcher's, `tasks.eval_command`; None: a generic one)."""
    check_task(workdir, config.get('task'))  # before anything else: the workdir's run
    self.check_config(config)
    check_evaluation_plan(config, workdir)
    self.train_model(config, workdir, allow_config_change=allow_config_change)
    score_command = score_command or generic_score_command(workdir)
    changed = self.scored_data_changes(config, workdir)  # a training file may change now
    if changed:
      raise UnscoredRunError(workdir, [], changed, command=score_command)
    unscored = (
      f' during the final evaluation: training finished and saved {last_checkpoint(workdir)}, '
      f'but the run is not scored: score it with `{score_command}`'
    )
    try:
      with runtime.stop_at_signals(unscored):
        return self.evaluate(config, workdir, after_training=True)
    except FileNotFoundError as error:
      files = self.data_files(config, workdir)
      gone = [f'{field} ({path})' for field, path in files.items() if not Path(path).is_file()]
      if not gone:
        raise
      raise UnscoredRunError(workdir, gone, command=score_command) from error


def generic_score_command(workdir) -> str:
  """The eval.py command that scores the run in `workdir`, where the command that trained it
  is not known (`tasks.eval_command` builds it from that)."""
  return f'python eval.py --config=<its config file> --workdir={workdir}'


def last_checkpoint(workdir) -> str:
  """'its last checkpoint, <workdir>/checkpoints/<s> (step <s>)' of a run that finished
  training, for the lines that say it is trained but not scored."""
  steps = finished_steps(workdir)
  if not steps:
    return 'its checkpoints'
  return f'its last checkpoint, {Path(workdir) / CHECKPOINTS / str(steps[-1])} (step {steps[-1]})'


def check_vocabulary(workdir: Path, files: dict[str, Path]) -> None:
  """Refuses to read the run in `workdir` with a vocabulary changed since it trained
  (`files`: `Task.data_files`, whose `VOCABULARY` is the workdir's spm.model or vocab.json,
  compared with its record, `data_record.changes`). Unlike other data, it is not something to
  score elsewhere: the model's ids are its vocabulary's pieces, so another vocabulary reads
  every sentence as other ids (with --output_dir, eval.py scored them so, exit 0, a fraction
  of the run's BLEU). eval.py and the tools that read a run (`relpos.tools.translate`,
  `relpos.tools.sample`) refuse it, with or without --output_dir, and so does a resume, with
  or without --allow_config_change (it trained the checkpoint's embeddings on other pieces).

  Raises:
    ValueError: naming the file and the remedy, to put the run's own file back.
  """
  vocabulary = files.get(VOCABULARY)
  if vocabulary is None or not (changed := data_record.changes(workdir, {VOCABULARY: vocabulary})):
    return
  raise ValueError(
    f"{changed[0]}: the model's ids are the pieces of the vocabulary it trained with, so the "
    "run is not resumed, read or scored (into any directory) with another: restore the run's "
    f'{vocabulary.name} (from a backup or from where the run came from)'
  )


def check_other_data(workdir: Path, other_data: list[str]) -> None:
  """Refuses an evaluation into the workdir itself of other data than the run in `workdir`
  trained on (`other_data`: the changes that alter what is scored, `Task.scored_data_changes`,
  each '<field>: ...'): its eval_results.json and translations are the run's result, which a
  score of other sentences would replace (a sweep's --collect_only then tabulated it as the
  run's, `relpos.studies.sweep.stale_reason`). One rule for every task: another data.path of a
  char LM, another eval_src of a translation; a training file moved or another batch size
  (`Task.training_only_data`) scores the same sentences and is only warned of.

  Raises:
    ValueError: naming the changes and --output_dir.
  """
  if not other_data:
    return
  raise ValueError(
    f'this evaluation scores other data than the run in {workdir} trained with '
    f"({'; '.join(other_data)}), and would replace the run's own result ({RESULTS_FILE}) "
    "with that score: give --output_dir=<a new directory> to score it there, or the run's "
    f'data fields ({workdir / CONFIG_FILE} records them)'
  )


class UnscoredRunError(FileNotFoundError):
  """Training finished and saved its last checkpoint, but a data file it read is gone since it
  started (`gone`: '<field> (<path>)' each) or holds other data than it trained on (`changed`:
  `data_record.changes`' lines), so its final evaluation did not run. The run is whole: eval.py
  scores it once the file is back as it was. `command` is that eval.py command: the launcher
  gives it, from its own command line (`tasks.eval_command`)."""

  def __init__(
    self, workdir, gone: list[str], changed: list[str] = (), *, command: str | None = None
  ):
    saved = last_checkpoint(workdir)
    problems = list(changed)
    if gone:
      files = ' and '.join(gone) + (' is' if len(gone) == 1 else ' are')
      problems.insert(0, f'{files} gone since training started (deleted or moved)')
    self.reason = (
      f'training finished and saved {saved}, but {"; ".join(problems)}, so the run was not '
      'evaluated: restore the data as it was, then score the run'
    )
    self.command = command or generic_score_command(workdir)
    super().__init__(self.reason)

  def __str__(self) -> str:
    return f'{self.reason} with `{self.command}`'


def _steps_text(steps: list[int]) -> str:
  return str(steps) if len(steps) <= 6 else f'[{steps[0]}, {steps[1]}, ..., {steps[-1]}]'


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
      f'config.eval.step={step}: the run will keep checkpoints {_steps_text(kept)} ({schedule}); '
      'give one of them, or 0 for the newest'
    )
  upto = [s for s in kept if s <= step]
  if eval_config.average_checkpoints > len(upto):
    raise ValueError(
      f'config.eval.average_checkpoints={eval_config.average_checkpoints}: the run will keep '
      f'{len(upto)} checkpoint(s) up to step {step} ({_steps_text(upto)}; {schedule}); set it '
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
  resumes. A start that stops before its run is recorded removes the vocabulary it made
  (`remove_unrecorded`), and one that stops before writing anything the workdir it made
  (`leave_no_trace`).
  """
  workdir = Path(workdir)
  check_task(workdir, config.get('task'))  # before anything else: the workdir's run
  not_a_new_run = not has_run(workdir) and not_a_run(workdir, f'--workdir={workdir}')
  if not_a_new_run:  # a sweep's root, an evaluation's directory: a run there would mix in
    raise ValueError(f'{not_a_new_run}; a new run needs a directory of its own')
  mesh = mesh_lib.data_mesh()
  task.check_config(config, mesh)  # before writing, reading data or compiling anything
  made = prepare_workdir(workdir, config.train.steps)
  reached = {'step': 0, 'checkpoints': None}

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
    raise out_of_memory_fault(config, reached['step'] + 1, last_good()) from error
  except KeyboardInterrupt:  # a second Ctrl-C (the first saves and stops: PreemptionSignal)
    last = last_good()
    raise InterruptedRunError(
      f'stopped by Ctrl-C at step {reached["step"]}, without a save; {last}; {rerun_remedy(last)}'
    ) from None


def _train(task: Task, config, workdir: Path, mesh, preemption, allow_config_change, reached: dict):
  """`train`'s run over `mesh` (its config checked); `reached` keeps the step reached and the
  checkpoints, for its faults."""
  data_files = task.data_files(config, workdir)
  # Another spelling of the run's data (its file, or its bytes) is no config change.
  same_data = data_record.same_data(workdir, data_files)
  check_config_change(  # before any write
    config, workdir, allow_change=allow_config_change, same_data=same_data
  )
  # Not even with --allow_config_change: the checkpoints' ids are the recorded vocabulary's.
  check_vocabulary(workdir, data_files)
  other_data = data_record.changes(workdir, data_files)
  if other_data and not allow_config_change:
    raise ValueError(
      f'{workdir} holds a run trained on other data ({"; ".join(other_data)}): resumed, it '
      'would read other text at its data position; use a new --workdir, or pass '
      '--allow_config_change to continue this run on the data as it is now'
    )
  if other_data:
    warn(f'continuing on other data than the run trained with ({"; ".join(other_data)})')
  run = task.training(config, workdir, mesh)
  warn_of_schedule(config, workdir)  # once its data loaded: not before a refusal for missing data
  train_config = config.train
  state = run.state

  checkpoints = Checkpoints(workdir, keep=train_config.keep_checkpoints, writer=True)
  reached['checkpoints'] = checkpoints
  start_step = 0
  found = checkpoints.restore_latest(state)  # every item of the state, pure dicts
  if found:
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
  reached['step'] = start_step
  if mesh_lib.is_writer():  # once the checkpoint took `config`: config.json stays the run's
    record_config(config, workdir, allow_change=allow_config_change, same_data=same_data)
    read_as_lines = [f'config.data.{name}' for name in task.data_read_as_lines]
    data_record.record(workdir, data_files, read_as_lines)

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
      'train/loss': loss,
      **task.train_scalars(totals),
      'train/tok_per_s': tokens_per_second,
      **({} if progress.mfu is None else {'train/mfu': progress.mfu}),
    }
    writer.write(done, scalars)
    extras = ''.join(
      f' | {name.split("/")[-1]} {value:.4f}'
      for name, value in scalars.items()
      if name not in ('train/loss', 'train/tok_per_s', 'train/mfu')
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
