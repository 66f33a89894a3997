"""The config a run recorded in its workdir, read back for the tools that start from it
(`read_config`), and the check every command that takes a workdir makes first: that the run
there is of the command's task (`check_task`); eval.py, which takes a config, also checks that
it builds the model the run trained (`check_model`). Recording the config, and the check that
a rerun matches it, is `relpos.config.recorded`.

The directories a command is given are told apart here too, by both of a run's records: a
sweep's root, or a directory that holds only an evaluation, is no run (`not_a_run`), and eval.py's
--output_dir must hold nothing the evaluation would overwrite (`check_output_dir`). The results
file itself (eval_results.json) and the rules of an evaluation that writes one are
`relpos.training.run_results`, which this module reads and which reads nothing of it.
"""

import errno
import os
from pathlib import Path

import ml_collections

from relpos.config.model_fields import EVALUATION_FREE_FIELDS
from relpos.config.recorded import (
  CONFIG_FILE,
  changes_from_recorded,
  check_known_fields,
  config_changes,
  read_recorded,
  section_changes_from_recorded,
)
from relpos.faults import TaskMismatchError
from relpos.files import dangling_link
from relpos.training import data_record
from relpos.training.run_results import (
  RESULTS_FILE,
  foreign_checkpoint,
  recorded_divergence,
  results_in,
)


def not_a_workdir(workdir, flag: str | None = '--workdir') -> FileNotFoundError:
  """The error of a workdir that is no directory (missing, or a file), for the commands that
  read a run: `flag` as in `read_config`."""
  given = f'{flag}={workdir}' if flag else str(workdir)
  return FileNotFoundError(f'{given} is not a directory: give the workdir of a training run')


def check_not_a_file(workdir) -> None:
  """Raises `not_a_workdir` where `workdir` is a file (or anything but a directory), or a file
  is in the way of one of its parents (`<file>/sub`, also through a symbolic link to a file):
  for the commands that read a run, before any file under it is read (a read of workdir/x
  through a file is a NotADirectoryError traceback). The readers' rule, as `read_config`
  says it for the tools (`relpos.tools.sample`, `.translate`); `check_path`, run first, names
  the paths the OS refuses otherwise. A missing workdir is left to the check of what the
  command reads first (`restore.check_trained`: no checkpoint, train first)."""
  try:
    is_directory = Path(workdir).is_dir()
    os.stat(workdir)
  except NotADirectoryError:  # a file in the way of a parent (ENOTDIR)
    raise not_a_workdir(workdir) from None
  except OSError:
    return  # missing (or a path `check_path` names)
  if not is_directory:
    raise not_a_workdir(workdir)


def check_path(workdir, flag: str | None = '--workdir') -> None:
  """Raises ValueError naming `workdir` (given as `flag`) when the OS refuses the path itself,
  not just its absence: a name too long, a loop of symbolic links, a file in the way of a
  parent directory, a symbolic link (the path or a parent) to something that does not exist
  (`dangling_link`). Path's own tests (is_dir, is_file) raise on some of these and answer False
  to others, so the commands would fail later with a traceback or a wrong reason."""
  given = f'{flag}={workdir}' if flag else str(workdir)
  try:
    Path(workdir).resolve(strict=False)
    os.stat(workdir)
  except FileNotFoundError:
    if problem := dangling_link(workdir):
      raise ValueError(f'{given}: {problem}') from None
    return  # not made yet: train.py makes it, a reader says it is not a directory
  except RuntimeError:  # Path.resolve's "Symlink loop" (Python 3.11)
    raise ValueError(f'{given}: a loop of symbolic links; give another path') from None
  except OSError as error:
    if error.errno == errno.ENOTDIR:
      return  # a file in the way: train.py and the readers name it as such
    raise ValueError(f'{given}: {error.strerror}; give another path') from None


def has_run(workdir) -> bool:
  """Whether a run has started training in `workdir`: it records its config once its checkpoint
  (if any) restored, right before its first step (`relpos.training.loop`). What a start that
  failed before that made (a vocabulary of other data) binds no later run: the loop removes it
  (`workdir_setup.remove_unrecorded`), and the character LM makes its vocabulary again unless a run
  trained with it; an spm.model there before the first run was placed, and is used, unless
  relpos marked it as one it trained (`files.made_here`: a killed start's, trained again)."""
  return (Path(workdir) / CONFIG_FILE).is_file()


def read_config(
  workdir, flag: str | None = '--workdir', *, known_fields: bool = True
) -> ml_collections.ConfigDict:
  """The config a run recorded in workdir/config.json (what the tools that read a finished run
  start from). `flag` names the command-line flag that gave workdir, for the error (None: a
  positional argument); `known_fields`: as in `relpos.config.recorded.read_recorded`.

  Raises:
    FileNotFoundError: no such directory, or no config.json in it.
    ValueError: config.json is damaged, or holds a field this version does not know.
  """
  check_path(workdir, flag)
  workdir = Path(workdir)
  if not workdir.is_dir():
    raise not_a_workdir(workdir, flag)
  path = workdir / CONFIG_FILE
  if not path.is_file():
    given = f'{flag}={workdir}' if flag else str(workdir)
    raise FileNotFoundError(
      not_a_run(workdir, given)
      or f'{path} does not exist: {workdir} holds no relpos run (train first)'
    )
  return ml_collections.ConfigDict(read_recorded(path, known_fields=known_fields))


def not_a_run(directory, given: str) -> str | None:
  """What a directory without a run of its own holds, when it is one relpos writes that a tool
  may be given by mistake, as the one line that says so and which directories to give (the
  directory as `given` on the command line); None for any other.

  A sweep's root (`relpos.studies.sweep`: sweep.csv, sweep.md, or `<field>=<value>/seed=<s>`
  folders) holds one run per value and seed; an evaluation's output directory (eval.py
  --output_dir, a sweep's eval-field value or `--evaluations` setting) holds only
  eval_results.json, whose `checkpoint` names the run it scored."""
  directory = Path(directory)
  runs = sweep_runs(directory)
  if runs is not None:
    trained = [run for run in runs if (run / CONFIG_FILE).is_file()] or runs
    example = f', such as {trained[0]}' if trained else ''
    return f'{given} is the root of a sweep, not a run: give its run directories{example}'
  results = results_in(directory)
  if results is None:
    return None
  checkpoint = results.get('checkpoint')
  if isinstance(checkpoint, str):
    run = f'the run in {Path(checkpoint).parent.parent}: give that directory'
  else:  # a sweep's record of a diverged run
    run = "a run: give the run's directory (a sweep of an eval field trains in trained/seed=<s>)"
  return f'{given} holds only an evaluation ({RESULTS_FILE}) of {run}'


# How relpos.studies.sweep lays out its root (`sweep_grid.run_dir`, `model_dir`,
# `sweep_tables.write_tables`), here where the commands that take a workdir tell a sweep's root
# from a run: a run directory of each value and seed, an eval field's one training of each seed,
# and the tables.
SWEEP_RUNS = '*=*/seed=*'
SWEEP_TRAINED = 'trained'
SWEEP_TABLES = ('sweep.csv', 'sweep.md')


def sweep_runs(directory) -> list[Path] | None:
  """The run directories (`<field>=<value>/seed=<s>`, an eval field's `trained/seed=<s>`) of
  the sweep whose root `directory` is (`relpos.studies.sweep`: those folders, or its tables,
  sweep.csv and sweep.md), maybe none; None where `directory` is no sweep's root."""
  directory = Path(directory)
  runs = sorted(directory.glob(SWEEP_RUNS)) + sorted(directory.glob(f'{SWEEP_TRAINED}/seed=*'))
  if runs or any((directory / name).is_file() for name in SWEEP_TABLES):
    return runs
  return None


def check_task(
  workdir, task: str | None, *, flag: str | None = '--workdir', needs: str | None = None
) -> ml_collections.ConfigDict | None:
  """The config recorded in `workdir`, after checking that its run is of `task`: the one
  check of every command that takes a workdir (train.py, eval.py, relpos.tools.translate and
  .sample, relpos.studies.plot, .sweep and .shaw_tables), made before anything else, so that
  a mismatch is named as such rather than as the first file the other task lacks. None when
  the workdir records no run (yet); `task` None checks only that its config.json is a relpos
  run's (another program's, with no task, was 'a run of task None'). `flag`:
  as in `read_config`; `needs`: what reads `task` runs, for the message of a command that
  takes no config (default: the config's task). The message names each task as configs spell
  it (config.task: 'translate', 'char_lm'), never a paraphrase of it.

  Raises:
    TaskMismatchError: the recorded run is of another task, or config.json records no task.
    ValueError: `workdir` cannot be a directory's path (a name too long, a symlink loop), or
      its config.json is damaged or holds a field this version does not know.
  """
  check_path(workdir, flag)
  path = Path(workdir) / CONFIG_FILE
  if not path.is_file():
    return None
  # Its fields are checked once its task is: another task's fields are not this one's.
  recorded = read_config(workdir, flag, known_fields=False)
  kind = recorded.get('task')
  given = f'{flag}={workdir}' if flag else str(workdir)
  if kind is None:  # another program's config.json (a HuggingFace model's, say): no run's task
    raise TaskMismatchError(
      f"{given}: {path} is not a relpos run's config (it has no task): give the directory of a "
      'relpos run, or an empty or new directory to train in'
    )
  if task is not None and kind != task:
    todo = (
      f'({needs}): give the workdir of a run of task {task!r}'
      if needs
      else f"(the config's task is {task!r}): give the workdir of a run of task {task!r}, or a "
      f'config of task {kind!r} for this one'
    )
    raise TaskMismatchError(f'{given} holds a run of task {kind!r}, not {task!r} {todo}')
  check_known_fields(recorded.to_dict(), path)
  return recorded


def data_changes(
  workdir, config: ml_collections.ConfigDict, files: dict[str, Path], free: tuple[str, ...] = ()
) -> list[str]:
  """The config.data fields that differ from the run's in `workdir` (each 'data.<field>:
  trained <old>, given <new>'): an evaluation may score other data, but should say so. A path
  of `files` (the task's data files, `Task.data_files`) given otherwise but naming the run's
  data (its file, or its bytes) is none: `data_record.same_data`, the rule a resume's config
  check follows too. `free`: config.data fields left out (`Task.training_only_data`)."""
  same = data_record.same_data(workdir, files)
  return section_changes_from_recorded(config, workdir, 'data', free, same_data=same)


def run_config_changes(
  workdir, config: ml_collections.ConfigDict, files: dict[str, Path]
) -> list[str]:
  """The changes from the config the run in `workdir` recorded to `config`, outside config.eval
  (`changes_from_recorded`), a path of `files` (`Task.data_files`) that names the run's data
  read as the run's (`data_record.same_data`), as a resume reads it: `data_changes`' twin for
  the whole config, for the sweep's checks of a run it would keep or resume."""
  return changes_from_recorded(config, workdir, data_record.same_data(workdir, files))


def check_model(workdir, config: ml_collections.ConfigDict, unread: tuple[str, ...] = ()) -> None:
  """Checks that `config` builds the model the run in `workdir` trained (its config.json; a
  workdir without one, of an older run, is not checked): a checkpoint restored into another
  model is scored as a model it never was when the parameters' shapes happen to agree (e.g.
  'absolute' read as 'none'). Fields that only say how the model is trained or computed
  (`EVALUATION_FREE_FIELDS`), the sections outside config.model, and `unread` (the fields of
  config.model its position scheme never reads, the task's `unread_fields`: a sweep script that
  passes model.max_relative_position to every scheme trains a t5 run with one value and scores
  it with another) may differ. `unread` is the given config's: where its position is not the
  run's, that line refuses it whatever the other fields say.

  Raises:
    ValueError: naming each field that differs, with both values.
  """
  changes = section_changes_from_recorded(
    config, workdir, 'model', (*EVALUATION_FREE_FIELDS, *unread)
  )
  if changes:
    raise ValueError(
      f'--workdir={workdir} holds a run of another model than the config builds '
      f'({"; ".join(changes)}): give the config it was trained with '
      f'({Path(workdir) / CONFIG_FILE} records it, and eval.py without --config reads it)'
    )


def check_unread_settings(
  config: ml_collections.ConfigDict, unread: tuple[str, ...], trained: dict | None, remedy: str
) -> None:
  """Refuses an evaluation setting the run's model never reads (`unread`: the task's
  `unread_run_fields`, e.g. 'eval.clamp_len' on a model other than xl) given otherwise than the
  run has it (`trained`: its config as a dict, None: unknown, not checked; `remedy`: the way
  out the message ends with, the caller's): it was scored as the run's setting and recorded in
  eval_results.json as if it had been used. The run's own value passes (a config file's value
  for every scheme: enwik8_base's eval.clamp_len 820), as train.py's field check
  (`Task.check_combinations`) lets the defaults through. eval.py checks it against config.json
  (`Task.evaluate`), a sweep its `--evaluations` against each swept config before anything
  trains (`sweep._check_evaluation`, whose remedy names the swept values that read it).

  Raises:
    ValueError: naming each such field, both values and the position.
  """
  if trained is None:
    return
  ignored = {name: None for name in config.eval if f'eval.{name}' not in unread}
  changes = config_changes(
    trained.get('eval', {}) | ignored,
    config.eval.to_dict() | ignored,
    'eval',
    '{field}: trained {before!r}, given {after!r}',
  )
  if changes:
    raise ValueError(
      f'{"; ".join(changes)}: config.model.position={config.model.position!r} never reads '
      'it, so the score would be the same and eval_results.json would record the setting as '
      f'used; {remedy}'
    )


def check_output_dir(output_dir, workdir) -> None:
  """Checks that the directory eval.py writes eval_results.json (and translations) into,
  `--output_dir` or, where it is None, the workdir, holds nothing the evaluation would destroy:

  - another run, whose files the evaluation would overwrite with a score of `workdir`'s
    model: a run's config.json or checkpoints, or an eval_results.json scored from another
    workdir (a sweep's --collect_only would then tabulate it as that run's own), or a sweep's
    root (`sweep_runs`), refused as --workdir too (`not_a_run`): an eval_results.json there
    is no run's and reads as one of its runs to the tools given the root. The workdir
    itself, a new directory, or one of earlier evaluations of the same workdir (a sweep's
    `<run>/<setting>`, an eval field's `<field>=<v>/seed=<s>`) are fine.
  - a sweep's record that the run diverged (`recorded_divergence`), which a score of its last
    finite checkpoint would replace: the sweep, and anyone reading the file, would then take
    that score for the run's result. It is scored into another directory instead.

  Raises:
    ValueError: naming the directory and what it holds.
  """
  given = '--workdir' if output_dir is None else '--output_dir'
  output_dir = Path(workdir if output_dir is None else output_dir)
  check_path(output_dir, given)
  if not output_dir.is_dir():
    return
  if output_dir.resolve() != Path(workdir).resolve():
    held = [name for name in (CONFIG_FILE, 'checkpoints') if (output_dir / name).exists()]
    results = results_in(output_dir)  # none, or damaged: nothing of another run's to keep
    checkpoint = (
      None if held or results is None else foreign_checkpoint(results, workdir, output_dir)
    )
    runs = sweep_runs(output_dir)
    if held or checkpoint or runs is not None:
      if runs is not None:
        example = f', such as {runs[0]}' if runs else ''
        what = f"a sweep's runs and tables (it is the root of a sweep{example})"
      elif held:
        what = f'another run (its {" and ".join(held)})'
      else:
        what = f'the evaluation of another run ({RESULTS_FILE} scored {checkpoint})'
      raise ValueError(
        f'--output_dir={output_dir} holds {what}, which this evaluation of --workdir={workdir} '
        'would overwrite: give a directory of its own (a new one is made), or leave '
        '--output_dir out to write into the workdir'
      )
  if diverged := recorded_divergence(output_dir):
    step, record = diverged
    other = 'another ' if given == '--output_dir' else ''
    raise ValueError(
      f"{record} records that its run diverged at step {step} (a sweep's record, in place of a "
      f'score), which this evaluation would overwrite: give {other}--output_dir to score the '
      "run's last finite checkpoint there"
    )
