"""The tables, plot and p-values a sweep (`relpos.studies.sweep`) writes from its finished runs.

Under `<workdir>`:
- `sweep.csv` / `sweep.md`: one row per value, `value, n, mean, std, difference, p_value,
  p_seeds, diverged` (std over seeds, ddof 1; the difference over the seeds both have and both
  p-values against `--baseline`, the first value by default; how many of its runs diverged);
- `sweep_seeds.csv`: one row per run;
- `sweep.png`: the mean with ±std error bars;
- with `--by_source_length=4,6,8` or `--by_source_pieces=8,16,32` (translation) or
  `--by_position=1,4,8,16,32` (character LM), the same per bucket of source length in words
  or in pieces or of position within the evaluation segment: `sweep_by_length.*`,
  `sweep_by_pieces.*` or `sweep_by_position.*` (`relpos.studies.breakdown`).

With `--evaluations` (`relpos.studies.sweep_grid`), `sweep_by_evaluation.*` tabulates the swept
values by setting with the breakdowns' statistics (mean ± std, the difference from the baseline
and both p-values per setting); the other tables are the first setting's.

p_value is a paired bootstrap over the test items, seeds pooled (`relpos.studies.significance`):
sacreBLEU's test on the translations for BLEU, the same test over evaluation segments for
bits-per-char; other metrics get none. It holds the trained models fixed. p_seeds is a paired
t-test over the seeds' scores, for any metric: it holds the test set fixed and asks whether
the difference stands out from training's run-to-run spread (with 3 seeds, only a large and
consistent one does).

Each run's eval_results.json is read once (`read_runs`) and carried in its row to the tables,
p-values, breakdowns and evaluation tables; a run recorded as diverged is left out of them
with a note (`diverged_runs`, `write_diverged`). Every file is written whole
(`write_atomically`), so a fault leaves the previous table, not half of one.
"""

import csv
import io
from pathlib import Path

from relpos.files import read_text_lines, write_atomically
from relpos.messages import warn
from relpos.studies import breakdown, significance, sweep_grid
from relpos.studies.figures import save as save_figure
from relpos.studies.figures import subplots
from relpos.training import run_config, run_results
from relpos.training.run_results import DIVERGED

# The tables the sweep writes (`write_tables`): the summary first, then its markdown.
SUMMARY_TABLE, SUMMARY_MARKDOWN = run_config.SWEEP_TABLES
SUMMARY_COLUMNS = ('value', 'n', 'mean', 'std', 'difference', 'p_value', 'p_seeds', 'diverged')


def read_runs(root: Path, field: str, values, seeds, evaluation=None, *, task=None) -> list:
  """(value, seed, the path of its eval_results.json, what it holds or None where there is
  none) of every run, value-major, at the `--evaluations` setting `evaluation` if given: each
  file read once, for `sweep.warn_stale`, `collect` (whose rows carry it to the p-values, breakdowns
  and evaluation tables) and `diverged_runs`; a missing one is warned of as it is met. With
  `task`, a run directory that records a run of another task is a TaskMismatchError (a
  ValueError), before any result is read.

  Raises:
    ValueError: an eval_results.json is damaged (`run_results.read_results`).
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
      path = sweep_grid.run_dir(root, field, value, seed, evaluation) / run_results.RESULTS_FILE
      if not path.exists():
        warn(f'no results for {field}={value} seed {seed} ({path})')
      runs.append((value, seed, path, _read_results(path) if path.exists() else None))
  return runs


def _read_results(path: Path) -> dict:
  """`run_results.read_results`, whose error says what scores a damaged file again."""
  try:
    return run_results.read_results(path)
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
    ValueError: a result lacks `metric`, or what its tables read of it
      (`run_results.missing_table_fields`: the test items, missing from results of an older
      relpos), which the sweep without --collect_only scores again.
  """
  rows = []
  for value, seed, path, results in runs:
    if results is None or DIVERGED in results:
      continue
    if missing := run_results.missing_table_fields(results, metric):
      raise ValueError(
        f'{path} has no {", ".join(map(repr, missing))} (it has {sorted(results)}; an older '
        "relpos's result, or not one of --metric): the sweep command without --collect_only "
        'scores that run again'
      )
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
  """One row per run of `runs` (`read_runs`) recorded as diverged (`sweep.record_divergence`), which
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
  markdown = root / SUMMARY_MARKDOWN
  write_atomically(markdown, f'{markdown.read_text()}\n{note}')
  print(note)


def _pooled_items(metric: str, rows: list[dict]):
  """What the paired test of `metric` compares, per seed: {seed: items} of one value's rows."""
  items = {}
  for row in rows:
    results = row['results']
    if metric == 'bleu':
      items[row['seed']] = read_text_lines(
        run_results.result_file(results, 'translations', row['workdir'])
      )
    else:
      items[row['seed']] = (results['segment_nats'], results['segment_tokens'])
  return items


def p_value(config, metric: str, baseline: list[dict], candidate: list[dict]) -> float | None:
  """The paired bootstrap p-value of `candidate`'s runs against `baseline`'s on the seeds both
  have, pooled (module docstring), leaving out the rows marked stale (`sweep.warn_stale`) and the
  seeds whose items do not pair (bpc's segments of other lengths: a sweep of eval.tgt_len
  scores other segments at each value); None for metrics without a test, or with no seed left
  to pair."""
  if metric not in ('bleu', 'bpc'):
    return None
  baseline, candidate = (
    [row for row in rows if not row.get('stale')] for rows in (baseline, candidate)
  )
  base, other = _pooled_items(metric, baseline), _pooled_items(metric, candidate)

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
    scores = _scores_by_seed(value_rows, metric)
    row = dict.fromkeys(SUMMARY_COLUMNS) | {'value': value}
    row |= significance.against_baseline(base_scores, scores, is_baseline=value == baseline)
    row['diverged'] = sum(1 for run in diverged if run['value'] == value)
    if row['difference'] is not None:
      row['p_value'] = p_value(config, metric, by_value[baseline], value_rows)
    summary.append(row)
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
    std = '–' if row['std'] is None else f'{row["std"]:.3f}'  # no spread from one run
    lines.append(f'| {label} | {n} | {mean} | {std} | {tests} |')
  lines += _unpaired_notes(summary, rows, field, baseline)
  lines += ['', f'| {field} | seed | {metric} | step |', '|---|---|---|---|']
  lines += [
    f'| {value_label(field, r["value"])} | {r["seed"]} | {r[metric]:.3f} | {r["step"]} |'
    for r in rows
  ]
  markdown = '\n'.join(lines) + '\n'
  write_atomically(root / SUMMARY_MARKDOWN, markdown)
  return markdown


def _unpaired_notes(summary, rows, field: str, baseline) -> list[str]:
  """The notes under sweep.md's summary on what its tests leave out: where a value's seeds
  differ from the baseline's (a seed diverged), its difference is over the seeds both have,
  not the difference of the means shown; a seed test of two seeds is one degree of freedom; a
  result `sweep.warn_stale` named is in the mean but not in the p-value over items."""
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
  if few := [
    value_label(field, value)
    for value, own in seeds.items()
    if value != baseline and len(own & seeds[baseline]) == 2
  ]:
    notes.append(
      f'The seed test of {field}={", ".join(few)} pairs two seeds: a t-test of 1 degree of '
      'freedom, whose p-value swings with any one run; more seeds make it a test.'
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
    translations = {value: _pooled_items('bleu', runs) for value, runs in by_value.items()}
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
