"""A run's results: its eval_results.json, and the rules of an evaluation that writes one.

The file (`RESULTS_FILE`): its one reader (`read_results`, `results_in`), what a sweep's tables
read of it (`TABLE_FIELDS`), the scores it may not hold (`non_finite_scores`), a sweep's record of
a divergence in place of a score (`DIVERGED`, `recorded_divergence`), and whose result it is, and
where its files are, once runs move (`WRITTEN_TO`, `foreign_checkpoint`, `result_file`). The rules
of an evaluation that writes one (`Task.evaluate`): a newer result of the run in its directory is
kept (`newer_result`); into the workdir only the run's own result is written, of its data,
config.eval and compute (`check_own_result`, `other_evaluation`, `other_computation`); a run
trained but left unscored names the eval.py command that scores it (`UnscoredRunError`,
`generic_score_command`, `last_checkpoint`).

What a run recorded of its config (config.json) is `relpos.training.run_config`, with the checks
of the directories a command is given, which read both records (a directory holding only an
evaluation is no run, `run_config.not_a_run`; eval.py's --output_dir holds nothing it would
overwrite, `run_config.check_output_dir`): it reads this module, never the other way round.
Whether a run is finished and its result current, the rule that joins the two records and the
task's data files, is `relpos.training.finished_run`.
"""

import json
import math
import os
from pathlib import Path

import ml_collections

from relpos.config.model_fields import SCORE_CHANGING_FIELDS
from relpos.config.recorded import CONFIG_FILE, config_changes, with_added
from relpos.training import data_record
from relpos.training.checkpoints import CHECKPOINTS, finished_steps

RESULTS_FILE = 'eval_results.json'


def read_results(path) -> dict:
  """The eval_results.json at `path` as a dict: the one reader of the file (`results_in`, the
  test of a finished run, `finished_run.stale_reason`, and the sweep's tables,
  `relpos.studies.sweep_tables.read_runs`).

  Raises:
    ValueError: naming the file, where it is damaged: not JSON (cut by a kill mid-write, before
      results were written whole), not UTF-8, no JSON object, or a score that is no finite
      number (`non_finite_scores`) where no divergence is recorded.
    OSError: where it cannot be read (FileNotFoundError: there is none).
  """
  try:
    results = json.loads(Path(path).read_text())
  except ValueError as error:  # json.JSONDecodeError, UnicodeDecodeError
    results = error
  if not isinstance(results, dict):
    raise ValueError(
      f'{path} is damaged ({results if isinstance(results, Exception) else "not an object"})'
    )
  if DIVERGED not in results and (bad := non_finite_scores(results)):
    raise ValueError(
      f'{path} is damaged (no finite number in {", ".join(bad)}, and no {DIVERGED} record)'
    )
  return results


# The keys of eval_results.json a sweep's tables read of a result of each metric
# (`relpos.studies.sweep_tables`): the score, and the test items its paired bootstrap pairs
# (`sweep_tables.p_value`: bpc's segments, BLEU's translations). A result without one (written
# before it was recorded: segment_nats before 2026-11-24) cannot be tabulated: the sweep's
# --collect_only says so (`sweep_tables.collect`), and a rerun scores the run again
# (`finished_run.result_change`).
TABLE_FIELDS = {'bpc': ('bpc', 'segment_nats', 'segment_tokens'), 'bleu': ('bleu', 'translations')}


def missing_table_fields(results: dict, metric: str) -> list[str]:
  """The keys of `TABLE_FIELDS` (for `metric`; the metric alone for another) that `results`
  (eval_results.json) lacks."""
  return [key for key in TABLE_FIELDS.get(metric, (metric,)) if key not in results]


# The sections of eval_results.json that record settings, not scores (config.eval, config.data,
# and of config.model the fields that change the score, `model_fields.SCORE_CHANGING_FIELDS`).
SETTINGS = ('eval', 'data', 'model')


def non_finite_scores(results: dict) -> list[str]:
  """The keys of `results` (eval_results.json) outside `SETTINGS` whose number, or a number of
  whose list, is NaN or infinite ('segment_nats[3]'). A finished evaluation writes none: its
  model's loss was finite, and a run whose loss went non-finite is recorded as diverged
  (`DIVERGED`) by a sweep, or ends train.py with an error line. Such a number (an edit, another
  tool's file) read as a score made every mean it joined NaN, and the sweep's bootstrap read
  NaN differences as significant (p < 0.001)."""
  bad = []
  for key, value in results.items():
    if key in SETTINGS:
      continue
    numbers = value if isinstance(value, list) else [value]
    for index, number in enumerate(numbers):
      if isinstance(number, float) and not math.isfinite(number):
        bad.append(f'{key}[{index}]' if isinstance(value, list) else key)
        break
  return bad


def results_in(directory) -> dict | None:
  """The eval_results.json in `directory` as a dict (`read_results`); None where there is none,
  or it cannot be read or is damaged (what a directory holds is told by it only when it is
  whole)."""
  try:
    return read_results(Path(directory) / RESULTS_FILE)
  except (OSError, ValueError):
    return None


# In a run's eval_results.json: the step its loss or parameters went non-finite at, recorded by
# a sweep (`relpos.studies.sweep.record_divergence`) in place of a score.
DIVERGED = 'diverged_at_step'


def recorded_divergence(*directories) -> tuple[int, Path] | None:
  """(the step, the file) where the eval_results.json of one of `directories` (first the
  first) records the run as diverged (`DIVERGED`); None where none does, or none can be read.
  train.py records nothing of a divergence (it stops with the error line): only a sweep's
  record says that a run's last checkpoint is its last finite one, short of its steps."""
  for directory in directories:
    results = results_in(directory)
    if results is not None and isinstance(results.get(DIVERGED), int):
      return results[DIVERGED], Path(directory) / RESULTS_FILE
  return None


WRITTEN_TO = 'written_to'  # eval_results.json's directory as it was written, resolved


def foreign_checkpoint(results: dict, workdir, results_dir) -> str | None:
  """The checkpoint an evaluation's `results` (the eval_results.json in `results_dir`) names,
  when it is not one of the run in `workdir`: `<w>/checkpoints/<step>` of another workdir w.
  None when it is the run's, or when the results name none (written before they recorded it).

  Runs and sweeps move (a root renamed, a run archived, copied from a cluster), so a result is
  the run's when the run's directory stands where it stood from the result's: the path from
  the directory it was written to (`WRITTEN_TO`, recorded since 2026-11-29) to the one its
  checkpoint was in is the path from `results_dir` to `workdir` now ('.' for a run's own
  result, '..' for a setting of a sweep's `<run>/<setting>`). A result written before that
  was recorded names its checkpoint as the evaluating process saw it: there w is the run's
  when it resolves to `workdir` or when its last two parts are `workdir`'s (the run's place
  in a sweep's root, `<field>=<v>/seed=<s>`, or under its parent), which a rename of the
  root keeps; another run's directory (`runs/c1`) differs there."""
  checkpoint = results.get('checkpoint')
  if not isinstance(checkpoint, str):
    return None
  scored = Path(os.path.normpath(checkpoint)).parent.parent  # <w>/checkpoints/<step> -> <w>
  own = Path(workdir).resolve()
  written = results.get(WRITTEN_TO)
  if isinstance(written, str) and scored.is_absolute():
    then = os.path.relpath(scored, written)
    now = os.path.relpath(own, Path(results_dir).resolve())
    return None if then == now else checkpoint
  tail = tuple(part for part in scored.parts if part not in ('/', '..'))[-2:]
  same = scored.resolve() == own or own.parts[len(own.parts) - len(tail) :] == tail
  return None if same else checkpoint


def result_file(results: dict, key: str, results_dir) -> Path:
  """Where the file an evaluation's `results` names under `key` (its translations) is now, for
  the eval_results.json in `results_dir`: written beside it, it moved with it, so it is found by
  its path from the directory the result was written to (`WRITTEN_TO`); a result written before
  that was recorded names it as it was written (an absolute path into a sweep's root before the
  root was renamed), and where that is gone, the file of that name beside the result is taken.
  """
  named = Path(results[key])
  written = results.get(WRITTEN_TO)
  if isinstance(written, str) and named.is_absolute():
    return Path(results_dir) / os.path.relpath(named, written)
  if named.exists():
    return named
  beside = Path(results_dir) / named.name
  return beside if beside.exists() else named


def newer_result(config, workdir: Path, output_dir: Path, step: int) -> str | None:
  """The warning for an evaluation of the newest checkpoint (config.eval.step 0), `step`,
  whose directory (`output_dir`) holds a result of the same run at a later step by now, or
  None: eval.py scoring a run that trains, slowly (a large test set), ended after train.py's
  final evaluation and replaced the run's result of its last step with an older, evicted
  checkpoint's, exit 0. Such a result (whose checkpoint is still there) is kept, and this
  one printed only; the read comes right before the write (a result written between the two
  is not seen: a race of milliseconds, where the evaluation's was minutes). An evaluation
  asked for an earlier step (config.eval.step) writes as before."""
  if config.eval.get('step'):
    return None
  results = results_in(output_dir)
  held = results.get('step') if results else None
  if not isinstance(held, int) or held <= step or held not in finished_steps(workdir):
    return None  # not newer, or its checkpoint gone since (removed as damaged, say)
  if foreign_checkpoint(results, workdir, output_dir):
    return None  # another run's: `run_config.check_output_dir` has refused it before scoring
  return (
    f'{output_dir / RESULTS_FILE} holds the score of step {held}, written while this '
    f'evaluation of step {step} ran (the run trained on and scored a newer checkpoint): kept, '
    f'and this score of step {step} is printed only, not written'
  )


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


def other_evaluation(config: ml_collections.ConfigDict, trained: dict | None) -> list[str]:
  """The config.eval fields `config` gives otherwise than the run recorded them (`trained`: its
  config.json as a dict; None, a run recorded before config.json, is not compared), each
  'eval.<field>: the run's <a>, given <b>'; fields recorded before they existed are read as
  their defaults (`with_added`). Every field counts, as the finished-run rule counts it
  (`finished_run.result_change`: a result scored with another config.eval is not the run's):
  config.eval holds only settings of the scoring."""
  return _given_otherwise(config, trained, 'eval')


def other_computation(config: ml_collections.ConfigDict, trained: dict | None) -> list[str]:
  """`other_evaluation`'s twin for the config.model fields an evaluation may set otherwise
  than its run (`run_config.check_model`) that change its numbers
  (`model_fields.SCORE_CHANGING_FIELDS`: the compute dtype), each 'model.<field>: the run's
  <a>, given <b>': a run trained in float32 and scored in bfloat16 has another score than its
  own. The others of `model_fields.EVALUATION_FREE_FIELDS` give the run's scores to rounding
  (the kernels, the layer loop, remat) or are not read by an evaluation (dropout, the
  initialisation)."""
  return _given_otherwise(config, trained, 'model', SCORE_CHANGING_FIELDS)


def _given_otherwise(config, trained: dict | None, section: str, names=None) -> list[str]:
  """The fields of config.<section> (those of `names`; None: all) that `config` gives
  otherwise than `trained` (the run's config.json as a dict; None: not compared) records them,
  fields recorded before they existed read as their defaults (`with_added`)."""
  if trained is None:
    return []
  recorded = with_added({'task': config.task, section: dict(trained.get(section, {}))}, None)
  before, after = recorded[section], config[section].to_dict()
  if names is not None:
    before, after = ({name: values.get(name) for name in names} for values in (before, after))
  return config_changes(before, after, section, "{field}: the run's {before!r}, given {after!r}")


def check_own_result(
  workdir: Path, other_data: list[str], other_eval: list[str], other_compute: list[str] = ()
) -> None:
  """Refuses an evaluation into the workdir itself (eval.py without --output_dir, or with the
  workdir as one) that is not the run's own: its eval_results.json and translations are the
  run's result, the score of the config.json it trained with (what train.py's final evaluation
  scored, and what a sweep's --collect_only tabulates as the run's), which such a score would
  replace in silence. `other_data`: the changes that alter what is scored
  (`Task.scored_data_changes`, each '<field>: ...'): another data.path of a char LM, another
  eval_src of a translation; a training file moved or another batch size
  (`Task.training_only_data`) scores the same sentences and is only warned of. `other_eval`:
  the config.eval fields given otherwise than the run's (`other_evaluation`: another step,
  beam, split, a clipped k). `other_compute`: the config.model fields given otherwise than the
  run's that change the numbers (`other_computation`: the compute dtype; eval.py scored a
  float32 run in bfloat16 over its result, exit 0). One rule for every task, and for each
  kind of change. train.py's rerun with another config.eval records it as the run's
  (`loop.train`) and does not come here.

  Raises:
    ValueError: naming the changes and --output_dir.
  """
  if not other_data and not other_eval and not other_compute:
    return
  scores, fields_named = [], []
  # A file rewritten at the run's own path is no field to give back (`data_record.changes`).
  rewritten = [line for line in other_data if f' {data_record.REWRITTEN} (' in line]
  if other_data:
    scores.append(f'other data than the run in {workdir} trained with ({"; ".join(other_data)})')
    if len(rewritten) < len(other_data):
      fields_named.append('data fields')
  if other_eval:
    scores.append(
      f'other config.eval settings than the run in {workdir} was scored with '
      f'({"; ".join(other_eval)})'
    )
    fields_named.append('config.eval fields')
  if other_compute:
    scores.append(
      f'in another config.model than the run in {workdir} trained and was scored with, '
      f'which changes its numbers ({"; ".join(other_compute)})'
    )
    fields_named += [f'config.{line.partition(":")[0]}' for line in other_compute]
  one_field = len(fields_named) == 1 and not fields_named[0].endswith(' fields')
  pronoun = 'it' if one_field else 'them'
  ways = ['give --output_dir=<a new directory> to score it there']
  if fields_named:
    ways.append(
      f"the run's {' and '.join(fields_named)} ({workdir / CONFIG_FILE} records {pronoun})"
    )
  if rewritten:
    ways.append('restore the data file as the run trained on it')
  raise ValueError(
    f"this evaluation scores {' and '.join(scores)}, and would replace the run's own result "
    f'({RESULTS_FILE}) with that score: {", or ".join(ways)}'
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
