"""A sweep's metric broken down into buckets: which inputs a difference comes from.

    python -m relpos.studies.sweep --config=configs/translate_tiny.py --workdir=runs/positions \\
        --field=model.position --values=absolute,shaw,shaw_absolute --seeds=0,1,2 \\
        --collect_only --by_source_length=4,6,8
    python -m relpos.studies.sweep --config=configs/char_tiny.py:xl --workdir=runs/eval_mem \\
        --field=eval.mem_len --values=0,64,192 --seeds=0,1,2 --collect_only \\
        --by_position=1,4,8,16,32

Two kinds of breakdown, one table and plot (`by_bucket`, which the sweep's `--evaluations`
grid shares):

- `--by_source_length=EDGES` (translation): the evaluation set split by the number of words
  (whitespace-separated) in each source sentence; edges 4,6,8 make the buckets 1-4, 5-6, 7-8
  and 9+ words. Words, not pieces, so the buckets hold the same sentences for every run
  whatever its vocabulary. Each run's translations of a bucket are scored with sacreBLEU, and
  their length over the references' is tabulated too (below 1, BLEU's brevity penalty).
  `--by_source_pieces=EDGES` counts pieces of the runs' vocabulary instead (the unit a model's
  positions see; configs/length_extrapolation.py trains within N pieces).
- `--by_position=EDGES` (character LM): bits-per-char by position within the evaluation
  segment, 1 to tgt_len (eval_results.json's `position_bpc`, pooled over segments and rows);
  edges 1,4,8,16,32 make 1, 2-4, 5-8, 9-16, 17-32 and 33+. Position t has t - 1 characters of
  its own segment before it, plus whatever the memory holds: the breakdown shows how much of a
  difference lies at the segment's start, where the memory is the only context.

For each swept value and bucket the sweep reports, as for the whole set: mean ± std over
seeds, the difference of the means from the baseline's, and p-values against the baseline
(`relpos.studies.significance`): a paired t-test over the seeds, and for BLEU also a paired
bootstrap
over the bucket's sentences with the seeds pooled (none for bpc: the evaluation keeps no
per-position items). It writes `sweep_<by>.csv` (one row per value and bucket),
`sweep_<by>_seeds.csv` (one row per run and bucket), `sweep_<by>.md` and `sweep_<by>.png` (the
metric against the bucket, one line per value with ±std error bars, and beside it each
value's difference from the baseline), `<by>` being `by_length` or `by_position`.

A score of a bucket is not a share of the whole-set score (a BLEU subset has its own brevity
penalty and n-gram counts), and buckets differ in difficulty: compare values within a bucket.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

from relpos import scoring
from relpos.studies import significance
from relpos.studies.figures import save as save_figure
from relpos.studies.figures import subplots

SUMMARY_COLUMNS = (
  'value',
  'bucket',
  'count',
  'n',
  'mean',
  'std',
  'difference',
  'p_value',
  'p_seeds',
)


class Breakdown(NamedTuple):
  """What one breakdown is called and counts: its flag, its files' `<by>`, the unit of its
  buckets and of their counts, and its metric."""

  flag: str
  name: str
  unit: str
  counted: str
  metric: str


SOURCE_LENGTH = Breakdown(
  '--by_source_length', 'by_length', 'source length in words', 'sentences', 'bleu'
)
SOURCE_PIECES = Breakdown(
  '--by_source_pieces', 'by_pieces', 'source length in pieces', 'sentences', 'bleu'
)
POSITION = Breakdown('--by_position', 'by_position', 'position in segment', 'characters', 'bpc')


def buckets(edges, breakdown: Breakdown) -> list[tuple[str, int, int | None]]:
  """[(label, first, last or None)] over 1, 2, ... for increasing positive `edges`; ValueError
  naming the flag otherwise."""
  try:
    edges = [int(edge) for edge in edges]
  except ValueError:
    edges = None
  if not edges or edges[0] < 1 or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
    raise ValueError(
      f'{breakdown.flag} must be increasing positive integers, e.g. 4,6,8; got {edges}'
    )
  bounds = list(zip([1] + [edge + 1 for edge in edges], edges + [None], strict=True))
  return [
    (f'{low}+' if high is None else f'{low}' if low == high else f'{low}-{high}', low, high)
    for low, high in bounds
  ]


def _members(sizes, edges, breakdown) -> dict[str, list[int]]:
  """{bucket label: indices i whose sizes[i] falls in it}."""
  ranges = buckets(edges, breakdown)
  members = {label: [] for label, _, _ in ranges}
  for index, size in enumerate(sizes):
    for label, low, high in ranges:
      if size >= low and (high is None or size <= high):
        members[label].append(index)
        break
  return members


def bleu_by_source_length(
  lengths, references, translations: dict, baseline, edges, breakdown=SOURCE_LENGTH, *, target_lang
):
  """(summary rows, per-run rows) of `translations` {value: {seed: [a line per source]}} into
  `target_lang` (BLEU as the runs scored it: `scoring.bleu_metric`), by the sources' `lengths`
  (words for SOURCE_LENGTH, pieces for SOURCE_PIECES). Per-run rows also hold the bucket's
  length_ratio, the translations' length over the references' (in sacreBLEU's tokens, 13a but
  for zh, ja, ko; below 1 BLEU pays a brevity penalty)."""
  members = _members(lengths, edges, breakdown)
  per_run = []
  for value, by_seed in translations.items():
    for seed, lines in by_seed.items():
      if len(lines) != len(lengths):
        raise ValueError(
          f'{value} seed {seed}: {len(lines)} translations for {len(lengths)} sources'
        )
      for label, chosen in members.items():
        if chosen:
          hypotheses = [lines[i] for i in chosen]
          bleu = scoring.corpus_bleu(
            hypotheses, [references[i] for i in chosen], target_lang=target_lang
          )
          row = {'value': value, 'seed': seed, 'bucket': label, 'bleu': bleu.score}
          per_run.append(row | {'length_ratio': bleu.length_ratio})

  def p_items(value, seeds, label):
    chosen = members[label]
    return significance.bleu_p_value(
      [translations[baseline][s][i] for s in seeds for i in chosen],
      [translations[value][s][i] for s in seeds for i in chosen],
      [references[i] for _ in seeds for i in chosen],
      target_lang=target_lang,
    )

  counts = {label: len(chosen) for label, chosen in members.items() if chosen}
  return by_bucket(per_run, counts, baseline, 'bleu', p_items)


def bpc_by_position(results: dict, baseline, edges):
  """(summary rows, per-run rows) of `results` {value: {seed: eval_results.json}} with
  `position_bpc` and `position_tokens` (position t = index t - 1)."""
  per_run, counts = [], {}
  for value, by_seed in results.items():
    for seed, result in by_seed.items():
      if 'position_bpc' not in result:
        raise ValueError(
          f'{value} seed {seed}: its eval_results.json has no position_bpc (scored by an older '
          'relpos; score it again: delete eval_results.json and rerun the sweep)'
        )
      tokens = result['position_tokens']
      members = _members(range(1, len(tokens) + 1), edges, POSITION)
      for label, chosen in members.items():
        count = sum(tokens[i] for i in chosen)
        if count:
          bits = sum(result['position_bpc'][i] * tokens[i] for i in chosen if tokens[i])
          per_run.append({'value': value, 'seed': seed, 'bucket': label, 'bpc': bits / count})
          counts[label] = count
  return by_bucket(per_run, counts, baseline, 'bpc', None)


def by_bucket(per_run, counts, baseline, metric, p_items):
  """(summary rows, `per_run`) of per-run rows {value, seed, bucket, metric}: per bucket (of
  `counts`, {bucket: its items, one run's}) and value, count, and the statistics of
  `significance.against_baseline` (n, mean, std, difference, p_seeds), as the sweep's own
  table has them, with p_value (`p_items(value, seeds, bucket)`, or None). Any table of values
  by columns of scores is one: `relpos.studies.sweep`'s `--evaluations` grid too."""
  summary = []
  values = list(dict.fromkeys(row['value'] for row in per_run))
  if baseline not in values:
    raise ValueError(f'the baseline {baseline} has no finished runs to compare the buckets with')
  for label, count in counts.items():
    scores = {
      value: {r['seed']: r[metric] for r in per_run if r['value'] == value and r['bucket'] == label}
      for value in values
    }
    for value, by_seed in scores.items():
      row = {'value': value, 'bucket': label, 'count': count, 'p_value': None}
      row |= significance.against_baseline(scores[baseline], by_seed, is_baseline=value == baseline)
      if row['difference'] is not None and p_items:
        row['p_value'] = p_items(value, sorted(set(by_seed) & set(scores[baseline])), label)
      summary.append(row)
  return summary, per_run


def markdown(summary, breakdown: Breakdown, field: str, baseline, per_run=()) -> str:
  """The metric per value and bucket (mean ± std), then each value's difference from the
  baseline with its p-values; then, where `per_run` rows hold a length_ratio (BLEU's), the
  translations' length over the references' per value and bucket (mean ± std)."""
  labels = list(dict.fromkeys(row['bucket'] for row in summary))
  counts = {row['bucket']: row['count'] for row in summary}
  values = list(dict.fromkeys(row['value'] for row in summary))
  cell = {(row['value'], row['bucket']): row for row in summary}
  header = ' | '.join(f'{label} ({counts[label]})' for label in labels)
  digits = 2 if breakdown.metric == 'bleu' else 3
  lines = [
    f'{breakdown.metric} by {breakdown.unit} ({breakdown.counted} per bucket), mean ± std over '
    f'seeds, by {field}',
    '',
    f'| {field} | {header} |',
    '|---|' + '---|' * len(labels),
  ]
  for value in values:
    cells = [_mean_and_std_text(cell[value, label], digits) for label in labels]
    lines.append(f'| {value} | {" | ".join(cells)} |')
  lines += [
    '',
    f"Difference from {field}={baseline} (p-values: paired bootstrap over the bucket's "
    'items, seeds pooled / paired t-test over seeds; – where there is none)',
    '',
    f'| {field} | {header} |',
    '|---|' + '---|' * len(labels),
  ]
  for value in values:
    if value == baseline:
      continue
    cells = []
    for label in labels:
      row = cell[value, label]
      p_items, p_seeds = significance.p_text(row['p_value']), significance.p_text(row['p_seeds'])
      difference = significance.difference_text(row['difference'], digits)
      cells.append(f'{difference} (p {p_items} / {p_seeds})')
    lines.append(f'| {value} | {" | ".join(cells)} |')
  if per_run and 'length_ratio' in per_run[0]:
    lines += [
      '',
      "Translation length / reference length (in sacreBLEU's tokens, BLEU's; below 1 BLEU pays "
      'a brevity penalty), mean ± std over seeds',
      '',
      f'| {field} | {" | ".join(labels)} |',
      '|---|' + '---|' * len(labels),
    ]
    for value in values:
      cells = []
      for label in labels:
        ratios = [r['length_ratio'] for r in per_run if (r['value'], r['bucket']) == (value, label)]
        cells.append('{:.3f} ± {:.3f}'.format(*significance.mean_and_std(ratios)))
      lines.append(f'| {value} | {" | ".join(cells)} |')
  return '\n'.join(lines) + '\n'


def _mean_and_std_text(row: dict, digits: int) -> str:
  """A bucket's cell: 'mean ± std', the mean alone for one run (no spread), '–' for none."""
  if row['mean'] is None:
    return '–'
  if row['std'] is None:
    return f'{row["mean"]:.{digits}f}'
  return f'{row["mean"]:.{digits}f} ± {row["std"]:.{digits}f}'


def plot(summary, per_run, breakdown: Breakdown, root: Path, field: str, baseline) -> Path:
  """sweep_<by>.png: left, the metric (mean, ±std over seeds) against bucket, one line per
  value; right, each value's difference from the baseline (mean and std of the per-seed
  differences), where small differences between the values can be seen."""
  labels = list(dict.fromkeys(row['bucket'] for row in summary))
  counts = {row['bucket']: row['count'] for row in summary}
  score = {(r['value'], r['seed'], r['bucket']): r[breakdown.metric] for r in per_run}
  figure, (left, right) = subplots(1, 2, figsize=(10, 3.8))
  for value in dict.fromkeys(row['value'] for row in summary):
    rows = {row['bucket']: row for row in summary if row['value'] == value}
    left.errorbar(
      range(len(labels)),
      [math.nan if rows[label]['mean'] is None else rows[label]['mean'] for label in labels],
      yerr=[rows[label]['std'] or 0.0 for label in labels],  # None: one run, no spread
      marker='o',
      capsize=3,
      label=f'{field}={value}',
    )
    if value == baseline:
      right.plot([], [])  # keep each value's colour in both panels
      continue
    seeds = sorted(
      {seed for v, seed, _ in score if v == value and (baseline, seed, labels[0]) in score}
    )
    differences = [
      [score[value, seed, label] - score[baseline, seed, label] for seed in seeds]
      for label in labels
    ]
    right.errorbar(
      range(len(labels)),
      [significance.mean_and_std(d)[0] for d in differences],
      yerr=[significance.mean_and_std(d)[1] for d in differences],
      marker='o',
      capsize=3,
    )
  right.axhline(0.0, color='grey', linewidth=0.8)
  sizes = sorted(abs(row['difference']) for row in summary if row['difference'])
  if sizes and sizes[-1] > 20 * sizes[len(sizes) // 2]:  # one value dwarfs the others
    right.set_yscale('symlog', linthresh=10 ** math.floor(math.log10(sizes[len(sizes) // 2])))
  for axes, ylabel in (
    (left, f'{breakdown.metric} of the bucket'),
    (right, f'{breakdown.metric} minus {field}={baseline}'),
  ):
    axes.set_xticks(range(len(labels)), [f'{label}\n({counts[label]})' for label in labels])
    axes.set_xlabel(f'{breakdown.unit} ({breakdown.counted})')
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
  left.legend(fontsize='small')
  return save_figure(figure, root / f'sweep_{breakdown.name}.png')
