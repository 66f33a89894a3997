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
"""

import math
import os

import numpy as np
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

SAMPLES = 1000  # sacreBLEU's default number of bootstrap resamples
SEED = 12345  # sacreBLEU's default seed (SACREBLEU_SEED)


def bleu_p_value(baseline: list[str], system: list[str], references: list[str]) -> float:
  """sacreBLEU's paired bootstrap p-value of `system` against `baseline` (aligned lists of
  translations of `references`)."""
  if not len(baseline) == len(system) == len(references):
    raise ValueError(
      f'paired test: {len(baseline)} baseline and {len(system)} system translations for '
      f'{len(references)} references'
    )
  os.environ.setdefault('SACREBLEU_SEED', str(SEED))
  test = PairedTest(
    [('baseline', baseline), ('system', system)],
    {'BLEU': BLEU()},
    references=[references],
    test_type='bs',
    n_samples=SAMPLES,
  )
  _, results = test()
  return float(results['BLEU'][1].p_value)


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
  rng = np.random.default_rng(seed)
  indices = rng.choice(tokens.size, size=(samples, tokens.size), replace=True)

  def bpc(nats, rows=slice(None)):
    return nats[rows].sum(-1) / tokens[rows].sum(-1) / math.log(2)

  observed = abs(bpc(system_nats) - bpc(baseline_nats))
  differences = np.abs(bpc(system_nats, indices) - bpc(baseline_nats, indices))
  centred = differences - differences.mean()
  return float((np.sum(centred >= observed) + 1) / (samples + 1))
