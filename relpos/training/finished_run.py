"""Whether a run is finished: trained with a config to its last step and scored with that
config's evaluation settings, its eval_results.json current. One rule for the two commands that
leave such a run as it is: a sweep keeps each finished run of its grid (`relpos.studies.sweep`),
and train.py, rerun in a finished run's workdir, prints that the run is finished and its result
kept, without reading any data (`kept_result`, `Task.train_and_evaluate`): the rerun re-read and
re-encoded all the training data and then scored the run again, the same score, for minutes on
a large corpus. A finished run whose result is stale is scored again by both, train.py after
one line naming the reason (the text the sweep's --collect_only warns with).

The rule (`stale_reason`) reads only the workdir's own records (config.json, data_files.json,
eval_results.json and the translations it names) and stats the data files: what a result is of
is the config the run trained with and the data files it recorded, the data it scored, the step,
config.eval and the compute dtype, and the files it names must be the ones it scored.

A module of its own, beside `relpos.training.run_results` (the results file and the rules of an
evaluation that writes one) and `relpos.training.run_config` (the config the run recorded): it is
the one rule that joins the two records with the task (its data files, its metric), and a
decision about a run (keep it, or train and score it again), not about a file. run_config reads
run_results (a directory that holds only an evaluation is no run), so this rule, which reads
both, could live in neither without the two importing each other.
"""

import hashlib
from pathlib import Path

import ml_collections

from relpos.config.model_fields import SCORE_CHANGING_FIELDS
from relpos.config.recorded import with_added
from relpos.messages import warn
from relpos.training import data_record, run_config, run_results
from relpos.training.checkpoints import finished_steps
from relpos.training.run_results import DIVERGED, RESULTS_FILE


def is_finished(task, results_dir: Path, config, trained_dir: Path) -> bool:
  """Whether the model in `trained_dir` was trained with `config` (of `task`) to the end and
  scored into `results_dir` with its config.eval (a run with another config is not: training it
  again says so). A result that is not this config's, of a model that is, is scored again
  after one line naming why, train.py's (`kept_result`): a sweep scored it again (a full test
  pass, for translation) without a word."""
  path = results_dir / RESULTS_FILE
  if not path.exists():
    return False
  if trained_change(task, config, trained_dir):
    return False  # the sweep's `check_rerun` refuses it, naming the change
  results = results_or_reason(path)
  if isinstance(results, str):  # damaged: cut by a kill mid-write (before atomic writes)
    warn(f'{results}; scoring that run again')
    return False
  if reason := result_change(task, path, results, config, trained_dir):
    print(f"{path} is not this config's result ({reason}): scoring it again", flush=True)
    return False
  return True


# How many changes a stale line names: the first ones, then '...' (a config changed in twenty
# fields is told by a few of them; config.json and data_files.json hold the rest).
SHOWN_CHANGES = 3


def shown(changes: list[str]) -> str:
  """`changes` as a stale line names them: the first `SHOWN_CHANGES`, '; ...' for the rest."""
  rest = '; ...' if len(changes) > SHOWN_CHANGES else ''
  return '; '.join(changes[:SHOWN_CHANGES]) + rest


def stale_reason(
  task, results_dir: Path, config, trained_dir: Path, results: dict | None = None
) -> str | None:
  """Why the eval_results.json in `results_dir` is not that of `config`'s run (of `task`), or
  None when it is (`is_finished`): the model trained with another config or on data changed
  since (`trained_change`), the file damaged, or the result not the model's as `config`
  scores it (`result_change`). `results`: what the file holds, where the caller has read it
  (`relpos.studies.sweep_tables.read_runs`, for the sweep's `warn_stale`); else it is read
  here."""
  if reason := trained_change(task, config, trained_dir):
    return reason
  path = results_dir / RESULTS_FILE
  if results is None:
    results = results_or_reason(path)
    if isinstance(results, str):
      return results
  return result_change(task, path, results, config, trained_dir)


def trained_change(task, config, trained_dir: Path) -> str | None:
  """Why the model in `trained_dir` is not `config`'s (of `task`), None where it is: it trained
  with another config, or on a data file changed since (`data_record.changes`, a training file
  too: train.py refuses to resume such a run, and a sweep kept it finished while a new value
  trained on the changed file, its tables mixing two corpora). A data path given otherwise than
  the run recorded it that names its data (another clone's copy of the corpus, say) is the
  run's (`data_record.same_data`, as a sweep's `check_rerun`, train.py and eval.py read it).
  These are what train.py's own checks refuse, or with --allow_config_change warn of, before
  it trains (`loop.train`): no result of such a run is kept."""
  files = task.data_files(config, trained_dir)
  if changes := run_config.run_config_changes(trained_dir, config, files):
    return f'its model trained with another config ({shown(changes)})'
  if changes := data_record.changes(trained_dir, files):
    return f'a data file changed since its model trained ({shown(changes)})'
  return None


def results_or_reason(path: Path) -> dict | str:
  """What the eval_results.json at `path` holds (`run_results.read_results`), or, where it is
  damaged (cut by a kill mid-write, before results were written whole), the reason that says
  so, as `stale_reason` gives it. An OSError reading it is raised."""
  try:
    return run_results.read_results(path)
  except ValueError as error:  # `read_results`' line: the file, and what is wrong in it
    return str(error)


def result_change(task, path: Path, results: dict, config, trained_dir: Path) -> str | None:
  """Why `results`, what the eval_results.json at `path` holds, is not the result of the model
  in `trained_dir` as `config` scores it, None where it is (or where it records a divergence:
  the same training config diverges again, whatever config.eval scores it): scored from a
  checkpoint of another workdir (`eval.py --output_dir` pointed here), lacking what a sweep's
  tables read of it (`run_results.missing_table_fields`), on other data than the run's (the
  config.data it records: `scored_data_changes`), at another step, with another
  config.eval or in another compute dtype (`computation_changes`), or naming a file (its
  translations) that is gone or holds other text than it scored (`result_file_change`). A
  data path given otherwise that names the run's data is the run's (`data_record.same_data`):
  such a result is kept."""
  if checkpoint := run_results.foreign_checkpoint(results, trained_dir, path.parent):
    return f'{path} was scored from {checkpoint}, not from a checkpoint of {trained_dir}'
  if DIVERGED in results:
    return None  # its training config diverges again, whatever config.eval scores it
  if missing := run_results.missing_table_fields(results, task.metric):
    return f'{path} has no {", ".join(missing)} (written by an older relpos)'
  if changes := scored_data_changes(task, results, config, trained_dir):
    return f"scored on other data than the run's ({shown(changes)})"
  current = config.eval.to_dict()
  recorded = {'task': config.task, 'eval': results.get('eval', {})}
  scored = with_added(recorded, {'eval': current})['eval']
  step = config.eval.get('step') or config.train.steps  # eval.step 0: the newest checkpoint
  if results.get('step') != step:
    return f'scored at step {results.get("step")}, not {step}'
  if scored != current:
    changed = sorted(name for name in current if scored.get(name) != current[name])
    return f'scored with other config.eval fields ({", ".join(changed)})'
  if changed := computation_changes(results, config):
    return f'scored with other config.model fields ({", ".join(changed)})'
  return result_file_change(task, results, path.parent)


def computation_changes(results: dict, config) -> list[str]:
  """The fields of config.model that change an evaluation's numbers
  (`model_fields.SCORE_CHANGING_FIELDS`: the compute dtype) that `results` (an
  eval_results.json) records otherwise than `config` has them: a float32 run's result scored
  in bfloat16 (eval.py --output_dir, the result copied or moved) is not its own. Results
  written before these were recorded are not compared: those in a run's workdir were scored
  with its config.json's, but for an eval.py given another dtype there, which nothing on disk
  tells from the rest, and scoring every older run again costs more than that case."""
  recorded = results.get('model', {})
  return [
    name
    for name in SCORE_CHANGING_FIELDS
    if name in recorded and recorded[name] != config.model.get(name)
  ]


def result_file_change(task, results: dict, results_dir: Path) -> str | None:
  """What is wrong with a file an evaluation's `results` names (`Task.result_files`: the
  translations), None where each is there and holds what was scored: a file deleted since, or
  one whose bytes are not those the results record (`<key>_sha256`: written with
  eval_results.json, `Task._score_into`; a kill between the two, or an edit, changed it). A
  result kept with such a file named a file that is gone, or translations of which its BLEU
  is not the score (`results_dir`: the result's directory, `run_results.result_file`). Results
  written before the sha256 was recorded are read as written
  whole, if their file is there: they cannot be checked, and scoring every such run again
  (a full beam search each) for a kill in a moment of its evaluation costs more than it
  saves."""
  for key in task.result_files:
    if not isinstance(results.get(key), str):
      continue  # none recorded (a diverged run's record): nothing to check
    path = run_results.result_file(results, key, results_dir)  # where it moved with the result
    try:
      content = path.read_bytes()
    except OSError:
      return f'{path}, its {key}, is gone (or cannot be read)'
    recorded = results.get(f'{key}_sha256')
    if recorded is not None and recorded != hashlib.sha256(content).hexdigest():
      return f'{path} holds other {key} than it scored (not the sha256 it records)'
  return None


def scored_data_changes(task, results: dict, config, trained_dir: Path) -> list[str]:
  """The config.data fields that an evaluation's `results` (eval_results.json, which records
  the config.data it scored) scored otherwise than the run in `trained_dir` trained with, as
  `run_config.data_changes` names them ('data.eval_src: trained <a>, given <b>'; a path that
  names the run's file or bytes is no change: `data_record.same_data`, eval.py's rule; nor
  is a field only training reads, `Task.training_only_data`). Fields the record lacks
  (recorded before they existed, or before results recorded config.data) are read from
  `config`, so such a result is not named."""
  recorded = results.get('data')
  if not isinstance(recorded, dict):
    return []
  scored = ml_collections.ConfigDict(config.to_dict())
  with scored.data.ignore_type():  # a value of another type is a change, named as such
    scored.data.update({name: value for name, value in recorded.items() if name in scored.data})
  files = task.data_files(scored, trained_dir)
  return run_config.data_changes(trained_dir, scored, files, free=task.training_only_data)


def trained_to_the_end(config, workdir: Path) -> bool:
  """Whether the run in `workdir` is finished: its newest checkpoint is at config.train.steps
  (a rerun trains nothing; `kept_result`, and the loop's line for a finished run on changed
  data)."""
  return finished_steps(workdir)[-1:] == [config.train.steps]


def kept_result(task, config, workdir: Path, score_command: str) -> dict | None:
  """What train.py does in the workdir of a finished run (its newest checkpoint at
  config.train.steps, the workdir its own results directory): where its eval_results.json is
  this config's (`stale_reason`, the sweep's rule), prints one line saying that the run is
  finished and its result kept, naming eval_results.json and the eval.py command
  (`score_command`) that scores it again, and returns the result it holds, which the launcher
  prints as after an evaluation (the metric last). Where the result is stale for a reason of
  the result (`result_change`, or the file damaged), one line names that reason (the text a
  sweep's --collect_only warns with) and says that the run is scored again: the rerun replaced
  the run's eval_results.json without a word of why.

  None, for train.py to go on as for any run (resume, score, or refuse), where the run is not
  trained to its last step, has no eval_results.json (stopped in its final evaluation), its
  model is not this config's (`trained_change`: train.py's own checks refuse it, or with
  --allow_config_change warn, naming the change), its result is stale, its result is a
  sweep's record of a divergence (a rerun trains to the divergence and says so), or the
  result lacks what the task's lines show (written by an older relpos: scored again).
  eval_results.json, config.json and data_files.json are each read once."""
  workdir = Path(workdir)
  if not workdir.is_dir():  # a file in its place or a parent's: train.py's lines name it
    return None  # (`workdir_setup.prepare_workdir`), before any file under it is read
  if not trained_to_the_end(config, workdir):
    return None  # training is not done: its newest checkpoint was removed since, say
  path = workdir / RESULTS_FILE
  if not path.exists() or trained_change(task, config, workdir):
    return None
  result = results_or_reason(path)
  reason = result if isinstance(result, str) else result_change(task, path, result, config, workdir)
  if reason:
    print(
      f'the run in {workdir} is trained to step {config.train.steps}, but {path} is not this '
      f"config's result ({reason}): scoring it again",
      flush=True,
    )
    return None
  if DIVERGED in result:
    return None
  try:
    task.result_lines(result)
  except (KeyError, TypeError, ValueError):  # a field missing, or null where a number goes
    return None
  print(
    f'the run in {workdir} is finished (step {result["step"]}, this config) and scored: its '
    f'{path} is kept, nothing is trained or scored again; `{score_command}` scores it again',
    flush=True,
  )
  return result
