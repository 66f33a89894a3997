"""What a task is: the `Task` base class that train.py and eval.py run, the `Training` it hands
the loop, and the evaluation every task shares (`Task.evaluate`; the rules of its result, the
same for every task, are `relpos.training.run_results`).

A task (`relpos.training.char_lm_task`, `relpos.training.translation_task`) checks its config,
builds its data and model, and supplies a `Training`: the state, the jitted step
(`relpos.training.train_step`), the global batch of step s and a validation function. The loop
(`relpos.training.loop.train`) owns the cadence around them. Adding a task takes one module
with a `Task` subclass, its config's declaration (`relpos.config.fields`) and an entry in
`relpos.config.TASKS`.

A task's evaluation (`Task.evaluate`) restores the model alone (`relpos.training.restore`),
checks the run and the data it is given first (`run_results.check_own_result`,
`data_record.check_vocabulary`), and writes eval_results.json; a run trained but left unscored
(`run_results.UnscoredRunError`) names the eval.py command that scores it.
"""

import abc
import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import ml_collections
from flax import nnx

from relpos import signals
from relpos.attention.implementations import check_runs_on, off_its_devices
from relpos.config import checks, fields
from relpos.config.model_fields import SCORE_CHANGING_FIELDS, TRAINING_ONLY_FIELDS
from relpos.config.recorded import CONFIG_FILE, config_changes
from relpos.faults import FilesystemFaultError, error_path, filesystem_fault, is_write_fault
from relpos.files import check_takes_files, write_atomically
from relpos.messages import warn
from relpos.training import data_record, finished_run, optim
from relpos.training import mesh as mesh_lib
from relpos.training.checkpoints import steps_text
from relpos.training.device_memory import evaluation_memory_fault, is_out_of_memory
from relpos.training.loop import check_evaluation_plan, train
from relpos.training.restore import check_trained, restore_model
from relpos.training.run_config import (
  check_model,
  check_not_a_file,
  check_task,
  check_unread_settings,
  data_changes,
  has_run,
  read_config,
)
from relpos.training.run_results import (
  RESULTS_FILE,
  WRITTEN_TO,
  UnscoredRunError,
  check_own_result,
  generic_score_command,
  last_checkpoint,
  newer_result,
  other_computation,
  other_evaluation,
  recorded_divergence,
  results_in,
)
from relpos.training.workdir_setup import (
  leave_no_trace,
  missing_directories,
  stopped_evaluation,
)


@dataclasses.dataclass
class Training:
  """What a task hands the loop.

  Attributes:
    graphdef: of the pair (model, optimizer).
    state: {'model': ..., 'optimizer': ..., **carry}, pure dicts of arrays
      (`train_step.init_state`);
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
  of `platform` (`implementations.check_runs_on`): e.g. a run trained with 'cudnn' on a GPU and
  evaluated on a CPU, where any other implementation gives the same scores."""
  if 'attention_implementation' in config.model:
    where = 'config.model.attention_implementation'
    check_runs_on(config.model.attention_implementation, platform, where=where)


def runnable_here(config, workdir, platform: str | None = None) -> None:
  """Sets config.model.attention_implementation, as a run's config.json records it (`config`,
  read from `workdir`), to 'auto' where it does not run on devices of `platform` (default:
  this machine's, `jax.default_backend()`; the rule is `implementations.off_its_devices`', the
  one `check_platform` refuses by), with one warning line naming the recorded choice and the
  devices. For the tools that run a trained model from its own config and take no config
  flags (`Task.trained_model`): a run trained with 'cudnn' on a GPU
  and opened on a CPU ended in JAX's traceback ('cuDNN is not detected'), and nothing could
  choose another kernel. The implementation is how the model is computed, not what it is
  (`model_fields.EVALUATION_FREE_FIELDS`): 'auto' runs the same model, to rounding. eval.py
  and train.py refuse instead (`check_platform`): they take --config.model.
  attention_implementation, and a run's choice is not replaced behind a command's back."""
  where = 'config.model.attention_implementation'
  recorded = config.model.get('attention_implementation', 'auto')
  platform = platform or jax.default_backend()
  if reason := off_its_devices(recorded, platform, where=where):
    warn(
      f"{reason}, as {Path(workdir) / CONFIG_FILE} records it; this machine's devices are "
      f"{platform}: running 'auto' (the same model: the implementation is a compute choice)"
    )
    config.model.attention_implementation = 'auto'


class TrainedModel(NamedTuple):
  """A finished run as the tools that read one take it (`Task.trained_model`)."""

  config: ml_collections.ConfigDict  # its config.json, the implementation `runnable_here`'s
  vocab: Any  # the vocabulary it trained with (`Task.run_vocabulary`)
  model: nnx.Module  # with its checkpoint's parameters (`restore.restore_model`)
  steps: list[int]  # the checkpoints averaged into them, the last the one config.eval names


# In `Task.score`'s result: {key of `Task.result_files`: the text of the file it names}, for
# `Task.evaluate` to write; not in eval_results.json.
FILE_TEXTS = 'file_texts'


def checkpoint_text(result: dict) -> str:
  """'checkpoint <path>' of an evaluation's `result`, with the steps it averaged where
  config.eval.average_checkpoints made it more than one ('(averaged steps [4, 8])') and the
  clip where config.eval.max_relative_position clipped Shaw's tables ('(Shaw tables clipped
  at k=2)': a figure of another model than the run's): the launchers' line of what was
  scored, the same for every task (`result_lines`)."""
  steps = result.get('averaged_steps') or []
  averaged = f' (averaged steps {steps_text(steps)})' if len(steps) > 1 else ''
  clipped = (result.get('eval') or {}).get('max_relative_position', -1)
  clip = f' (Shaw tables clipped at k={clipped})' if clipped >= 0 else ''
  return f'checkpoint {result["checkpoint"]}{averaged}{clip}'


class Task(abc.ABC):
  """A task train.py and eval.py run; `config.task` names it (`relpos.training.tasks`)."""

  metric: str  # the name of the final metric, printed last as `<metric>=<value>`
  # The task's config, declared (`relpos.config.fields`): its ConfigDict's fields, defaults
  # and rules. config.model is checked by the model's typed config (`check_combinations`).
  declaration: type
  # The config.data fields only training reads (the training files, how its batches are
  # made): an evaluation given other values scores the same sentences, so it warns of them
  # but never refuses to score into the workdir (`check_own_result`).
  training_only_data: tuple[str, ...] = ()
  # The config.data fields whose files the task reads as lines ('\r\n' read as '\n':
  # `relpos.data.data_file.decode_lines`), so that a file's data is its lines, not its bytes:
  # one converted to CRLF line endings, or back, is the run's data all the same
  # (`data_record.record`). Files read otherwise (the character LM's bytes) are compared by
  # their bytes.
  data_read_as_lines: tuple[str, ...] = ()
  # The keys of an evaluation's result that name a file it writes beside eval_results.json
  # (translation's 'translations'), whose text `score` returns under `FILE_TEXTS`; the result
  # records each file's sha256 as '<key>_sha256', for `finished_run.stale_reason` to tell a
  # result from the files it names.
  result_files: tuple[str, ...] = ()

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

  def resume_shapes(self, config: ml_collections.ConfigDict) -> tuple[tuple[str, ...], str]:
    """(fields, what): the config fields (dotted) outside config.model that give the shape of
    state a checkpoint carries from step to step, and what that state is (or that there is
    none), in words; ((), '') where the state is the model's and the optimizer's alone. A
    run resumes only with the fields as its checkpoints were saved with, not even with
    --allow_config_change (`loop.check_resume_shapes`), and an out-of-memory line does not
    offer to change them to a run that has checkpoints."""
    del config
    return (), ''

  def training_only(self, field: str) -> bool:
    """Whether config.<field> (dotted: 'optim.learning_rate') is read by training alone, never
    by an evaluation of the trained run: config.optim, config.train but for its steps (how far
    the run trains, and the step an evaluation scores by default), the task's
    `training_only_data` and the config.model fields that say how the model is trained
    (`model_fields.TRAINING_ONLY_FIELDS`: dropout, the initialisation, remat), and config.seed
    (the initial parameters, dropout's bits and the data order; an evaluation's loss batches
    take their order from it too, the same sum to float rounding; where it also draws the
    sentences a vocabulary trains on, changing it is refused as another vocabulary). A finished
    run continued with such a field changed trains nothing with it (`loop.untrained_changes`)."""
    section, _, name = field.partition('.')
    return (
      field == 'seed'
      or section == 'optim'
      or (section == 'train' and name != 'steps')
      or (section == 'data' and name in self.training_only_data)
      or (section == 'model' and name in TRAINING_ONLY_FIELDS)
    )

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

  def vocabulary_changes(
    self, config: ml_collections.ConfigDict, workdir: Path
  ) -> list[str] | None:
    """What makes the vocabulary a run of `config` trains in its workdir
    (`data_record.VOCABULARY`) differ from the one the run in `workdir` trained, a line each:
    none, and it is the same vocabulary, which a sweep copies into a new run's workdir rather
    than train it again (`relpos.studies.sweep.reuse_vocabulary`). None (the default): the
    task makes no vocabulary worth handing on (the character LM's is read off its text in a
    moment)."""
    del config, workdir
    return None

  @abc.abstractmethod
  def training(self, config, workdir: Path, mesh) -> Training:
    """Reads the data, builds the model and optimizer (`train_step.init_state`): the run's
    `Training`."""

  @abc.abstractmethod
  def score(self, config, workdir: Path, output_dir: Path | None = None) -> dict:
    """The evaluation of the workdir's checkpoint (`restore.restore_model`): {metric: value, ...}.
    The files the evaluation writes beside eval_results.json (translations), in `output_dir`
    (the workdir by default), are not written here: the result names each under its key of
    `result_files` and holds their text under `FILE_TEXTS` ({key: text}), which `evaluate`
    writes together with eval_results.json (`_score_into`)."""

  def build_model(self, config, vocab_size: int) -> nnx.Module:
    """The task's model of `config` over `vocab_size` symbols, its parameters drawn from
    config.seed as training draws them (a checkpoint's then replace them: `restore_model`)."""
    raise NotImplementedError(f'{type(self).__name__} builds no model')

  def run_vocabulary(self, config, workdir: Path) -> tuple[Any, int]:
    """(the vocabulary the run in `workdir` trained with, read as its tools read text with it;
    its size, the model's), for `trained_model`."""
    raise NotImplementedError(f'{type(self).__name__} reads no vocabulary')

  def trained_model(
    self,
    workdir,
    *,
    needs: str,
    flag: str | None = '--workdir',
    prepare: Callable[[ml_collections.ConfigDict], None] | None = None,
  ) -> TrainedModel:
    """The finished run in `workdir` as the tools that read one from its own config take it
    (relpos.tools.translate and .sample, relpos.studies.shaw_tables,
    benchmarks/decode_speed.py), each check made before the next thing is read: a run of
    this task (`check_task`; `needs`: what reads such runs, for its message), its config.json
    (`read_config`; `flag`: the flag that gave `workdir`, None where it is positional), an
    attention implementation this machine runs (`runnable_here`: the tools take no config
    flags), a vocabulary unchanged since the run trained (`data_record.check_vocabulary`, as
    eval.py checks it), the caller's `prepare(config)` (its own flags against the run's
    config, and what it changes in config.eval for its read), a checkpoint (`check_trained`);
    then the vocabulary (`run_vocabulary`), the model (`build_model`) and its checkpoint's
    parameters (`restore_model`). Each tool wrote these steps out, and the copies drifted:
    shaw_tables and decode_speed checked neither the implementation (decode_speed failed on
    a TPU on a run's recorded 'pallas', which translate runs as 'auto') nor the vocabulary
    (decode_speed scored a swapped spm.model's pieces without a word)."""
    check_task(workdir, self.declaration.task, flag=flag, needs=needs)
    config = read_config(workdir, flag)
    runnable_here(config, workdir)  # a GPU run's 'cudnn' on a CPU: 'auto', with a warning
    data_record.check_vocabulary(workdir, self.data_files(config, workdir))
    if prepare is not None:
      prepare(config)
    check_trained(workdir).close()
    vocab, vocab_size = self.run_vocabulary(config, workdir)
    model, steps, _ = restore_model(self.build_model(config, vocab_size), config.eval, workdir)
    return TrainedModel(config, vocab, model, steps)

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
    into the workdir it is refused before anything is scored (`check_own_result`, but for the
    fields only training reads, `training_only_data`): the score, of other sentences,
    replaced the run's own eval_results.json and translations, and a sweep tabulated it as
    the run's. So is a config.eval other than the run's (`other_evaluation`: another step,
    beam, split, clipped k), into the workdir, by the same check: the workdir holds the
    result of the run's own config.eval. A vocabulary changed since (spm.model, vocab.json)
    is refused into any directory (`data_record.check_vocabulary`): the model's ids are its
    pieces. train.py's final evaluation never gets here with a file changed while it trained
    (`train_and_evaluate`: the run is left unscored). A run a sweep recorded as diverged
    (`recorded_divergence`) is scored at its last finite checkpoint, with a warning line that
    says so. eval.py scores it only into another directory than the record's
    (`run_config.check_output_dir`);
    train.py's final evaluation, of the run it has just trained on, replaces the record. An
    evaluation refused after it made `output_dir` (data it cannot read, out of memory)
    removes what it made, where it holds nothing (`workdir_setup.leave_no_trace`)."""
    workdir = Path(workdir)
    check_task(workdir, config.get('task'))  # before anything else: the workdir's run
    check_not_a_file(workdir)  # before any file under it is read
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
    data_record.check_vocabulary(
      workdir, data_files
    )  # not other data: other ids (into any directory)
    given_output_dir = output_dir is not None
    output_dir = workdir if output_dir is None else Path(output_dir)
    in_workdir = output_dir.resolve() == workdir.resolve()
    scored = self.scored_data_changes(config, workdir)
    if in_workdir and not after_training:
      check_own_result(
        workdir, scored, other_evaluation(config, trained), other_computation(config, trained)
      )
    if scored:
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
    directory checked to take files (made where it is missing), the score, its files
    (`result_files`: translations) and eval_results.json. `fault`: the FilesystemFaultError
    of an OSError writing there, which `relpos.faults.is_write_fault` tells from a data file's
    error as it does for train.py's workdir: an error of a file under `output_dir`, or a full
    disk or read-only filesystem wherever it is met (the write's own error names no file).
    What it made of `output_dir` is removed again by `evaluate` where it stops before writing
    anything (`workdir_setup.leave_no_trace`, as train.py's workdir).

    The result's files are written only once everything is scored, right before
    eval_results.json, which records each one's sha256, and SIGTERM or Ctrl-C is held back
    while the two are written (`signals.holding_signals`): a signal ends eval.py before both
    or after both, and its line (`workdir_setup.stopped_evaluation`) says which. The
    translations were written before the loss was computed, so a signal in those seconds
    left new translations beside the earlier evaluation's eval_results.json, which a rerun
    kept as the run's result (a BLEU that is not theirs), under a line that said the run was
    unchanged. Naming the replaced file in that line instead would have left the pair
    mismatched on disk; written together, eval_results.json and the translations it names
    are one evaluation's. A kill that nothing holds back (SIGKILL) between the two renames is
    what the sha256 is for: `finished_run.stale_reason` scores such a run again."""
    if mesh_lib.is_writer():  # eval_results.json goes there, with the result's files
      try:
        check_takes_files(output_dir)
      except OSError as error:
        what = f'cannot write the evaluation to {output_dir}, checked before scoring'
        raise fault(error, what) from error
    try:
      result = {**self.score(config, workdir, output_dir), 'eval': config.eval.to_dict()}
      # How it was computed, where that changes the score (the compute dtype): what
      # `finished_run.result_change` compares, and what says that a result in an --output_dir
      # is not the run's own float32 score.
      result['model'] = {name: config.model.get(name) for name in SCORE_CHANGING_FIELDS}
      texts = result.pop(FILE_TEXTS, {})
      for key, text in texts.items():
        result[f'{key}_sha256'] = hashlib.sha256(text.encode()).hexdigest()
      if diverged:
        warn(
          f'the run in {workdir} diverged at step {diverged[0]} ({diverged[1]} recorded it): '
          f'this is the score of its last finite checkpoint, step {result["step"]}'
        )
      if 'data' in config:  # what was scored: eval.py may be given other data
        result['data'] = config.data.to_dict()
      # Where it is written: what tells, once runs moved, whose checkpoint it scored and where
      # its files are (`run_results.foreign_checkpoint`, `run_results.result_file`).
      result[WRITTEN_TO] = str(output_dir.resolve())
      if mesh_lib.is_writer():
        with signals.holding_signals():  # both or neither (the docstring)
          if newer := newer_result(config, workdir, output_dir, result['step']):
            warn(newer)
            return result
          if replaced := replaced_evaluation(output_dir, workdir, result):
            warn(replaced)
          for key, text in texts.items():
            write_atomically(result[key], text)
          write_atomically(output_dir / RESULTS_FILE, json.dumps(result, indent=2))
    except (jax.errors.JaxRuntimeError, ValueError, MemoryError) as error:
      if not is_out_of_memory(error):
        raise
      raise evaluation_memory_fault(config, workdir) from error
    except OSError as error:
      written = error_path(error)
      if not is_write_fault(error, output_dir, written):  # train.py's rule for its workdir
        raise  # a data file's error, as the task reports it
      # The file itself where the error names one (`write_atomically`'s do: eval_results.json,
      # translations; under output_dir as it was given), else output_dir.
      target = output_dir
      if written is not None:
        resolved, own = written.resolve(), output_dir.resolve()
        inside = own in (resolved, *resolved.parents)
        target = output_dir / resolved.relative_to(own) if inside else written
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
    # compiling) stops a multi-process run after its first step, with a checkpoint, instead of
    # killing this process and stranding the others at their next collective; a single
    # process, with nothing to save yet, stops at once there (`signals.PreemptionSignal.starting`).
    with signals.PreemptionSignal() as preemption:
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
    (`relpos.signals.stop_at_signals`): there is nothing to save; once its results are
    written, that they are (`workdir_setup.stopped_evaluation`). `score_command`: the eval.py
    command that scores the run (the launcher's, `tasks.eval_command`; None: a generic one).

    A rerun in the workdir of a run that is finished, scored with this config and on the data
    it recorded returns its eval_results.json as it is, with one line that says so, before
    any data is read (`finished_run.kept_result`, the sweep's rule of a finished run):
    otherwise it re-read and re-encoded all the data and scored the run again, to the same
    score (a full test pass of the character LM, minutes on a large split)."""
    check_task(workdir, config.get('task'))  # before anything else: the workdir's run
    self.check_config(config)
    check_evaluation_plan(config, workdir)
    score_command = score_command or generic_score_command(workdir)
    if (kept := finished_run.kept_result(self, config, Path(workdir), score_command)) is not None:
      return kept  # this config's run, finished and scored: nothing is read, trained or scored
    self.train_model(config, workdir, allow_config_change=allow_config_change)
    changed = self.scored_data_changes(config, workdir)  # a training file may change now
    if changed:
      raise UnscoredRunError(workdir, [], changed, command=score_command)
    unscored = (
      f' during the final evaluation: training finished and saved {last_checkpoint(workdir)}, '
      f'but the run is not scored: score it with `{score_command}`'
    )
    try:
      with signals.stop_at_signals(stopped_evaluation(workdir, unscored)):
        return self.evaluate(config, workdir, after_training=True)
    except FileNotFoundError as error:
      files = self.data_files(config, workdir)
      gone = [f'{field} ({path})' for field, path in files.items() if not Path(path).is_file()]
      if not gone:
        raise
      raise UnscoredRunError(workdir, gone, command=score_command) from error


def replaced_evaluation(output_dir: Path, workdir: Path, result: dict) -> str | None:
  """The warning for an --output_dir whose eval_results.json, an earlier evaluation of the
  same run (`check_output_dir` refuses another run's), this one replaces with a score at
  another step or config.eval (eval.py --config.eval.step=30 into the directory of step
  20's): said, as the file is a result someone kept there. None where it was the same
  evaluation, there was none, or the directory is the workdir (the run's own result, whose
  replacing `check_own_result` rules)."""
  if output_dir.resolve() == Path(workdir).resolve():
    return None
  earlier = results_in(output_dir)
  if earlier is None:
    return None
  changes = []
  if earlier.get('step') != result['step']:
    changes.append(f'step {earlier.get("step")} -> {result["step"]}')
  settings = earlier.get('eval') if isinstance(earlier.get('eval'), dict) else {}
  changes += config_changes(settings, result['eval'], 'eval', '{field} {before!r} -> {after!r}')
  if not changes:
    return None
  return f'replacing the evaluation in {output_dir / RESULTS_FILE} ({"; ".join(changes)})'
