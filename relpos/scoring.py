"""Translation metrics: corpus BLEU with sacreBLEU, and perplexity."""

import math
from typing import NamedTuple

from sacrebleu.metrics import BLEU


class BleuResult(NamedTuple):
  """Corpus BLEU as sacreBLEU reports it.

  Attributes:
    score: corpus BLEU, 0..100.
    signature: sacreBLEU's signature, to report with the score, e.g.
      'nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0'.
    verbose: sacreBLEU's report line: signature, score, n-gram precisions, brevity penalty
      and lengths.
    length_ratio: hypothesis length over reference length in 13a tokens; below 1 the score
      carries the brevity penalty exp(1 - 1 / length_ratio).
  """

  score: float
  signature: str
  verbose: str
  length_ratio: float


def corpus_bleu(hypotheses: list[str], references: list[str]) -> BleuResult:
  """sacreBLEU corpus BLEU of detokenised hypotheses against one reference each.

  Default sacreBLEU settings (mixed case, 13a tokenisation, exponential smoothing), so scores
  are comparable with published sacreBLEU figures.

  Raises:
    ValueError: no hypotheses, or not one reference per hypothesis.
  """
  if not hypotheses:
    raise ValueError('corpus_bleu needs at least one hypothesis')
  if len(hypotheses) != len(references):
    raise ValueError(f'{len(hypotheses)} hypotheses but {len(references)} references')
  bleu = BLEU(tokenize='13a')
  result = bleu.corpus_score(hypotheses, [references])
  signature = str(bleu.get_signature())
  return BleuResult(
    result.score,
    signature,
    result.format(signature=signature),
    result.sys_len / max(result.ref_len, 1),
  )


def perplexity(mean_nats: float) -> float:
  """exp of the mean cross-entropy per token, in nats; inf past float range (a diverged run)."""
  try:
    return math.exp(mean_nats)
  except OverflowError:
    return math.inf
