"""Paired significance tests of one system against a baseline on the same test data.

Both are Koehn's (2004) paired bootstrap resampling, as Moses'
`bootstrap-hypothesis-difference-significance.pl` and sacreBLEU implement it: resample the
test items with replacement (the same indices for both systems), score both on every resample,
and take as p-value the share of resamples whose centred absolute difference reaches the
observed one, (count + 1) / (samples + 1).

- BLEU: sacreBLEU's own test (`sacrebleu.significance.PairedTest`, test_type 'bs') on the
  systems' translations; the items are sentences.
- Bits-per-char: the same test on the evaluation's segments (a segment is one step of the
  ordered evaluation: batch rows × tgt_len characters), the score the pooled bpc.

Several seeds are pooled: seed s of the system is paired with seed s of the baseline, and the
items of all seeds form one test set (so the test asks whether the variant differs, seeds
included, not whether one seed pair does).

The bootstrap resamples test items and keeps the trained models fixed. It asks whether these
models differ on data like the test set; it does not see training's randomness, so another set
of seeds may rank them otherwise. `seed_p_value` asks the other question: a two-sided paired
t-test over the seeds' scores (seed s of both systems shares its data order and dropout draws,
and for an evaluation-only field its checkpoint), which treats each seed as one draw of
training and ignores test-set sampling. With 3 seeds it has 2 degrees of freedom, so only
differences that are large against their spread over seeds reach small p-values. A difference
worth reporting should pass both.

    python -m relpos.studies.significance docs/results/table2_k_seeds.csv --baseline=16

tests a finished sweep's `sweep_seeds.csv` again over seeds, against `--baseline` (by default
the file's first value, as the sweep's); `relpos.studies.sweep` writes both p-values for new
sweeps. A file it cannot read or that is no sweep_seeds.csv is one line naming it, exit 1.
"""

import csv
import io
import math
import os
import sys

import numpy as np
from absl import flags
from sacrebleu.significance import PairedTest

from relpos import scoring
from relpos.cli import run_main
from relpos.training.run_results import DIVERGED

# The column after value and seed in a breakdown's per-run file, sweep_by_<by>_seeds.csv
# (`relpos.studies.breakdown`, which imports this module): a row per run and bucket.
BUCKET = 'bucket'

SAMPLES = 1000  # sacreBLEU's default number of bootstrap resamples
SEED = 12345  # sacreBLEU's default seed (SACREBLEU_SEED)


def bleu_p_value(
  baseline: list[str], system: list[str], references: list[str], *, target_lang: str
) -> float:
  """sacreBLEU's paired bootstrap p-value of `system` against `baseline` (aligned lists of
  translations of `references`, into `target_lang`: BLEU as the runs scored it,
  `scoring.bleu_metric`).

  Two systems with the same BLEU get p = 1. sacreBLEU (2.x) counts the resamples whose
  centred difference is strictly above the observed one, so for an observed difference of
  zero (identical translations, say) every resample ties and its p is 1/(samples + 1), about
  0.001: a sweep's table read two identical systems as significantly different.
  `bpc_p_value` counts ties, and gives 1 there by itself."""
  if not len(baseline) == len(system) == len(references):
    raise ValueError(
      f'paired test: {len(baseline)} baseline and {len(system)} system translations for '
      f'{len(references)} references'
    )
  os.environ.setdefault('SACREBLEU_SEED', str(SEED))
  test = PairedTest(
    [('baseline', baseline), ('system', system)],
    {'BLEU': scoring.bleu_metric(target_lang)},
    references=[references],
    test_type='bs',
    n_samples=SAMPLES,
  )
  _, results = test()
  baseline_result, system_result = results['BLEU']
  if system_result.score == baseline_result.score:
    return 1.0
  return float(system_result.p_value)


def bpc_p_value(
  baseline_nats, system_nats, tokens, *, samples: int = SAMPLES, seed: int = SEED
) -> float:
  """Paired bootstrap p-value of the pooled bits-per-char over segments: `baseline_nats` and
  `system_nats` are each segment's summed nats, `tokens` its character count."""
  baseline_nats, system_nats, tokens = (
    np.asarray(a, np.float64) for a in (baseline_nats, system_nats, tokens)
  )
  if not baseline_nats.shape == system_nats.shape == tokens.shape:
    raise ValueError(
      f'paired test: {baseline_nats.size} baseline and {system_nats.size} system segments for '
      f'{tokens.size} token counts'
    )
  check_finite(baseline=baseline_nats, system=system_nats, tokens=tokens)
  rng = np.random.default_rng(seed)
  indices = rng.choice(tokens.size, size=(samples, tokens.size), replace=True)

  def bpc(nats, rows=slice(None)):
    return nats[rows].sum(-1) / tokens[rows].sum(-1) / math.log(2)

  observed = abs(bpc(system_nats) - bpc(baseline_nats))
  differences = np.abs(bpc(system_nats, indices) - bpc(baseline_nats, indices))
  centred = differences - differences.mean()
  return float((np.sum(centred >= observed) + 1) / (samples + 1))


def check_finite(**scores) -> None:
  """Raises ValueError naming each of `scores` (name: numbers) that holds a NaN or an
  infinity: a test of such numbers is no test (NaN differences never reach the observed one,
  so the bootstrap printed its floor, p < 0.001, for them, and the t-test NaN with numpy's
  warnings). Results with such numbers are damaged (`run_results.read_results`), so a sweep
  never gets here with one; a hand-made file or list may."""
  bad = [
    name for name, numbers in scores.items() if not np.isfinite(np.asarray(numbers, float)).all()
  ]
  if bad:
    verb = 'hold' if len(bad) > 1 else 'holds'
    raise ValueError(
      f'paired test: {" and ".join(bad)} {verb} a number that is not finite (NaN or inf)'
    )


def seed_p_value(baseline: dict, system: dict) -> float | None:
  """Two-sided paired t-test of per-seed scores ({seed: score}), seed s of `system` against
  seed s of `baseline`, over the seeds both have. None with fewer than two such seeds, or when
  every seed differs by the same amount, up to rounding (zero variance: no test)."""
  seeds = sorted(set(baseline) & set(system))
  check_finite(baseline=[baseline[seed] for seed in seeds], system=[system[seed] for seed in seeds])
  differences = np.array([system[seed] - baseline[seed] for seed in seeds], np.float64)
  if len(seeds) < 2 or np.allclose(differences, differences[0], rtol=1e-9, atol=0.0):
    return None
  from scipy import stats  # here, not at the top: it takes ~1 s and most commands need none

  return float(stats.ttest_1samp(differences, 0.0).pvalue)


def p_text(p_value: float | None) -> str:
  """A p-value as tables print it: 3 decimals, '< 0.001' below 0.001, '–' for no test. The
  bootstrap's floor, 1/(SAMPLES + 1) = 0.000999 (no resample reached the observed difference),
  is below: rounded, it printed as 0.001, which reads as a p-value the test measured."""
  if p_value is None:
    return '–'
  return '< 0.001' if p_value < 0.001 else f'{p_value:.3f}'


def paired_difference(baseline: dict, system: dict) -> float:
  """The difference of `system` from `baseline` ({seed: score} each) over the seeds both have,
  the seeds `seed_p_value` and the item bootstrap pair: where a seed of one has no score (it
  diverged), the difference of all their means would compare other seed sets than the tests.
  The difference of the means where they share no seed (and no paired test is shown)."""
  seeds = sorted(set(baseline) & set(system))
  if not seeds:
    return mean_and_std(system.values())[0] - mean_and_std(baseline.values())[0]
  return float(np.mean([system[seed] - baseline[seed] for seed in seeds]))


def difference_text(difference: float | None, digits: int = 3) -> str:
  """A difference of means as tables print it: signed, to `digits` decimals (the means'), or to
  2 significant digits where those decimals would show a nonzero difference as 0 (+0.0004, not
  +0.000, beside two means that print alike); '–' for none."""
  if difference is None:
    return '–'
  text = f'{difference:+.{digits}f}'
  return f'{difference:+.2g}' if difference and not float(text) else text


def against_baseline(baseline: dict, system: dict, *, is_baseline: bool) -> dict:
  """One variant's statistics in a sweep's table or a breakdown's bucket, from per-seed
  scores ({seed: score}), its own (`system`) and the baseline's: n, mean, std (ddof 1; None
  for one score, which has no spread), and, unless it is the baseline or the baseline has no
  score, its difference from the baseline (`paired_difference`) and p_seeds (`seed_p_value`).
  None where there is none; mean too where `system` has no score. The one computation of
  `relpos.studies.sweep_tables.summarise` and `relpos.studies.breakdown.by_bucket`, whose
  callers add the test over items (p_value) where the difference is not None."""
  row = {'n': len(system), 'mean': None, 'std': None, 'difference': None, 'p_seeds': None}
  if not system:
    return row
  mean, std = mean_and_std(system.values())
  row.update(mean=mean, std=std if len(system) > 1 else None)
  if not is_baseline and baseline:
    row.update(
      difference=paired_difference(baseline, system), p_seeds=seed_p_value(baseline, system)
    )
  return row


def mean_and_std(scores) -> tuple[float, float]:
  """Mean and standard deviation (ddof 1; 0 for a single score) of a variant's seeds."""
  scores = np.asarray(list(scores), np.float64)
  return float(scores.mean()), float(scores.std(ddof=1)) if len(scores) > 1 else 0.0


def _value_named(text: str, values) -> str:
  """The one of `values` (a CSV's texts) that `text` names: itself, or else the one equal to it
  as a number (--baseline=3e5 names the sweep's 300000.0); `text` where none is."""
  if text in values:
    return text
  try:
    number = float(text)
  except ValueError:
    return text
  for value in values:
    try:
      if float(value) == number:
        return value
    except ValueError:
      continue
  return text


def read_seeds_csv(seeds_csv) -> tuple[str | None, list[dict]]:
  """(the metric column, the rows) of a `sweep_seeds.csv`; ValueError naming the file for one
  that cannot be read (a directory, no such file), is not UTF-8 text (a binary file) or not
  CSV (a NUL byte), so that every error of the command names what it read."""
  try:
    if os.path.isdir(seeds_csv):
      inside = os.path.join(seeds_csv, 'sweep_seeds.csv')
      raise ValueError(
        f'{seeds_csv} is a directory: give a sweep_seeds.csv'
        + (f', such as {inside}' if os.path.isfile(inside) else '')
      )
    with open(seeds_csv, 'rb') as stream:
      text = stream.read().decode('utf-8-sig')  # a spreadsheet's CSV may start with a BOM
    reader = csv.DictReader(io.StringIO(text, newline=''))
    metric = reader.fieldnames[2] if reader.fieldnames and len(reader.fieldnames) > 2 else None
    return metric, list(reader)
  except OSError as error:
    raise ValueError(f'cannot read {seeds_csv}: {error.strerror or error}') from None
  except UnicodeDecodeError as error:  # a binary file
    raise ValueError(
      f'{seeds_csv} is not a sweep_seeds.csv: not UTF-8 text ({error.reason} at byte {error.start})'
    ) from None
  except csv.Error as error:
    raise ValueError(f'{seeds_csv} is not a sweep_seeds.csv ({error})') from None


def seed_table(seeds_csv, baseline: str | None = None) -> str:
  """Markdown: per value of a `sweep_seeds.csv` (value, seed, metric, ...), n, mean, std
  (ddof 1) and `seed_p_value` against the value `baseline`, by default the file's first value
  (the sweep's --values come in its order, and the sweep's own baseline is its first)."""
  metric, rows = read_seeds_csv(seeds_csv)
  if metric is None or not rows or list(rows[0])[:2] != ['value', 'seed']:
    raise ValueError(f'{seeds_csv}: not a sweep_seeds.csv (columns value, seed, metric, ...)')
  if metric == BUCKET:  # line 3 read its bucket '2-4' as the seed test's score
    beside = os.path.join(os.path.dirname(seeds_csv), 'sweep_seeds.csv')
    raise ValueError(
      f"{seeds_csv} is a breakdown's per-run file (a row per run and {BUCKET}): give the "
      "sweep's sweep_seeds.csv" + (f', {beside}' if os.path.isfile(beside) else '')
    )
  if metric == DIVERGED:  # sweep_diverged.csv: its step column would be tested as a score
    raise ValueError(
      f'{seeds_csv} lists diverged runs ({DIVERGED}), which have no scores: give the '
      "sweep's sweep_seeds.csv"
    )
  scores, lines_of = {}, {}
  for number, row in enumerate(rows, start=2):  # line 1 is the header
    try:
      value, seed, score = row['value'], int(row['seed']), float(row[metric])
      if (value, seed) in lines_of:  # two sweeps' files joined, say: which one is meant?
        raise LookupError(
          f'{seeds_csv} line {number}: value {value} seed {seed} again (first on line '
          f'{lines_of[value, seed]}); keep one row per value and seed'
        )
      lines_of[value, seed] = number
      if not math.isfinite(score):  # a damaged run's: its mean and test would be NaN
        raise LookupError(
          f'{seeds_csv} line {number}: value {value} seed {seed} has {metric} {row[metric]!r}, '
          'not a finite number: score that run again, or leave its row out'
        )
      scores.setdefault(value, {})[seed] = score
    except LookupError as error:
      raise ValueError(str(error)) from None
    except (TypeError, ValueError):
      raise ValueError(
        f'{seeds_csv} line {number}: seed {row["seed"]!r} and {metric} {row[metric]!r} are not '
        'an integer and a number'
      ) from None
  baseline = next(iter(scores)) if baseline is None else _value_named(baseline, scores)
  if baseline not in scores:
    raise ValueError(f'--baseline={baseline} is not a value of {seeds_csv}: {list(scores)}')
  lines = [
    f'{metric} by value: mean ± std over seeds; two-sided paired t-test over seeds against '
    f'{baseline}',
    '',
    f'| value | n | {metric} mean | std | p-value (seeds) |',
    '|---|---|---|---|---|',
  ]
  for value, per_seed in scores.items():
    mean, std = mean_and_std(per_seed.values())
    p_cell = '(baseline)' if value == baseline else p_text(seed_p_value(scores[baseline], per_seed))
    std_cell = f'{std:.3f}' if len(per_seed) > 1 else '–'  # no spread from one seed
    lines.append(f'| {value} | {len(per_seed)} | {mean:.3f} | {std_cell} | {p_cell} |')
  return '\n'.join(lines) + '\n'


def main(argv):
  if len(argv) != 2:
    sys.exit(
      f'error: give one sweep_seeds.csv (got {len(argv) - 1} arguments): '
      'python -m relpos.studies.significance FILE [--baseline=V]'
    )
  print(seed_table(argv[1], flags.FLAGS.baseline), end='')


if __name__ == '__main__':
  flags.DEFINE_string(
    'baseline', None, 'The value the others are tested against (default: the first in the file).'
  )
  # OSError of any kind is one line too, as it was before run_main: its reads already raise
  # ValueError naming the file (`read_seeds_csv`), so what is left is writing the table.
  run_main(main, positional=True, user_errors=(OSError, ValueError))
