"""corpus_bleu against sacreBLEU's own corpus_bleu, its signature and its errors."""

import math

import pytest
import sacrebleu

from relpos.scoring import corpus_bleu, perplexity

HYPOTHESES = ['The cat sat on the mat.', 'He read the book yesterday , slowly.', 'Hello!']
REFERENCES = ['The cat sat on a mat.', 'Yesterday he read the book slowly.', 'Hello there!']


def test_identical_is_100():
  sentences = ['The quick brown fox jumps over the lazy dog.', 'A second, longer sentence here.']
  assert corpus_bleu(sentences, sentences).score == pytest.approx(100.0)


def test_matches_sacrebleu():
  result = corpus_bleu(HYPOTHESES, REFERENCES)
  expected = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES])
  assert result.score == expected.score
  assert 0 < result.score < 100
  assert result.verbose.endswith(str(expected).removeprefix('BLEU'))


def test_signature():
  result = corpus_bleu(HYPOTHESES, REFERENCES)
  assert 'tok:13a' in result.signature and 'nrefs:1' in result.signature
  assert f'version:{sacrebleu.__version__}' in result.signature
  assert result.verbose.startswith(f'BLEU|{result.signature} = ')


def test_length_mismatch():
  with pytest.raises(ValueError, match='3 hypotheses but 2 references'):
    corpus_bleu(HYPOTHESES, REFERENCES[:2])


def test_empty():
  with pytest.raises(ValueError, match='at least one'):
    corpus_bleu([], [])


def test_perplexity():
  assert perplexity(0.0) == 1.0
  assert perplexity(math.log(50.0)) == pytest.approx(50.0)
  assert perplexity(1e4) == math.inf


def test_length_ratio_counts_13a_tokens():
  """'He read the book yesterday , slowly.' is 8 tokens against 7; 'Hello!' 2 against 3."""
  result = corpus_bleu(HYPOTHESES, REFERENCES)
  assert result.length_ratio == pytest.approx((7 + 8 + 2) / (7 + 7 + 3))
  short = corpus_bleu(['The cat.'], ['The cat sat on a mat.'])
  assert short.length_ratio == pytest.approx(3 / 7)
  expected = sacrebleu.corpus_bleu(['The cat.'], [['The cat sat on a mat.']])
  assert expected.bp == pytest.approx(math.exp(1 - 1 / short.length_ratio))
