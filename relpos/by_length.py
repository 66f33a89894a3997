"""BLEU by source length for a translation sweep: which sentences a difference comes from.

    python -m relpos.sweep --config=configs/translate_tiny.py --workdir=runs/positions \\
        --field=model.position --values=absolute,shaw,shaw_absolute --seeds=0,1,2 \\
        --collect_only --by_source_length=5,7,10

`relpos.sweep --by_source_length=EDGES` splits the evaluation set by the number of words
(whitespace-separated) in each source sentence: edges 5,7,10 make the buckets 1-5, 6-7,
8-10 and 11+ words. Words, not pieces, so the buckets are the same sentences for every run
whatever its vocabulary. For each swept value and bucket it scores each seed's translations of
the bucket's sentences with sacreBLEU and reports, as `relpos.sweep` does for the whole set:
mean ± std over seeds, the difference of the means from the baseline's, and two p-values
against the baseline (`relpos.significance`): a paired bootstrap over the bucket's
sentences with the seeds pooled, and a paired t-test over the seeds. The sweep writes
`sweep_by_length.csv` (one row per value and bucket), `sweep_by_length_seeds.csv` (one row
per run and bucket), `sweep_by_length.md` and `sweep_by_length.png` (BLEU against bucket,
one line per value, ±std error bars).

A bucket of few sentences gives noisy BLEU, and BLEU of a subset is not a share of the
corpus BLEU (its brevity penalty and n-gram counts are the subset's own); compare values
within a bucket, not buckets with each other.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use('Agg')
from matplotlib import pyplot as plt  # noqa: E402

from relpos import metrics, significance  # noqa: E402

SUMMARY_COLUMNS = ('value', 'bucket', 'sentences', 'n', 'mean', 'std', 'difference', 'p_value')
SUMMARY_COLUMNS += ('p_seeds',)
SEED_COLUMNS = ('value', 'seed', 'bucket', 'bleu')


def buckets(edges) -> list[tuple[str, int, int | None]]:
  """[(label, fewest words, most words or None)] for increasing positive `edges`; ValueError
  naming the flag otherwise."""
  try:
    edges = [int(edge) for edge in edges]
  except ValueError:
    edges = None
  if not edges or edges[0] < 1 or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
    raise ValueError(
      f'--by_source_length must be increasing positive word counts, e.g. 5,7,10; got {edges}'
    )
  bounds = list(zip([1] + [edge + 1 for edge in edges], edges + [None], strict=True))
  return [
    (f'{low}+' if high is None else f'{low}' if low == high else f'{low}-{high}', low, high)
    for low, high in bounds
  ]


def bucket_members(sources: list[str], edges) -> dict[str, list[int]]:
  """{bucket label: indices of the source sentences whose word count falls in it}."""
  members = {label: [] for label, _, _ in buckets(edges)}
  for index, source in enumerate(sources):
    words = len(source.split())
    for label, low, high in buckets(edges):
      if words >= low and (high is None or words <= high):
        members[label].append(index)
        break
  return members


def score(sources, references, translations: dict, baseline, edges) -> tuple[list, list]:
  """(summary rows, per-run rows) for `translations` {value: {seed: [one line per source]}}."""
  members = bucket_members(sources, edges)
  per_run = []
  for value, by_seed in translations.items():
    for seed, lines in by_seed.items():
      if len(lines) != len(sources):
        raise ValueError(
          f'{value} seed {seed}: {len(lines)} translations for {len(sources)} sources'
        )
      for label, chosen in members.items():
        if chosen:
          hypotheses = [lines[i] for i in chosen]
          bleu = metrics.corpus_bleu(hypotheses, [references[i] for i in chosen]).score
          per_run.append({'value': value, 'seed': seed, 'bucket': label, 'bleu': bleu})
  summary = []
  for label, chosen in members.items():
    if not chosen:
      continue
    scores = {
      value: {r['seed']: r['bleu'] for r in per_run if r['value'] == value and r['bucket'] == label}
      for value in translations
    }
    base_mean = significance.mean_and_std(scores[baseline].values())[0]
    for value, by_seed in scores.items():
      mean, std = significance.mean_and_std(by_seed.values())
      row = {'value': value, 'bucket': label, 'sentences': len(chosen), 'n': len(by_seed)}
      row.update(mean=mean, std=std, difference=None, p_value=None, p_seeds=None)
      if value != baseline:
        seeds = sorted(set(by_seed) & set(scores[baseline]))
        row['difference'] = mean - base_mean
        row['p_seeds'] = significance.seed_p_value(scores[baseline], by_seed)
        row['p_value'] = significance.bleu_p_value(
          [translations[baseline][s][i] for s in seeds for i in chosen],
          [translations[value][s][i] for s in seeds for i in chosen],
          [references[i] for _ in seeds for i in chosen],
        )
      summary.append(row)
  return summary, per_run


def markdown(summary, field: str, baseline) -> str:
  """BLEU per value and bucket (mean ± std), then each value's difference from the baseline
  with its two p-values."""
  labels = list(dict.fromkeys(row['bucket'] for row in summary))
  sentences = {row['bucket']: row['sentences'] for row in summary}
  values = list(dict.fromkeys(row['value'] for row in summary))
  cell = {(row['value'], row['bucket']): row for row in summary}
  header = ' | '.join(f'{label} words ({sentences[label]})' for label in labels)
  lines = [
    f'sacreBLEU by source length in words (sentences per bucket), mean ± std over seeds, '
    f'by {field}',
    '',
    f'| {field} | {header} |',
    '|---|' + '---|' * len(labels),
  ]
  for value in values:
    cells = [
      f'{cell[value, label]["mean"]:.2f} ± {cell[value, label]["std"]:.2f}' for label in labels
    ]
    lines.append(f'| {value} | {" | ".join(cells)} |')
  lines += [
    '',
    f"Difference from {field}={baseline} (p-values: paired bootstrap over the bucket's "
    'sentences, seeds pooled / paired t-test over seeds)',
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
      cells.append(f'{row["difference"]:+.2f} (p {p_items} / {p_seeds})')
    lines.append(f'| {value} | {" | ".join(cells)} |')
  return '\n'.join(lines) + '\n'


def plot(summary, root: Path, field: str) -> Path:
  """sweep_by_length.png: BLEU (mean, ±std over seeds) against bucket, one line per value."""
  labels = list(dict.fromkeys(row['bucket'] for row in summary))
  figure, axes = plt.subplots(figsize=(5.5, 3.8))
  for value in dict.fromkeys(row['value'] for row in summary):
    rows = {row['bucket']: row for row in summary if row['value'] == value}
    axes.errorbar(
      range(len(labels)),
      [rows[label]['mean'] for label in labels],
      yerr=[rows[label]['std'] for label in labels],
      marker='o',
      capsize=3,
      label=f'{field}={value}',
    )
  sentences = {row['bucket']: row['sentences'] for row in summary}
  axes.set_xticks(range(len(labels)), [f'{label}\n({sentences[label]})' for label in labels])
  axes.set_xlabel('source length in words (sentences)')
  axes.set_ylabel('sacreBLEU of the bucket')
  axes.grid(alpha=0.3)
  axes.legend(fontsize='small')
  figure.tight_layout()
  path = root / 'sweep_by_length.png'
  figure.savefig(path, dpi=120)
  plt.close(figure)
  return path
