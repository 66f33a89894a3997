"""Sweep one config field over values and seeds: train, evaluate, test, tabulate, plot.

    python -m relpos.studies.sweep --config=configs/translate_tiny.py:shaw --workdir=runs/k_sweep \\
        --values=0,1,2,4,16,64 --seeds=0,1,2
    python -m relpos.studies.sweep --config=configs/translate_tiny.py --workdir=runs/positions \\
        --field=model.position --values=shaw,absolute,shaw_absolute --seeds=0,1,2
    python -m relpos.studies.sweep --config=configs/translate_tiny.py --workdir=runs/ablation \\
        --field=preset --values=shaw,shaw_keys_only,shaw_values_only,none --seeds=0,1,2
    python -m relpos.studies.sweep --config=configs/char_tiny.py:xl --workdir=runs/eval_mem \\
        --field=eval.mem_len --values=0,64,192,512 --seeds=0,1,2
    python -m relpos.studies.sweep --config=configs/translate_tiny.py:shaw --workdir=runs/k_clip \\
        --field=eval.max_relative_position --values=-1,8,4,2,0 --seeds=0,1,2

This module is the command: its flags, its checks before anything trains, the training of
every unfinished run, the faults of its root and the tables it writes. Which runs a sweep has,
of which configs, in which directories (`--field=preset`, an eval field, `--evaluations`) is
`relpos.studies.sweep_grid`'s.

A run whose eval_results.json is there for the config's last step is not touched again, so a
sweep stopped anywhere (or spread over sessions) resumes where it was; an unfinished run
resumes from its last checkpoint. A run whose loss goes non-finite is a result too: its
eval_results.json records `diverged_at_step`, a warning names it, and the sweep goes on
(`record_divergence`). The sweep holds its root's workdir lock while it trains, so a second
sweep on the same root is refused at once.

Then the sweep writes under `<workdir>`:
- `sweep.csv` / `sweep.md`: one row per value, `value, n, mean, std, difference, p_value,
  p_seeds, diverged` (std over seeds, ddof 1; the difference over the seeds both have and both
  p-values against `--baseline`, the first value by default; how many of its runs diverged);
- `sweep_seeds.csv`: one row per run;
- `sweep.png`: the mean with ±std error bars;
- with `--by_source_length=4,6,8` or `--by_source_pieces=8,16,32` (translation) or
  `--by_position=1,4,8,16,32` (character LM), the same per bucket of source length in words
  or in pieces or of position within the evaluation segment: `sweep_by_length.*`,
  `sweep_by_pieces.*` or `sweep_by_position.*` (`relpos.studies.breakdown`).

With `--evaluations`, `sweep_by_evaluation.*` tabulates the swept values by setting with the
breakdowns' statistics (mean ± std, the difference from the baseline and both p-values per
setting); the other tables are the first setting's.

p_value is a paired bootstrap over the test items, seeds pooled (`relpos.studies.significance`):
sacreBLEU's test on the translations for BLEU, the same test over evaluation segments for
bits-per-char; other metrics get none. It holds the trained models fixed. p_seeds is a paired
t-test over the seeds' scores, for any metric: it holds the test set fixed and asks whether
the difference stands out from training's run-to-run spread (with 3 seeds, only a large and
consistent one does).

Everything that can be wrong is an error before any training: an unknown field or value, a
metric the task does not report, a field the model never reads at the swept values (k on an
absolute model), an `--evaluations` setting the config checks refuse for any value's model.
`--print_only` prints the train/eval command of every run instead (for a cluster);
`--collect_only` rebuilds the tables from finished runs, with a warning naming each result
that is not of the config as given (another training config, step or config.eval, or
scored from another workdir's checkpoint). Any `--config.*` override on this command line is
passed on to every run.
"""

import contextlib
import csv
import io
import json
import sys
import time
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

from relpos import flag_types, runtime
from relpos.config import checks
from relpos.files import (
  copy_with_source,
  made_here,
  read_text_lines,
  record_source,
  recorded_source,
  write_atomically,
)
from relpos.messages import warn
from relpos.studies import breakdown, significance, sweep_grid
from relpos.studies.figures import save as save_figure
from relpos.studies.figures import subplots
from relpos.training import (
  data_record,
  finished_run,
  loop,
  run_config,
  tasks,
  workdir_lock,
  workdir_setup,
)
from relpos.training.checkpoints import (
  UNWRITABLE,
  error_errno,
  error_path,
  filesystem_fault,
  is_write_fault,
)
from relpos.training.preemption import PreemptedError

SUMMARY_TABLE = 'sweep.csv'  # the first of the tables the sweep writes (`write_tables`)
SUMMARY_COLUMNS = ('value', 'n', 'mean', 'std', 'difference', 'p_value', 'p_seeds', 'diverged')
DIVERGED = run_config.DIVERGED  # in eval_results.json: the step the run went non-finite at


# The fields a sweep cannot vary, and why: what its runs share by construction, so that a
# value of one would not be a run of this sweep (its table, its metric, its seed axis).
UNSWEPT_FIELDS = {
  'seed': 'every run sets config.seed from --seeds, so each value would be the same run; give '
  'the seeds as --seeds and sweep another field',
  'task': "every run of a sweep is of its config's task, whose metric it tabulates; another "
  "task is another config file: sweep one of the task's fields, and compare tasks with a sweep "
  'of each',
}


def _check_evaluation(task, field: str, variants: list, setting: str, overrides: dict) -> None:
  """Checks what eval.py checks of the config it scores with (`Task.evaluate`) for
  --evaluations' `setting` on each swept config (`variants`: (value, config) pairs). A setting
  that only some of the swept models read (eval.clamp_len, xl's alone, over a model.position
  sweep) is refused for the others (`run_config.check_unread_settings`), naming the values that
  read it: sweep those alone with that setting, or drop it. It is not applied to a model that
  never reads it, which would record it in eval_results.json as used."""
  scored = []
  for value, variant in variants:
    try:
      scored.append((value, variant, sweep_grid.evaluated(variant, overrides)))
      task.check_config(scored[-1][2])
    except ValueError as error:
      raise ValueError(f'--evaluations={setting} for {field}={value}: {error}') from None

  def refusal(variant, config, remedy: str) -> str | None:
    try:
      unread = task.unread_run_fields(config)
      run_config.check_unread_settings(config, unread, variant.to_dict(), remedy)
    except ValueError as error:
      return str(error)
    return None

  refused = [
    (value, variant, config) for value, variant, config in scored if refusal(variant, config, '')
  ]
  if refused:
    refused_values = [value for value, _, _ in refused]
    readers = [str(value) for value, _, _ in scored if value not in refused_values]
    alone = f'sweep {field}={",".join(readers)} alone with it, or ' if readers else ''
    value, variant, config = refused[0]
    error = refusal(variant, config, f'{alone}drop it from --evaluations')
    raise ValueError(f'--evaluations={setting} for {field}={value}: {error}')


def check_sweep(
  config, field: str, values, seeds, metric: str, variant_of=None, evaluations=None
) -> None:
  """Raises ValueError for a sweep that cannot give its table, before anything trains: a
  metric the task does not report, a value the task's checks refuse, a field that the model
  does not read at any swept value (sweeping it would train one model n times), an
  `--evaluations` setting (`sweep_grid.parse_evaluations`) the checks refuse for the model of
  some value (a clip beyond its trained k, say: each run trained, then failed to score).
  `variant_of` (value -> config) replaces setting config.<field>
  (`sweep_grid.preset_variants`)."""
  task = tasks.get(config)
  if metric not in task.metrics:
    raise ValueError(
      f'--metric={metric}: a {config.task} run reports {", ".join(task.metrics)}, not {metric}'
    )
  if not seeds:
    raise ValueError('--seeds is empty: give at least one seed')
  if field in UNSWEPT_FIELDS:
    raise ValueError(f'--field={field}: {UNSWEPT_FIELDS[field]}')
  read_somewhere = variant_of is not None
  variants = []
  for value in values:
    try:
      variant = (
        sweep_grid.with_value(config, field, value) if variant_of is None else variant_of(value)
      )
      task.check_config(variant)
    except ValueError as error:
      raise ValueError(f'--field={field} at {value!r}: {error}') from None
    variants.append((value, variant))
  for setting, overrides in (evaluations or {}).items():
    _check_evaluation(task, field, variants, setting, overrides)
  for _, variant in variants:
    leaf = field.removeprefix('model.')
    if field.startswith('model.'):
      read_somewhere |= leaf not in task.unread_fields(variant)
    else:
      read_somewhere |= field not in task.unread_run_fields(variant)
  if not read_somewhere:
    position = config.model.position
    raise ValueError(
      f'--field={field}: config.model.position={position!r} does not read it, so every '
      'value would train the same model; sweep it with a position that does'
    )


def warn_stale(
  config, root: Path, field: str, values, seeds, variant_of, overrides, setting_runs
) -> set:
  """--collect_only: a `warning:` line for each result of `setting_runs` (`read_runs`' of
  every run at one --evaluations setting, whose eval fields are `overrides`) that is not of
  the sweep's config as given (`finished_run.stale_reason`, of the results `read_runs` read);
  returns them, {(value, seed)}. The tables show such a result as it is (its mean, std and seed
  test), but leave it out of the paired bootstrap over test items (`p_value`), which pairs
  each item of a run with the same item of the baseline's: a result scored with another
  config.eval (tgt_len, say) has other items, or other numbers of them, and one of another
  config is not the sweep's run to pair. Each setting's results are checked as they are
  tabulated (the first's before the tables, the others' for sweep_by_evaluation.*)."""
  stale, task = set(), tasks.get(config)
  every_run = sweep_grid.runs(config, field, values, seeds, variant_of)
  for (value, seed, variant), (_, _, path, results) in zip(every_run, setting_runs, strict=True):
    if results is None:
      continue  # `read_runs` named it
    workdir = sweep_grid.model_dir(root, field, value, seed)
    scored = sweep_grid.evaluated(variant, overrides)
    if reason := finished_run.stale_reason(task, path.parent, scored, workdir, results):
      stale.add((value, seed))
      warn(
        f'{field}={value} seed {seed}: tabulated as it is, though {reason}, and left out of '
        'the p-values over test items; the sweep without --collect_only trains or scores it '
        'again'
      )
  return stale


def record_divergence(error: loop.DivergedError, metrics, run: str, unscored) -> None:
  """A diverged run is a result of the sweep, not a fault of it: eval_results.json in each of
  the run's results directories (`unscored`: (config, directory) pairs) records the step
  (`DIVERGED`), what went non-finite, and null for every metric of the task, so a reader of the
  file alone cannot take it for a score (null, not NaN, which standard JSON has not). A rerun
  keeps it as finished (`finished_run.stale_reason`; the same config diverges again), and the
  tables leave it out with a note (`collect`, `diverged_runs`). One warning names the run (`run`,
  'field=value seed s') and the step."""
  for scored, results_dir in unscored:
    results_dir.mkdir(parents=True, exist_ok=True)
    record = {
      **dict.fromkeys(metrics),
      DIVERGED: error.step,
      'diverged': error.what,
      'eval': scored.eval.to_dict(),
    }
    write_atomically(results_dir / 'eval_results.json', json.dumps(record, indent=2))
  warn(
    f'{run} diverged ({error.what}); recorded in {unscored[0][1] / "eval_results.json"}, left '
    'out of the tables and p-values; the sweep goes on with the other runs'
  )


def check_rerun(trained, workdir: Path, task, run: str) -> None:
  """What train.py refuses when a run resumes (`relpos.config.recorded.check_config_change`,
  `relpos.training.data_record`), checked for every run before the first trains and told
  with the sweep's remedies (train.py's --allow_config_change is not the sweep's).

  Raises:
    ValueError: `workdir` holds a run trained with another config than `trained`, or on data
      files changed since; naming the run (`run`) and the changes.
  """
  files = task.data_files(trained, workdir)
  if changes := run_config.run_config_changes(workdir, trained, files):
    raise ValueError(
      f'{run}: {workdir} holds a run trained with another config ({"; ".join(changes)}): give '
      'the sweep a new --workdir for the new config, or the config its runs were trained with '
      f'({workdir / run_config.CONFIG_FILE} records it)'
    )
  if other_data := data_record.changes(workdir, files):
    raise ValueError(
      f'{run}: {workdir} holds a run trained on other data ({"; ".join(other_data)}): give the '
      'sweep a new --workdir to train on the data as it is now, or restore the data its runs '
      'trained on'
    )


def read_runs(root: Path, field: str, values, seeds, evaluation=None, *, task=None) -> list:
  """(value, seed, the path of its eval_results.json, what it holds or None where there is
  none) of every run, value-major, at the `--evaluations` setting `evaluation` if given: each
  file read once, for `warn_stale`, `collect` (whose rows carry it to the p-values, breakdowns
  and evaluation tables) and `diverged_runs`; a missing one is warned of as it is met. With
  `task`, a run directory that records a run of another task is a TaskMismatchError (a
  ValueError), before any result is read.

  Raises:
    ValueError: an eval_results.json is damaged (`finished_run.read_results`).
  """
  for value in values:
    for seed in seeds:
      for workdir in {
        sweep_grid.model_dir(root, field, value, seed),
        sweep_grid.run_dir(root, field, value, seed),
      }:
        run_config.check_task(workdir, task, flag=None)
  runs = []
  for value in values:
    for seed in seeds:
      path = sweep_grid.run_dir(root, field, value, seed, evaluation) / 'eval_results.json'
      if not path.exists():
        warn(f'no results for {field}={value} seed {seed} ({path})')
      runs.append((value, seed, path, _read_results(path) if path.exists() else None))
  return runs


def _read_results(path: Path) -> dict:
  """`finished_run.read_results`, whose error says what scores a damaged file again."""
  try:
    return finished_run.read_results(path)
  except ValueError as error:
    raise ValueError(
      f'{error}; the sweep command without --collect_only scores that run again'
    ) from None


def collect(runs: list, metric: str) -> list[dict]:
  """One row per run of `runs` (`read_runs`) with a score: value, seed, metric, step,
  workdir (its results directory), and results, what its eval_results.json holds, which the
  p-values, breakdowns and evaluation tables take from the row (`read_runs` read the file
  once). A run recorded as diverged has none (`diverged_runs` lists it).

  Raises:
    ValueError: a result lacks `metric`.
  """
  rows = []
  for value, seed, path, results in runs:
    if results is None or DIVERGED in results:
      continue
    if metric not in results:
      raise ValueError(f'{path} has no {metric!r} (it has {sorted(results)})')
    rows.append(
      {
        'value': value,
        'seed': seed,
        metric: results[metric],
        'step': results.get('step'),
        'workdir': str(path.parent),
        'results': results,
      }
    )
  return rows


def diverged_runs(runs: list) -> list[dict]:
  """One row per run of `runs` (`read_runs`) recorded as diverged (`record_divergence`), which
  `collect` leaves out: value, seed, the step it diverged at, its results directory."""
  return [
    {'value': value, 'seed': seed, DIVERGED: results[DIVERGED], 'workdir': str(path.parent)}
    for value, seed, path, results in runs
    if results is not None and DIVERGED in results
  ]


def write_diverged(rows: list[dict], root: Path, field: str) -> None:
  """The diverged runs (`diverged_runs`) beside the tables, which leave them out: a note under
  sweep.md's tables (printed too) and sweep_diverged.csv; with none, an earlier
  sweep_diverged.csv is removed."""
  path = root / 'sweep_diverged.csv'
  if not rows:
    path.unlink(missing_ok=True)
    return
  _write_csv(path, rows, ('value', 'seed', DIVERGED, 'workdir'))
  runs_text = '; '.join(
    f'{field}={value_label(field, row["value"])} seed {row["seed"]} at step {row[DIVERGED]}'
    for row in rows
  )
  note = (
    f'Diverged, so left out of the means and p-values above ({path.name}; each '
    f'eval_results.json records {DIVERGED}): {runs_text}.\n'
  )
  markdown = root / 'sweep.md'
  write_atomically(markdown, f'{markdown.read_text()}\n{note}')
  print(note)


def _pooled_items(config, metric: str, rows: list[dict]):
  """What the paired test of `metric` compares, per seed: {seed: items} of one value's rows."""
  items = {}
  for row in rows:
    results = row['results']
    if metric == 'bleu':
      items[row['seed']] = read_text_lines(results['translations'])
    else:
      items[row['seed']] = (results['segment_nats'], results['segment_tokens'])
  return items


def p_value(config, metric: str, baseline: list[dict], candidate: list[dict]) -> float | None:
  """The paired bootstrap p-value of `candidate`'s runs against `baseline`'s on the seeds both
  have, pooled (module docstring), leaving out the rows marked stale (`warn_stale`) and the
  seeds whose items do not pair (bpc's segments of other lengths: a sweep of eval.tgt_len
  scores other segments at each value); None for metrics without a test, or with no seed left
  to pair."""
  if metric not in ('bleu', 'bpc'):
    return None
  baseline, candidate = (
    [row for row in rows if not row.get('stale')] for rows in (baseline, candidate)
  )
  base, other = _pooled_items(config, metric, baseline), _pooled_items(config, metric, candidate)

  def paired(seed) -> bool:  # bpc: (nats, tokens) per segment; BLEU: a line per sentence
    if metric == 'bpc':
      return list(base[seed][1]) == list(other[seed][1])
    return len(base[seed]) == len(other[seed])

  seeds = sorted(seed for seed in set(base) & set(other) if paired(seed))
  if not seeds:
    return None
  if metric == 'bleu':
    from relpos.data.translation import read_pairs  # translation only

    references = read_pairs(config.data, 'eval')[1]
    return significance.bleu_p_value(
      [line for seed in seeds for line in base[seed]],
      [line for seed in seeds for line in other[seed]],
      references * len(seeds),
      target_lang=config.data.target_lang,
    )
  return significance.bpc_p_value(
    [nats for seed in seeds for nats in base[seed][0]],
    [nats for seed in seeds for nats in other[seed][0]],
    [tokens for seed in seeds for tokens in base[seed][1]],
  )


def _scores_by_seed(rows: list[dict], metric: str) -> dict:
  return {row['seed']: row[metric] for row in rows}


def summarise(config, rows: list[dict], values, metric: str, baseline, diverged=()) -> list[dict]:
  """One row per value: value, n (its finished runs), mean, std (ddof 1; None for one run),
  difference from the baseline over the seeds both have (`significance.paired_difference`, the
  seeds the tests pair), p_value (items) and p_seeds (seeds), and `diverged`, how many of its
  runs are in `diverged` (`diverged_runs`). The three tests are None for the baseline and where
  the baseline has no runs; a value with no finished run (every seed diverged) keeps its row,
  n 0 and no mean, so that the table says what became of it."""
  by_value = {value: [row for row in rows if row['value'] == value] for value in values}
  base_scores = _scores_by_seed(by_value[baseline], metric)
  summary = []
  for value, value_rows in by_value.items():
    row = dict.fromkeys(SUMMARY_COLUMNS) | {'value': value, 'n': len(value_rows)}
    row['diverged'] = sum(1 for run in diverged if run['value'] == value)
    summary.append(row)
    if not value_rows:
      continue
    scores = _scores_by_seed(value_rows, metric)
    mean, std = significance.mean_and_std(scores.values())
    row.update(mean=mean, std=std if len(value_rows) > 1 else None)
    if value != baseline and base_scores:
      row['difference'] = significance.paired_difference(base_scores, scores)
      row['p_value'] = p_value(config, metric, by_value[baseline], value_rows)
      row['p_seeds'] = significance.seed_p_value(base_scores, scores)
  return summary


def _write_csv(path: Path, rows: list[dict], columns) -> None:
  """Writes `rows` to the CSV file `path` whole (`write_atomically`, whose OSError names the
  file, also on a full disk met only as the data is flushed)."""
  stream = io.StringIO(newline='')
  writer = csv.DictWriter(stream, fieldnames=list(columns), extrasaction='ignore')
  writer.writeheader()
  writer.writerows(rows)
  write_atomically(path, stream.getvalue().encode())  # bytes: its own line ends


# Swept values that stand for something a reader cannot guess, named beside the value in the
# tables and the plot (the CSVs keep the bare value).
_VALUE_MEANINGS = {('eval.max_relative_position', '-1'): 'as trained'}


def value_label(field: str, value) -> str:
  """The value as tables and plots show it: '-1 (as trained)' for a sentinel, else str(value)."""
  meaning = _VALUE_MEANINGS.get((field, str(value)))
  return f'{value} ({meaning})' if meaning else str(value)


def write_tables(
  summary, rows, root: Path, field: str, metric: str, baseline, setting: str | None = None
) -> str:
  """Writes sweep.csv, sweep_seeds.csv and sweep.md under `root`; returns the markdown.
  `setting`: the `--evaluations` setting the scores are of (the first), which sweep.md's
  heading names (it did not: a reader took the numbers for the config's own config.eval); None
  without --evaluations."""
  _write_csv(root / SUMMARY_TABLE, summary, SUMMARY_COLUMNS)
  _write_csv(root / 'sweep_seeds.csv', rows, ('value', 'seed', metric, 'step', 'workdir'))
  scored = (
    ''
    if setting is None
    else f' scored at --evaluations setting {setting} (the first; sweep_by_evaluation.md has '
    'every setting)'
  )
  lines = [
    f'{field} against {metric}{scored}: mean ± std over seeds; the difference and p-values against '
    f'{field}={baseline}, the p-values by '
    'a paired bootstrap over test items, seeds pooled, and a paired t-test over seeds',
    '',
    f'| {field} | n | {metric} mean | std | difference | p-value (items) | p-value (seeds) |',
    '|---|---|---|---|---|---|---|',
  ]
  for row in summary:
    if row['value'] == baseline:
      tests = '(baseline) | (baseline) | (baseline)'
    else:
      p_items, p_seeds = significance.p_text(row['p_value']), significance.p_text(row['p_seeds'])
      tests = f'{significance.difference_text(row["difference"])} | {p_items} | {p_seeds}'
    label = value_label(field, row['value'])
    n = f'{row["n"]} ({row["diverged"]} diverged)' if row.get('diverged') else row['n']
    mean = '–' if row['mean'] is None else f'{row["mean"]:.3f}'
    std = f'{row["std"]:.3f}' if row['n'] > 1 else '–'  # no spread from one run
    lines.append(f'| {label} | {n} | {mean} | {std} | {tests} |')
  lines += _unpaired_notes(summary, rows, field, baseline)
  lines += ['', f'| {field} | seed | {metric} | step |', '|---|---|---|---|']
  lines += [
    f'| {value_label(field, r["value"])} | {r["seed"]} | {r[metric]:.3f} | {r["step"]} |'
    for r in rows
  ]
  markdown = '\n'.join(lines) + '\n'
  write_atomically(root / 'sweep.md', markdown)
  return markdown


def _unpaired_notes(summary, rows, field: str, baseline) -> list[str]:
  """The notes under sweep.md's summary on what its tests leave out: where a value's seeds
  differ from the baseline's (a seed diverged), its difference is over the seeds both have,
  not the difference of the means shown; a result `warn_stale` named is in the mean but not
  in the p-value over items."""
  seeds = {row['value']: set() for row in summary}
  for row in rows:
    seeds[row['value']].add(row['seed'])
  notes = []
  partly = [
    f'{value_label(field, value)} (seeds {", ".join(map(str, sorted(own & seeds[baseline])))})'
    for value, own in seeds.items()
    if value != baseline and own & seeds[baseline] and own != seeds[baseline]
  ]
  if partly:
    notes.append(
      f'The difference of {field}={"; ".join(partly)} is over the seeds it shares with the '
      'baseline, which the tests pair, not the difference of the means.'
    )
  if stale := [
    f'{value_label(field, r["value"])} seed {r["seed"]}' for r in rows if r.get('stale')
  ]:
    notes.append(
      f'Not of the config given (warned of), so tabulated as they are but left out of the '
      f'p-values over items: {field}={"; ".join(stale)}.'
    )
  return [''] + notes if notes else []


def plot(summary: list[dict], rows: list[dict], root: Path, field: str, metric: str) -> Path:
  """sweep.png: the mean of the metric against the swept values, ±std error bars, and each
  seed's score as a dot beside its value's mean (with three seeds, the dots say more)."""
  figure, axes = subplots(figsize=(5, 3.5))
  summary = [row for row in summary if row['n']]  # a value whose every seed diverged: no mean
  positions = range(len(summary))
  axes.errorbar(
    positions,
    [row['mean'] for row in summary],
    yerr=[row['std'] or 0.0 for row in summary],
    marker='o',
    capsize=4,
    label='mean ± std',
  )
  index = {row['value']: position for position, row in zip(positions, summary, strict=True)}
  seed_rows = [row for row in rows if row['value'] in index]
  axes.scatter(
    [index[row['value']] + 0.12 for row in seed_rows],
    [row[metric] for row in seed_rows],
    s=12,
    color='grey',
    alpha=0.8,
    label='one seed',
    zorder=3,
  )
  axes.legend(fontsize='small')
  axes.set_xticks(list(positions), [value_label(field, row['value']) for row in summary])
  axes.set_xlabel(field)
  seeds = max(row['n'] for row in summary)
  axes.set_ylabel(f'{metric} ({seeds} seeds)' if seeds > 1 else metric)
  axes.grid(alpha=0.3)
  return save_figure(figure, root / 'sweep.png')


def progress(done: int, total: int, started: float) -> str:
  """'run 3 of 8, ...' for the sweep's next run: with runs done in this call, the elapsed
  time and an ETA for the rest at their mean time (a resumed run may take less)."""
  text = f'run {done + 1} of {total} to run'
  if done:
    elapsed = time.monotonic() - started
    remaining = elapsed / done * (total - done)
    text += f', {_minutes(elapsed)} so far, about {_minutes(remaining)} left'
  return text


def _minutes(seconds: float) -> str:
  minutes = round(seconds / 60)
  return f'{minutes // 60} h {minutes % 60:02d} min' if minutes >= 60 else f'{minutes} min'


def sweep(
  config,
  root: Path,
  field: str,
  values,
  seeds,
  metric: str,
  baseline,
  *,
  train=True,
  variant_of=None,
  breakdowns=(),
  evaluations=None,
):
  """Trains and evaluates every unfinished run (if `train`), then writes the tables and plot
  (and those of each (`relpos.studies.breakdown.Breakdown`, edges) in `breakdowns`); returns the
  per-value summary. `variant_of`: see `check_sweep`. `evaluations` ({setting: {eval field:
  value}}, `sweep_grid.parse_evaluations`) scores every trained model at each setting: the
  tables, plot and breakdowns are those of the first setting, and `sweep_by_evaluation.*` holds
  them all."""
  task = tasks.get(config)
  prepare_root(root, train=train)
  settings = evaluations or {None: {}}
  if train:
    # One sweep at a time on a root: a second one would score the runs the first finishes,
    # then stop at the run the first trains (its workdir's lock); it is refused at once.
    with workdir_lock.hold(root):
      train_unfinished(config, task, root, field, values, seeds, variant_of, settings)

  def tabulated(setting, setting_runs: list) -> list[dict]:
    """`collect`'s rows of `setting_runs` (`read_runs` at `setting`), with --collect_only those of
    results not of the sweep's config marked (`warn_stale`)."""
    rows = collect(setting_runs, metric)
    if not train:
      stale = warn_stale(
        config, root, field, values, seeds, variant_of, settings[setting], setting_runs
      )
      for row in rows:
        row['stale'] = (row['value'], row['seed']) in stale
    return rows

  first = next(iter(settings))
  first_runs = read_runs(root, field, values, seeds, first, task=config.task)
  rows = tabulated(first, first_runs)
  diverged = diverged_runs(first_runs)
  if not rows:
    raise FileNotFoundError(
      f'no finished runs under {root}'
      + (f': all {len(diverged)} diverged (each eval_results.json says where)' if diverged else '')
    )
  summary = summarise(config, rows, values, metric, baseline, diverged)
  compared = any(row['value'] == baseline for row in rows)
  if not compared:
    warn_baseline_without_runs(summary, field, baseline, breakdowns or evaluations)
  print(write_tables(summary, rows, root, field, metric, baseline, first))
  write_diverged(diverged, root, field)
  print(f'plot: {plot(summary, rows, root, field, metric)}')
  if not compared:
    return summary  # the breakdowns and evaluations compare every bucket with the baseline
  for kind, edges in breakdowns:
    write_breakdown(config, rows, baseline, root, field, kind, edges)
  if evaluations:
    by_setting = {
      s: rows if s == first else tabulated(s, read_runs(root, field, values, seeds, s))
      for s in evaluations
    }
    write_evaluations(config, by_setting, baseline, root, field, metric)
  return summary


def warn_baseline_without_runs(summary, field: str, baseline, skipped) -> None:
  """The `warning:` of a baseline with no finished run (every seed diverged, say): the table
  has no difference or p-value, and the sweep does not pick another baseline behind the
  reader's back; it names --baseline and the values it could be. `skipped`: breakdowns or
  evaluations were asked for, which are not written (each compares with the baseline)."""
  row = next(row for row in summary if row['value'] == baseline)
  diverged = row['diverged']
  seeds = 'its one seed' if diverged == 1 else f'all {diverged} seeds'
  why = f'diverged in {seeds}' if diverged else 'has no finished run'
  others = [str(row['value']) for row in summary if row['n']]
  warn(
    f'the baseline {field}={baseline} {why}, so the table has no difference or p-value'
    + (' and no sweep_by_* table is written' if skipped else '')
    + f'; pass --baseline with a value that has finished runs ({", ".join(others)})'
  )


def train_unfinished(config, task, root: Path, field: str, values, seeds, variant_of, settings):
  """`sweep`'s training: trains and scores (at each of `settings`) every run not finished,
  after checking all of them first (their evaluation plans, their recorded configs); a run
  that diverges is recorded as such (`record_divergence`) and the others go on."""
  todo, every_run = [], list(sweep_grid.runs(config, field, values, seeds, variant_of))
  for value, seed, variant in every_run:
    workdir, unscored = sweep_grid.model_dir(root, field, value, seed), []
    for setting, overrides in settings.items():
      results_dir = sweep_grid.run_dir(root, field, value, seed, setting)
      scored = sweep_grid.evaluated(variant, overrides)
      if finished_run.is_finished(task, results_dir, scored, workdir):
        print(f'=== {field}={value} seed={seed}: finished, kept ({results_dir})', flush=True)
      else:
        try:  # what train.py checks before training, for every run before the first trains
          loop.check_evaluation_plan(scored, workdir)
        except ValueError as error:
          raise ValueError(f'{field}={value} seed={seed}: {error}') from None
        unscored.append((scored, results_dir))
    if unscored:
      check_rerun(
        sweep_grid.as_trained(config, field, variant), workdir, task, f'{field}={value} seed={seed}'
      )
      todo.append((value, seed, variant, workdir, unscored))
  started = time.monotonic()
  diverged = {}  # workdir -> its DivergedError: an eval field's one training, for every value
  trained_dirs = list(
    dict.fromkeys(sweep_grid.model_dir(root, field, v, s) for v, s, _ in every_run)
  )
  for done, (value, seed, variant, workdir, unscored) in enumerate(todo):
    print(f'=== {field}={value} seed={seed} ({progress(done, len(todo), started)})', flush=True)
    try:
      if workdir not in diverged:
        train_run(task, sweep_grid.as_trained(config, field, variant), workdir, trained_dirs)
    except loop.DivergedError as error:
      diverged[workdir] = error
    if workdir in diverged:
      record_divergence(diverged[workdir], task.metrics, f'{field}={value} seed {seed}', unscored)
      continue
    for scored, results_dir in unscored:
      result = task.evaluate(scored, workdir, output_dir=results_dir)
      print('\n'.join(task.result_lines(result)), flush=True)


# What the record beside a vocabulary a sweep's run trained says (`files.record_source`): one
# that another run of the sweep may take (`reuse_vocabulary`).
TRAINED_BY_SWEEP = 'trained by relpos.studies.sweep, in one process'


def train_run(task, trained, workdir: Path, trained_dirs: list[Path]) -> None:
  """Trains the run of the config `trained` in `workdir` (`Task.train_model`), on the
  vocabulary of another of the sweep's runs (`trained_dirs`) where that is the one it would
  train (`reuse_vocabulary`). A vocabulary the run trains itself is recorded as the sweep's
  (`TRAINED_BY_SWEEP`, beside it), for the runs after it, in this sweep or when it resumes;
  also where the run diverges (its vocabulary is no worse for that)."""
  reuse_vocabulary(task, trained, workdir, trained_dirs)
  vocabulary = task.data_files(trained, workdir).get(data_record.VOCABULARY)
  had_one = vocabulary is None or vocabulary.exists()
  try:
    task.train_model(trained, workdir)
  finally:
    if not had_one and made_here(vocabulary) and run_config.has_run(workdir):
      # Only a later run's training is at stake: a record that cannot be written is none.
      with contextlib.suppress(OSError):
        record_source(vocabulary, TRAINED_BY_SWEEP)


def reuse_vocabulary(task, trained, workdir: Path, trained_dirs: list[Path]) -> None:
  """Copies into `workdir`, before its run's first start, the vocabulary of one of the sweep's
  runs in `trained_dirs` that trained the very vocabulary this run would train: a k sweep over
  1M pairs trained the same 32000-piece SentencePiece model, byte for byte, in every run. The
  donor is a run whose vocabulary the sweep trained (in one process: `TRAINED_BY_SWEEP`) or
  copied, as recorded beside it (`files.recorded_source`), for which the task finds nothing
  that makes the two differ (`Task.vocabulary_changes`: the data and fields the vocabulary is
  trained on, the draw's seed). The copy's own record names where it came from, so its start
  uses it without the warning of a placed vocabulary, and one line here says so. Nothing is
  copied for a task without such a vocabulary (the character LM), a run started already, or
  where the copy cannot be written (the run trains its own, and its start names the fault)."""
  vocabulary = task.data_files(trained, workdir).get(data_record.VOCABULARY)
  if vocabulary is None or vocabulary.exists() or run_config.has_run(workdir):
    return
  for other in trained_dirs:
    theirs = task.data_files(trained, other)[data_record.VOCABULARY]
    if other == workdir or recorded_source(theirs) is None:
      continue
    if task.vocabulary_changes(trained, other) != []:
      continue
    try:
      copy_with_source(theirs, vocabulary, f'copied by relpos.studies.sweep from {theirs}')
    except OSError:
      return
    print(
      f'vocabulary: {theirs} copied to {vocabulary}, not trained again (the same training '
      'data, vocabulary fields and draw)',
      flush=True,
    )
    return


def write_evaluations(config, by_setting: dict, baseline, root: Path, field: str, metric: str):
  """`sweep_by_evaluation.*`: the metric per swept value and `--evaluations` setting
  ({setting: `collect` rows}), with the statistics of a breakdown whose buckets are the
  settings (`relpos.studies.breakdown.by_bucket`): mean ± std, difference from the baseline,
  and both p-values per setting."""
  kind = breakdown.Breakdown(
    '--evaluations',
    'by_evaluation',
    'evaluation setting',
    'characters' if config.task == 'char_lm' else 'sentences',
    metric,
  )
  per_run, counts = [], {}
  for setting, rows in by_setting.items():
    for row in rows:
      per_run.append(
        {'value': row['value'], 'seed': row['seed'], 'bucket': setting, metric: row[metric]}
      )
      counts[setting] = row['results'].get('tokens', row['results'].get('sentences'))

  def p_items(value, seeds, setting):
    chosen = [row for row in by_setting[setting] if row['seed'] in seeds]
    return p_value(
      config,
      metric,
      [row for row in chosen if row['value'] == baseline],
      [row for row in chosen if row['value'] == value],
    )

  order = list(dict.fromkeys(row['value'] for row in per_run))
  per_run.sort(key=lambda row: order.index(row['value']))  # value-major, as the tables
  summary, per_run = breakdown.by_bucket(per_run, counts, baseline, metric, p_items)
  write_breakdown_files(root, kind, summary, per_run, field, baseline)


def write_breakdown(config, rows, baseline, root: Path, field: str, kind, edges) -> None:
  """The tables and plot of one `relpos.studies.breakdown` of the finished runs in `rows`."""
  by_value = {}
  for row in rows:
    by_value.setdefault(row['value'], []).append(row)
  if kind in (breakdown.SOURCE_LENGTH, breakdown.SOURCE_PIECES):
    from relpos.data.translation import load_eval_data  # translation only

    # The vocabulary of the first run's training: every run of one sweep trains the same one.
    trained = sweep_grid.model_dir(root, field, rows[0]['value'], rows[0]['seed'])
    data = load_eval_data(config.data, trained)
    sources = data.eval_sources
    if kind is breakdown.SOURCE_LENGTH:
      lengths = [len(source.split()) for source in sources]
    else:
      lengths = [len(data.tokenizer.encode(source)) for source in sources]
    translations = {value: _pooled_items(config, 'bleu', runs) for value, runs in by_value.items()}
    summary, per_run = breakdown.bleu_by_source_length(
      lengths,
      data.eval_references,
      translations,
      baseline,
      edges,
      kind,
      target_lang=config.data.target_lang,
    )
  else:
    results = {
      value: {run['seed']: run['results'] for run in runs} for value, runs in by_value.items()
    }
    summary, per_run = breakdown.bpc_by_position(results, baseline, edges)
  write_breakdown_files(root, kind, summary, per_run, field, baseline)


def write_breakdown_files(root: Path, kind, summary, per_run, field: str, baseline) -> None:
  """`sweep_<by>.csv` (per value and bucket), `sweep_<by>_seeds.csv` (per run and bucket),
  `sweep_<by>.md` and `sweep_<by>.png` of one breakdown's `summary` and `per_run` rows."""
  _write_csv(root / f'sweep_{kind.name}.csv', summary, breakdown.SUMMARY_COLUMNS)
  extra = ('length_ratio',) if per_run and 'length_ratio' in per_run[0] else ()
  seed_columns = ('value', 'seed', 'bucket', kind.metric, *extra)
  _write_csv(root / f'sweep_{kind.name}_seeds.csv', per_run, seed_columns)
  markdown = breakdown.markdown(summary, kind, field, baseline, per_run)
  write_atomically(root / f'sweep_{kind.name}.md', markdown)
  print(markdown)
  print(f'plot: {breakdown.plot(summary, per_run, kind, root, field, baseline)}')


def root_write_fault(error: OSError, root: Path, *, resume: bool, path: Path | None = None):
  """The exit-74 fault (`checkpoints.filesystem_fault`, as train.py's) of an OSError writing the
  sweep's own files under `root` (its lock, the tables, the plot) on a full disk or a read-only
  or unwritable filesystem, naming the file (the tables and plot are written through
  `write_atomically`, whose errors name the file also where a full disk is met only as it is
  flushed; the root where an error names none); None for any other error, reported as it is.
  Its runs' own writes are their training's and evaluation's faults already. `resume`: whether
  the same command resumes the sweep (not --collect_only's, whose remedy is a writable root:
  it writes its tables beside the runs it reads, so another --workdir would hold none).
  `path`: the file the write stands for, where the error names another (the root's write
  probe, `first_write`). Which errors those are is train.py's rule for its workdir
  (`checkpoints.is_write_fault`), but for the other errors of a file under the root (a missing
  one), which are reported as they are: the sweep reads its runs' files there too."""
  path = path or error_path(error)
  if not is_write_fault(error, root, path, reads_others_there=True):
    return None
  collecting = not resume and error_errno(error) in UNWRITABLE
  return filesystem_fault(
    error,
    f"cannot write {path or root} (the sweep's --workdir={root})",
    last_good=f'the finished runs under {root} are intact',
    resume=resume,
    todo='make it writable, then rerun (--collect_only writes its tables into the root it '
    'reads the runs from)'
    if collecting
    else None,
  )


def first_write(root: Path, *, train: bool) -> Path:
  """The first file the sweep writes under `root`: its lock when it trains, else (with
  --collect_only) its table sweep.csv; what a root that takes no files is reported as failing
  to write (`prepare_root`)."""
  return root / (workdir_lock.LOCK_FILE if train else SUMMARY_TABLE)


def prepare_root(root: Path, *, train: bool) -> None:
  """Checks and makes the sweep's root as train.py's workdir is, also for --collect_only
  (which writes its tables there): a dangling link is one line (exit 1,
  `run_config.check_path`), a file in its place or above it one exit-74 line
  (`workdir_setup.prepare_workdir`). A root that takes no files (read-only, not writable) is the
  sweep's own line (`root_write_fault`), naming the file it would write first
  (`first_write`), not train.py's 'before training ... rerun the same command to resume'."""
  run_config.check_path(root)
  workdir_setup.prepare_workdir(
    root,
    probe_fault=lambda error: root_write_fault(
      error, root, resume=train, path=first_write(root, train=train)
    ),
  )


def main(argv):
  tasks.start_command(argv)
  args = flags.FLAGS
  if not args.workdir:
    sys.exit('error: --workdir is required: the root directory of the sweep (a folder per run)')
  config, field, root = args.config, args.field, Path(args.workdir)
  config_arg = tasks.config_arg(sys.argv)
  overrides = [
    arg for arg in tasks.config_overrides(sys.argv) if not arg.startswith('--config.seed=')
  ]
  try:
    task = tasks.get(config)
    task.check_complete(config)  # a field deleted from the file, before --field reads one
    metric = args.metric or task.metric
    if field == sweep_grid.PRESET:
      variant_of = sweep_grid.preset_variants(config_arg.split(':')[0], overrides)
      values, baseline = list(args.values), args.baseline
    else:
      variant_of = None
      sweep_grid.field_type(config, field, f'--field={field}')
      values = [sweep_grid.parse_value(config, field, text) for text in args.values]
      baseline = (
        None
        if args.baseline is None
        else sweep_grid.parse_value(config, field, args.baseline, '--baseline')
      )
    sweep_grid.check_values(values)
    seeds = args.seeds
    baseline = values[0] if baseline is None else baseline
    if baseline not in values:
      raise ValueError(f'--baseline={args.baseline} is not one of --values')
    evaluations = sweep_grid.parse_evaluations(config, args.evaluations or ())
    sweep_grid.check_evaluations(field, evaluations)
    check_sweep(config, field, values, seeds, metric, variant_of, evaluations)
    breakdowns = []
    for kind, edges in (
      (breakdown.SOURCE_LENGTH, args.by_source_length),
      (breakdown.SOURCE_PIECES, args.by_source_pieces),
      (breakdown.POSITION, args.by_position),
    ):
      if edges:
        if metric != kind.metric:
          raise ValueError(f'{kind.flag} needs a sweep of {kind.metric}, not {metric}')
        breakdown.buckets(edges, kind)
        breakdowns.append((kind, edges))
    if args.print_only:
      print(
        '\n'.join(
          sweep_grid.commands(config_arg, overrides, root, field, values, seeds, evaluations)
        )
      )
      return
    sweep(
      config,
      root,
      field,
      values,
      seeds,
      metric,
      baseline,
      train=not args.collect_only,
      variant_of=variant_of,
      breakdowns=breakdowns,
      evaluations=evaluations,
    )
  except PreemptedError as stopped:  # SIGTERM, Ctrl-C: the run in progress saved a checkpoint
    print(f'{stopped} (the sweep command resumes it and skips finished runs)', file=sys.stderr)
    sys.exit(stopped.exit_code)
  except tasks.FAULTS as fault:  # a full disk, a workdir of another task, out of memory
    tasks.exit_for_fault(fault)
  except OSError as error:  # the sweep's own files: one line, as train.py's (exit 74)
    fault = root_write_fault(error, root, resume=not args.collect_only)
    if fault is not None:
      tasks.exit_for_fault(fault)
    if not isinstance(error, tasks.USER_ERRORS):
      raise
    print(f'error: {error}', file=sys.stderr)
    sys.exit(1)
  except tasks.USER_ERRORS as error:
    sys.exit(f'error: {error}')


def define_flags():
  """The command-line flags (defined only when run as a program, so importing is free)."""
  config_flags.DEFINE_config_file('config', None, 'Experiment config file.')
  flags.DEFINE_string('workdir', None, 'Root directory; one subdirectory per value and seed.')
  flags.DEFINE_string(
    'field', 'model.max_relative_position', "Config field to sweep, or 'preset' (the file's)."
  )
  flags.DEFINE_list('values', '0,1,2,4,16,64', 'Values of the field, comma-separated.')
  flag_types.define_int_list(
    'seeds',
    '0',
    'Seeds (config.seed) to train each value with.',
    minimum=0,
    maximum=checks.SEED_MAX,
    distinct=True,
  )
  flags.DEFINE_string('baseline', None, 'The value p-values are against (default: the first).')
  flags.DEFINE_string('metric', None, "Result to tabulate (default: the task's, bleu or bpc).")
  flags.DEFINE_bool('print_only', False, 'Print the commands, run nothing.')
  flags.DEFINE_bool('collect_only', False, 'Tabulate finished runs, run nothing.')
  flags.DEFINE_list(
    'by_source_length', None, 'Also BLEU per bucket of source words, e.g. 4,6,8 (translation).'
  )
  flags.DEFINE_list(
    'by_source_pieces',
    None,
    "Also BLEU per bucket of source pieces (the run's vocabulary), e.g. 8,16,32 (translation).",
  )
  flags.DEFINE_list(
    'evaluations',
    None,
    'Also score every model at these config.eval settings, e.g. tgt_len=128,tgt_len=64+mem_len=64.',
  )
  flags.DEFINE_list(
    'by_position', None, 'Also bpc per bucket of position in the segment, e.g. 1,4,8,16,32.'
  )
  flags.mark_flag_as_required('config')


if __name__ == '__main__':
  runtime.apply_defaults()  # relpos's allocator (re-executes), as train.py
  define_flags()
  app.run(main, flags_parser=tasks.parse_flags)
