"""Translation data: parallel text, SentencePiece vocabulary, tfds WMT reading, token batches.

Everything runs on small generated files (no downloaded corpus): a few hundred sentences of
made-up words, a ~100-piece vocabulary, and a tensorflow-datasets copy of `wmt14_translate/de-en`
written here in the array_record format without TensorFlow.
"""

import bz2
import gzip
import itertools
import os
import re
import sys
import threading
import unicodedata
import zipfile

import ml_collections
import numpy as np
import pytest

from relpos import messages
from relpos.config.translation_defaults import translate_config
from relpos.data import parallel_text, token_batches, tokenizer, translation, wmt_tfds
from relpos.data.shard import Shard
from relpos.data.token_batches import EncodedPairs, Ragged, TokenBatches

SYLLABLES = 'ka ri to me sa nu lo pe di ga ve zu mo ha ti be ro ne si fa'.split()
VOCAB_SIZE = 100


def _sentences(count: int, seed: int) -> list[str]:
  """`count` sentences of 2-12 words built from SYLLABLES, some with punctuation."""
  rng = np.random.default_rng(seed)
  words = [''.join(rng.choice(SYLLABLES, size=rng.integers(1, 4))) for _ in range(150)]
  sentences = []
  for _ in range(count):
    sentence = ' '.join(rng.choice(words, size=rng.integers(2, 13)))
    sentences.append(sentence.capitalize() + rng.choice(['.', '?', '!', ', ja.']))
  return sentences


SOURCES = _sentences(300, seed=0)
TARGETS = _sentences(300, seed=1)


def _write(path, lines):
  data = ''.join(line + '\n' for line in lines).encode('utf-8')
  if path.suffix == '.gz':
    data = gzip.compress(data)
  path.write_bytes(data)
  return path


@pytest.fixture(scope='module')
def spm_tokenizer(tmp_path_factory):
  path = tmp_path_factory.mktemp('vocab') / 'spm.model'
  return tokenizer.train_or_load(path, SOURCES + TARGETS, VOCAB_SIZE, max_sentences=500, seed=0)


# --- parallel_text --------------------------------------------------------------------------


@pytest.mark.parametrize('name', ['lines.txt', 'lines.txt.gz'])
def test_read_lines_plain_and_gzip(tmp_path, name):
  path = tmp_path / name
  data = '\ufeffEins\r\nZwei\u2028mit Trenner\n\nDrei ä'.encode()
  path.write_bytes(gzip.compress(data) if name.endswith('.gz') else data)
  # BOM and '\r' removed; only '\n' splits; no final newline still gives the last line.
  assert parallel_text.read_lines(path) == ['Eins', 'Zwei\u2028mit Trenner', '', 'Drei ä']


def test_read_lines_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match=r'config\.data\.train_src = .*nope\.txt'):
    parallel_text.read_lines(tmp_path / 'nope.txt', field='config.data.train_src')
  bad = tmp_path / 'latin1.txt'
  bad.write_bytes('gut\nauch gut\nschlecht: \u00e4\n'.encode('latin-1'))
  with pytest.raises(ValueError, match=r'latin1\.txt line 3 is not valid UTF-8'):
    parallel_text.read_lines(bad)
  # Both offsets count from 1 (the byte in the whole was counted from 0: one before `cmp`'s).
  bad.write_bytes(b'abc\n\xe9t\xe9\n')
  with pytest.raises(ValueError) as caught:
    parallel_text.read_lines(bad)
  assert str(caught.value) == (
    f'{bad} line 2 is not valid UTF-8 (invalid continuation byte at byte 1 of the line, byte 5 '
    'of the whole, counted from 1); re-encode it as UTF-8'
  )
  truncated = tmp_path / 'cut.txt.gz'
  truncated.write_bytes(gzip.compress(b'a\nb\n' * 100)[:-10])
  with pytest.raises(ValueError, match=r'cut\.txt\.gz is a gzip file but not a complete one'):
    parallel_text.read_lines(truncated)
  several = tmp_path / 'sides.zip'
  with zipfile.ZipFile(several, 'w') as archive:
    archive.writestr('src.txt', 'a\n')
    archive.writestr('tgt.txt', 'A\n')
  with pytest.raises(
    ValueError, match=r'sides\.zip is a zip holding 2 files \(src\.txt, tgt\.txt\)'
  ):
    parallel_text.read_lines(several)


@pytest.mark.parametrize('name', ['mac.txt', 'mac.txt.gz'])
def test_read_lines_refuses_bare_carriage_return_line_endings(tmp_path, name):
  """A file of classic Mac OS line endings ('\\r' alone) was read as one line: an eval set
  became 1 pair over config.data.max_length ('raise it'), a training side 1 sentence
  SentencePiece skipped. One line names the file, its field and its line endings."""
  data = b'Eins\rZwei\rDrei\r'
  path = tmp_path / name
  path.write_bytes(gzip.compress(data) if name.endswith('.gz') else data)
  with pytest.raises(
    ValueError,
    match=r'^\S*mac\.txt(\.gz)? \(config\.data\.eval_src\) ends its lines in a bare carriage '
    r"return \('\\r', classic Mac OS line endings: 3 of them and no '\\n' in its first 15 "
    r'bytes\), so it reads as one line; ',
  ) as caught:
    parallel_text.read_lines(path, field='config.data.eval_src')
  # The remedy reads a compressed file's text (it said `tr '\\r' '\\n' < mac.txt.gz`, which
  # converts the gzip file's bytes, "decompressed first" only in words).
  convert = (
    f"zcat {path} | tr '\\r' '\\n' > fixed.txt"
    if name.endswith('.gz')
    else f"tr '\\r' '\\n' < {path} > fixed.txt"
  )
  assert str(caught.value).endswith(f'convert it, e.g. `{convert}`, and give that file')
  # One '\\r' inside a line, and '\\r\\n' endings, are read as before.
  path.write_bytes(b'a\rb')
  assert parallel_text.read_lines(path) == ['a\rb']
  path.write_bytes(b'a\r\nb\r\n')
  assert parallel_text.read_lines(path) == ['a', 'b']


def test_line_count_mismatch_names_bare_carriage_returns(tmp_path):
  """A side whose lines end in '\\n' but some in a bare '\\r' (mixed endings) held 40 sentences
  in 27 lines: 'has 27 lines' was all the refusal said. It names the bare '\\r's now, with the
  remedy of classic Mac OS endings; a '\\r' inside a line of sides that line up is text."""
  src = _write(tmp_path / 'ev.en', [f's{i}' for i in range(6)])
  mixed = tmp_path / 'mixed.de'
  mixed.write_bytes(b't0\rt1\nt2\r\nt3\rt4\nt5\n')
  with pytest.raises(ValueError) as caught:
    parallel_text.read_parallel(src, mixed)
  assert str(caught.value) == (
    f'parallel files differ in line count: {src} has 6 lines, {mixed} has 4; they must be '
    f"line-aligned; {mixed} holds 2 bare carriage returns ('\\r' not followed by '\\n', in 2 "
    'of its 4 lines), which end no line here: if they end sentences (classic Mac OS line '
    f"endings mixed with '\\n' ones), convert them, e.g. `tr '\\r' '\\n' < {mixed} > "
    'fixed.txt`, and give that file'
  )
  # Without bare '\\r's the line says no more than the counts.
  short = _write(tmp_path / 'short.de', ['t0'])
  with pytest.raises(ValueError, match=r'has 1; they must be line-aligned$'):
    parallel_text.read_parallel(src, short)
  inside = _write(tmp_path / 'inside.de', ['t0\rx', 't1', 't2', 't3', 't4', 't5'])
  assert parallel_text.read_parallel(src, inside)[1][0] == 't0\rx'


@pytest.mark.parametrize('encoding', ['UTF-16LE', 'UTF-16BE'])
def test_read_lines_names_utf16_without_a_byte_order_mark(tmp_path, encoding):
  """ASCII text in UTF-16 without a BOM is valid UTF-8, a NUL beside each character: it was
  read as such, and refused as 'has 41 lines' against a 40-line other side. One line names the
  encoding and the conversion."""
  path = tmp_path / 'u16.en'
  path.write_bytes(''.join(f'{s}\n' for s in SOURCES[:40]).encode(encoding.lower()))
  offsets = 'odd' if encoding == 'UTF-16LE' else 'even'
  with pytest.raises(ValueError) as caught:
    parallel_text.read_lines(path, field='config.data.eval_src')
  message = str(caught.value)
  assert message.startswith(f'{path} (config.data.eval_src) holds NUL bytes (')
  assert f'at {offsets} offsets): it looks like {encoding} text, not UTF-8; convert it, e.g. ' in (
    message
  )
  assert message.endswith(
    f'`iconv -f {encoding} -t UTF-8 < {path} > fixed.txt`, and give that file'
  )
  # A stray NUL in UTF-8 text is no encoding.
  path.write_bytes(b'a sentence\x00 with a NUL\nanother\n')
  assert len(parallel_text.read_lines(path)) == 2


def test_read_lines_names_a_pipe(tmp_path):
  """A named pipe given as a side was 'not a file; set it to a text file'."""
  fifo = tmp_path / 'src.fifo'
  os.mkfifo(fifo)
  with pytest.raises(ValueError, match=r'^config\.data\.train_src=\S*src\.fifo is a pipe '):
    parallel_text.read_lines(fifo, field='config.data.train_src')


@pytest.mark.parametrize('name', ['renamed_gzip.txt', 'lines.txt.bz2'])
def test_read_lines_decompresses_by_content_not_name(tmp_path, name):
  """A gzip file without `.gz` and a bzip2 file were read raw: 'not valid UTF-8' (T12)."""
  data = 'Eins\nZwei ä\n'.encode()
  path = tmp_path / name
  path.write_bytes(bz2.compress(data) if name.endswith('.bz2') else gzip.compress(data))
  assert parallel_text.read_lines(path) == ['Eins', 'Zwei ä']


def test_read_lines_warns_once_about_tab_separated_pairs(tmp_path, capsys):
  """A Tatoeba-style TSV given as one side trained on 'en<TAB>de' lines silently (T7, T8)."""
  pairs = _write(
    tmp_path / 'pairs.tsv', [f'{s}\t{t}' for s, t in zip(SOURCES, TARGETS, strict=True)] + ['']
  )
  lines = parallel_text.read_lines(pairs, field='config.data.train_src')
  assert len(lines) == len(SOURCES) + 1
  warnings = capsys.readouterr().err.strip().split('\n')
  assert len(warnings) == 1 and warnings[0].startswith('warning: ')
  assert (
    'pairs.tsv (config.data.train_src): 300 of its 300 non-empty lines hold a tab' in warnings[0]
  )
  assert 'one sentence per line' in warnings[0] and 'relpos.data.prepare tatoeba' in warnings[0]
  # Lines padded with ' \\t' hold no pair: no warning (it said '40 of its 40 non-empty lines
  # hold a tab').
  padded = _write(tmp_path / 'padded.txt', [f'{s} \t' for s in SOURCES])
  assert parallel_text.read_lines(padded)[0] == f'{SOURCES[0]} \t'
  assert capsys.readouterr().err == ''
  # A few tabs inside sentences are not a TSV.
  some = _write(tmp_path / 'some.txt', ['a\tb', 'c', 'd\te', 'f'])
  assert parallel_text.read_lines(some) == ['a\tb', 'c', 'd\te', 'f']
  assert capsys.readouterr().out == ''


def test_read_lines_warns_once_about_sgml_markup(tmp_path, capsys):
  """A WMT test set as released (`newstest2014-deen-src.en.sgm`) was read as plain text: its
  `<doc ...>`, `<seg id=..>...</seg>` and `</doc>` lines scored as sentences (W3a)."""
  sgml = ['<srcset setid="newstest2014" srclang="any">']
  for doc in range(2):
    sgml.append(f'<doc docid="{doc}-news" genre="news" origlang="de">')
    sgml += [f'<seg id="{i + 1}">{SOURCES[i]}</seg>' for i in range(3)]
    sgml.append('</doc>')
  sgml.append('</srcset>')
  path = _write(tmp_path / 'newstest-src.en.sgm', sgml)
  assert parallel_text.read_lines(path, field='config.data.eval_src') == sgml
  warnings = capsys.readouterr().err.strip().split('\n')
  assert len(warnings) == 1 and warnings[0].startswith('warning: ')
  assert (
    'newstest-src.en.sgm (config.data.eval_src): 12 of its 12 non-empty lines start with '
    'SGML/XML markup' in warnings[0]
  )
  assert 'one sentence per line' in warnings[0] and '<seg>' in warnings[0]
  assert 'sacrebleu -t wmt14 -l en-de --echo src' in warnings[0]
  # Sentences that hold, or even start with, a tag or a '<' now and then are plain text.
  some = _write(tmp_path / 'some.txt', ['<b>Bold</b> news', 'a < b', '<3 you', 'x <seg>', 'y'])
  parallel_text.read_lines(some)
  assert capsys.readouterr().err == ''


def test_read_parallel_drops_empty_pairs_and_logs(tmp_path, capsys):
  src = _write(tmp_path / 'src.txt.gz', ['a', '', 'c', 'd', '  ', 'f'])
  tgt = _write(tmp_path / 'tgt.txt', ['A', 'B', ' ', 'D', 'E', 'F'])
  assert parallel_text.read_parallel(src, tgt) == (['a', 'd', 'f'], ['A', 'D', 'F'])
  assert 'dropped 3 pairs with an empty side' in capsys.readouterr().err
  assert parallel_text.read_parallel(src, tgt, limit=2) == (['a', 'd'], ['A', 'D'])
  # Process 1 of 2 keeps lines 1, 3, 5 (then drops the empty ones) and half the limit.
  assert parallel_text.read_parallel(src, tgt, shard=Shard(1, 2)) == (['d', 'f'], ['D', 'F'])
  assert parallel_text.read_parallel(src, tgt, shard=Shard(1, 2), limit=2) == (['d'], ['D'])
  # An odd limit rounds up (2 processes keep 2 + 2 >= 3), never down to 0, which is no limit.
  assert parallel_text.read_parallel(src, tgt, shard=Shard(1, 2), limit=3) == (
    ['d', 'f'],
    ['D', 'F'],
  )
  assert parallel_text.read_parallel(src, tgt, shard=Shard(1, 2), limit=1) == (['d'], ['D'])
  assert [Shard(0, 4).limit(n) for n in (0, 1, 4, 5)] == [0, 1, 1, 2]


def test_read_parallel_errors(tmp_path):
  src = _write(tmp_path / 'src.txt', ['a', 'b', 'c'])
  tgt = _write(tmp_path / 'tgt.txt', ['A', 'B'])
  with pytest.raises(ValueError, match=r'src\.txt has 3 lines, .*tgt\.txt has 2'):
    parallel_text.read_parallel(src, tgt)
  fields = ('config.data.eval_src', 'config.data.eval_tgt')
  with pytest.raises(FileNotFoundError, match=r'config\.data\.eval_tgt'):
    parallel_text.read_parallel(src, tmp_path / 'missing.txt', fields=fields)


def test_moses_detokenize_unescapes():
  lines = ['It &apos;s a &quot; test &quot; , A &amp; B .', 'Tom &apos;s [ x ] &lt;b&gt; !']
  assert parallel_text.moses_detokenize(lines, 'en') == [
    'It\'s a "test", A & B.',
    "Tom's [x] <b>!",
  ]
  assert parallel_text.moses_detokenize(['Er sagte : &quot; Ja &quot; .'], 'de') == [
    'Er sagte: "Ja".'
  ]


@pytest.mark.parametrize(
  'english, french',
  [('en', 'fr'), ('EN', 'FR'), ('en-US', 'fr-CA'), ('en_GB', 'fr_FR'), ('eng', 'fre')],
)
def test_moses_detokenize_reads_the_language_code_as_bleu_does(english, french):
  """sacremoses applies its English (French, Czech, ...) rules for the exact code 'en' ('fr',
  'cs', ...) only, and gave 'EN', 'en-US' or 'eng' its language-independent ones in silence:
  "It 's" stayed apart. The code is read as BLEU's tokenizer reads it
  (`relpos.languages.primary_language`)."""
  assert parallel_text.moses_detokenize(['It &apos;s « Oui » !'], english) == ["It's « Oui »!"]
  assert parallel_text.moses_detokenize(['Oui !'], french) == ['Oui !']


# --- tokenizer ------------------------------------------------------------------------------


def test_tokenizer_ids_and_round_trip(spm_tokenizer):
  assert spm_tokenizer.vocab_size == VOCAB_SIZE
  assert (tokenizer.PAD_ID, tokenizer.EOS_ID, tokenizer.BOS_ID, tokenizer.UNK_ID) == (0, 1, 2, 3)
  processor = spm_tokenizer.processor
  assert [processor.pad_id(), processor.eos_id(), processor.bos_id(), processor.unk_id()] == [
    0,
    1,
    2,
    3,
  ]
  for sentence in SOURCES[:20]:
    ids = spm_tokenizer.encode(sentence)
    assert ids and min(ids) > tokenizer.UNK_ID  # no special ids, no unknown pieces
    assert spm_tokenizer.decode(ids) == sentence
  assert spm_tokenizer.encode_batch(SOURCES[:5]) == [spm_tokenizer.encode(s) for s in SOURCES[:5]]


def test_decode_stops_at_eos_and_skips_pad_bos(spm_tokenizer):
  ids = spm_tokenizer.encode(SOURCES[0])
  other = spm_tokenizer.encode(SOURCES[1])
  padded = [tokenizer.BOS_ID, *ids, tokenizer.EOS_ID, *other, tokenizer.PAD_ID]
  assert spm_tokenizer.decode(np.array(padded)) == SOURCES[0]
  assert spm_tokenizer.decode([*ids[:2], tokenizer.PAD_ID, *ids[2:]]) == SOURCES[0]


def test_train_or_load_reuses_and_is_deterministic(tmp_path, spm_tokenizer):
  # An existing model is loaded as is: the (here unusable) sentences are never read.
  again = tokenizer.train_or_load(spm_tokenizer.path, [], VOCAB_SIZE, max_sentences=500, seed=0)
  assert again.encode(SOURCES[3]) == spm_tokenizer.encode(SOURCES[3])
  retrained = tokenizer.train_or_load(
    tmp_path / 'sub' / 'spm.model', SOURCES + TARGETS, VOCAB_SIZE, max_sentences=500, seed=0
  )
  assert retrained.path.read_bytes() == spm_tokenizer.path.read_bytes()
  assert sorted(p.name for p in retrained.path.parent.iterdir()) == ['spm.model', 'spm.model.made']


def test_train_or_load_errors(tmp_path, spm_tokenizer):
  with pytest.raises(ValueError, match=r'config\.data\.vocab_size=\d+; pass that'):
    tokenizer.train_or_load(spm_tokenizer.path, SOURCES, 200, max_sentences=0, seed=0)
  path = tmp_path / 'spm.model'
  with pytest.raises(ValueError, match=r'config\.data\.vocab_size=5000 on 40 sentences'):
    tokenizer.train_or_load(path, SOURCES[:40], 5000, max_sentences=0, seed=0)
  assert not list(tmp_path.iterdir())  # nothing written, not even a partial file


def test_tokenizer_rejects_other_special_ids(tmp_path):
  path = tmp_path / 'default_ids.model'
  with open(path, 'wb') as f:
    tokenizer.spm.SentencePieceTrainer.train(
      sentence_iterator=iter(SOURCES), model_writer=f, vocab_size=60, minloglevel=2
    )
  with pytest.raises(ValueError, match=r'special ids .* use a new --workdir'):
    tokenizer.Tokenizer(path)


def test_sample_sentences():
  sentences = [f's{i}' for i in range(100)]
  sample = tokenizer.sample_sentences(iter(sentences), 10, seed=3)
  assert len(set(sample)) == 10 and sample == sorted(sample, key=sentences.index)
  assert sample == tokenizer.sample_sentences(sentences, 10, seed=3)
  assert sample != tokenizer.sample_sentences(sentences, 10, seed=4)
  assert tokenizer.sample_sentences(sentences, 0, seed=3) == sentences


# --- wmt_tfds -------------------------------------------------------------------------------

TFDS_NAME = 'wmt14_translate/de-en'


def _prepare_tfds(data_dir, splits: dict[str, list[tuple[str, str]]]):
  """Writes a prepared array_record copy of TFDS_NAME holding (de, en) `splits`."""
  import tensorflow_datasets as tfds
  from array_record.python import array_record_module
  from tensorflow_datasets.core import example_serializer, naming

  folder = data_dir / TFDS_NAME / '1.0.0'
  folder.mkdir(parents=True)
  features = tfds.features.Translation(languages=('de', 'en'))
  serializer = example_serializer.ExampleSerializer(features.get_serialized_info())
  infos = []
  for split, pairs in splits.items():
    template = naming.ShardedFileTemplate(
      data_dir=folder, dataset_name='wmt14_translate', split=split, filetype_suffix='array_record'
    )
    writer = array_record_module.ArrayRecordWriter(
      str(template.sharded_filepath(shard_index=0, num_shards=1)), 'group_size:1'
    )
    for de, en in pairs:
      writer.write(serializer.serialize_example(features.encode_example({'de': de, 'en': en})))
    writer.close()
    infos.append(
      tfds.core.SplitInfo(
        name=split, shard_lengths=[len(pairs)], num_bytes=0, filename_template=template
      )
    )
  tfds.folder_dataset.write_metadata(
    data_dir=folder, features=features, split_infos=infos, check_data=False
  )


@pytest.fixture(scope='module')
def tfds_dir(tmp_path_factory):
  data_dir = tmp_path_factory.mktemp('tfds')
  train = list(zip(TARGETS, SOURCES, strict=True))
  train[5] = ('', 'Empty German side.')
  _prepare_tfds(data_dir, {'train': train, 'test': [('Grüße, "ja"!', "It's ok.")] * 3})
  return data_dir


def test_read_tfds_pairs(tfds_dir, capsys):
  src, tgt = wmt_tfds.read_tfds_pairs(
    TFDS_NAME, 'train', data_dir=str(tfds_dir), source_lang='en', target_lang='de'
  )
  expected = [(s, t) for i, (s, t) in enumerate(zip(SOURCES, TARGETS, strict=True)) if i != 5]
  assert list(zip(src, tgt, strict=True)) == expected
  assert 'dropped 1 pair with an empty side (record 6)' in capsys.readouterr().err
  src, tgt = wmt_tfds.read_tfds_pairs(
    TFDS_NAME, 'train', data_dir=tfds_dir, source_lang='de', target_lang='en', limit=7
  )
  assert src == TARGETS[:5] + TARGETS[6:8] and tgt == SOURCES[:5] + SOURCES[6:8]
  src, _ = wmt_tfds.read_tfds_pairs(
    TFDS_NAME, 'train', data_dir=tfds_dir, source_lang='en', target_lang='de', shard=Shard(2, 3)
  )
  assert src == [SOURCES[i] for i in range(2, len(SOURCES), 3) if i != 5]  # 5 has an empty side
  assert 'tensorflow' not in sys.modules


def test_reading_many_tfds_pairs_says_so(tfds_dir, capsys, monkeypatch):
  """WMT14's 4.5M training pairs were read with nothing said; a split of many pairs
  (`parallel_text.ANNOUNCED_PAIRS`, lowered here) now gets a line first."""
  monkeypatch.setattr(parallel_text, 'ANNOUNCED_PAIRS', len(SOURCES))
  for split in ('train', 'test'):
    wmt_tfds.read_tfds_pairs(
      TFDS_NAME, split, data_dir=str(tfds_dir), source_lang='en', target_lang='de'
    )
  assert capsys.readouterr().out == f'reading {len(SOURCES):,} pairs of {TFDS_NAME} split train\n'


def test_read_tfds_pairs_errors(tmp_path, tfds_dir):
  with pytest.raises(FileNotFoundError, match=r'not prepared .*tfds build wmt14_translate/de-en '):
    wmt_tfds.read_tfds_pairs(
      TFDS_NAME, 'test', data_dir=str(tmp_path), source_lang='en', target_lang='de'
    )
  with pytest.raises(FileNotFoundError, match=r'--file_format=array_record'):
    wmt_tfds.read_tfds_pairs(
      'wmt_t2t_translate/de-en', 'test', data_dir=tfds_dir, source_lang='en', target_lang='de'
    )
  with pytest.raises(ValueError, match=r"has languages \('de', 'en'\), not \['fr'\]"):
    wmt_tfds.read_tfds_pairs(
      TFDS_NAME, 'test', data_dir=tfds_dir, source_lang='fr', target_lang='de'
    )


# --- token_batches --------------------------------------------------------------------------


def _random_pairs(count: int, seed: int, max_len: int = 30) -> list[tuple[list[int], list[int]]]:
  rng = np.random.default_rng(seed)
  return [
    (
      rng.integers(4, 50, size=rng.integers(1, max_len + 1)).tolist(),
      rng.integers(4, 50, size=rng.integers(0, max_len + 1)).tolist(),
    )
    for _ in range(count)
  ]


PAIRS = _random_pairs(500, seed=0)


def test_ragged_round_trip():
  seqs = [[1, 2, 3], [], [4], [5, 6]]
  parts = [Ragged.from_lists(seqs[:2]), Ragged.from_lists([]), Ragged.from_lists(seqs[2:])]
  for ragged in (Ragged.from_lists(seqs), Ragged.concatenate(parts)):
    assert [r.tolist() for r in (ragged[i] for i in range(len(ragged)))] == seqs
    assert ragged.lengths.tolist() == [3, 0, 1, 2] and ragged.values.dtype == np.int32
  assert len(Ragged.concatenate([])) == 0
  encoded = EncodedPairs.from_pairs(PAIRS)
  assert len(encoded) == len(PAIRS)
  assert [x.tolist() for x in encoded[7]] == list(PAIRS[7])
  with pytest.raises(ValueError, match='4 sources but 2 targets'):
    EncodedPairs(Ragged.from_lists(seqs), Ragged.from_lists(seqs[:2]))


def _padded_total(lengths, boundaries) -> int:
  """Positions the examples of `lengths` take when each pads to the next boundary."""
  return sum(boundaries[np.searchsorted(boundaries, n)] for n in lengths)


def test_fit_boundaries_is_optimal():
  rng = np.random.default_rng(0)
  for _ in range(20):
    max_len, num_buckets = int(rng.integers(3, 12)), int(rng.integers(1, 5))
    lengths = rng.integers(1, max_len + 1, size=int(rng.integers(1, 30)))
    boundaries = token_batches.fit_boundaries(lengths, num_buckets, max_len)
    best = min(
      _padded_total(lengths, (*inner, max_len))
      for k in range(num_buckets)
      for inner in itertools.combinations(range(1, max_len), k)
    )
    assert boundaries[-1] == max_len and len(boundaries) <= num_buckets
    assert list(boundaries) == sorted(set(boundaries))
    assert _padded_total(lengths, boundaries) == best


def _check_batch(batch, pairs):
  """Asserts the layout of every row of `batch` against `pairs`; returns its example indices."""
  rows, length = batch['src'].shape
  assert all(
    batch[k].shape == (rows, length) and batch[k].dtype == np.int32
    for k in ('src', 'tgt_in', 'tgt_out')
  )
  assert batch['index'].shape == (rows,) and batch['index'].dtype == np.int32
  for row, i in enumerate(batch['index']):
    if i < 0:
      assert not batch['src'][row].any() and not batch['tgt_in'][row].any()
      assert not batch['tgt_out'][row].any()
      continue
    s, t = pairs[i]
    pad = [tokenizer.PAD_ID] * length
    assert batch['src'][row].tolist() == (s + [tokenizer.EOS_ID] + pad)[:length]
    assert batch['tgt_in'][row].tolist() == ([tokenizer.BOS_ID] + t + pad)[:length]
    assert batch['tgt_out'][row].tolist() == (t + [tokenizer.EOS_ID] + pad)[:length]
    assert max(len(s), len(t)) + 1 <= length
  return [int(i) for i in batch['index'] if i >= 0]


def test_no_pair_within_max_length_is_one_error_and_no_warning(capsys):
  """Every pair too long: one error naming the field (a warning that every pair was dropped,
  then an error that did not name config.data.max_length, said it twice)."""
  with pytest.raises(ValueError) as error:
    TokenBatches(PAIRS, max_tokens=256, num_buckets=2, max_length=0, name='x pairs')
  assert str(error.value) == (
    'none of the 500 x pairs has both sides within config.data.max_length=0 pieces: raise it'
  )
  assert capsys.readouterr().err == ''


def test_pairs_dropped_are_warned_of_once_per_command(capsys):
  """train.py batches the eval pairs for its validation and again for the evaluation at the
  end: the same `warning: dropped 7 of 40 evaluation pairs ...` line was printed twice."""
  for _ in range(2):
    TokenBatches(PAIRS, max_tokens=256, num_buckets=2, max_length=25, name='x pairs')
  TokenBatches(PAIRS, max_tokens=256, num_buckets=2, max_length=20, name='x pairs')  # other
  warnings = capsys.readouterr().err.splitlines()
  assert [line.split(' with ')[0] for line in warnings] == [
    f'warning: dropped {sum(max(len(s), len(t)) > limit for s, t in PAIRS)} of 500 x pairs'
    for limit in (25, 20)
  ]


def test_epoch_covers_every_pair_once_with_fixed_shapes(capsys):
  batches = TokenBatches(
    PAIRS, max_tokens=256, num_buckets=4, max_length=25, seed=1, row_multiple=2, name='x pairs'
  )
  kept = [i for i, (s, t) in enumerate(PAIRS) if max(len(s), len(t)) <= 25]
  assert capsys.readouterr().err == (
    f'warning: dropped {len(PAIRS) - len(kept)} of 500 x pairs with a side longer than '
    'config.data.max_length=25 pieces\n'
  )
  assert batches.num_examples == len(kept) and batches.boundaries[-1] == 26
  assert len(batches.boundaries) == 4
  for rows, length in zip(batches.rows, batches.boundaries, strict=True):
    assert rows * length <= 256 and rows % 2 == 0 and (rows + 2) * length > 256
  for epoch in range(2):
    seen, shapes = [], set()
    for step in range(epoch * batches.batches_per_epoch, (epoch + 1) * batches.batches_per_epoch):
      got_epoch, batch = batches.batch(step)
      assert got_epoch == epoch
      seen += _check_batch(batch, PAIRS)
      shapes.add(batch['src'].shape)
    assert sorted(seen) == kept
    assert shapes == set(batches.shapes)


def test_batches_are_a_pure_function_of_seed_and_step():
  def make(seed):
    return TokenBatches(PAIRS, max_tokens=300, num_buckets=3, max_length=30, seed=seed)

  first, resumed, other_seed = make(7), make(7), make(8)
  per_epoch = first.batches_per_epoch
  sequence = [first.batch(s)[1] for s in range(2 * per_epoch + 3)]
  for step in (2 * per_epoch + 2, 5, per_epoch):  # out of order, as after a restart
    assert all(np.array_equal(v, sequence[step][k]) for k, v in resumed.batch(step)[1].items())

  def order(batches, epoch):
    return [
      batches.batch(s)[1]['index'].tolist()
      for s in range(epoch * per_epoch, (epoch + 1) * per_epoch)
    ]

  assert order(first, 0) != order(first, 1)
  assert order(first, 0) != order(other_seed, 0)


def test_each_epoch_shuffles_which_pairs_share_a_batch():
  """Epoch e shuffles each bucket's members with (seed, e), not only the order of the batches:
  a member shuffle seeded without the epoch batched the same pairs together in every epoch,
  which the batch order above (shuffled per epoch on its own) did not show."""
  batches = TokenBatches(PAIRS, max_tokens=300, num_buckets=3, max_length=30, seed=7)
  per_epoch = batches.batches_per_epoch

  def groups(epoch):
    rows = (batches.batch(s)[1]['index'] for s in range(epoch * per_epoch, (epoch + 1) * per_epoch))
    return {frozenset(index[index >= 0].tolist()) for index in rows}

  first, second = groups(0), groups(1)
  assert len(first) == len(second) == per_epoch > 4  # batches of distinct pairs, either epoch
  assert len(first & second) <= per_epoch // 4, 'most batches should hold other pairs'


def _thread_shards(count: int) -> list[Shard]:
  """Shards whose all_gather exchanges arrays between `count` threads (standing in for
  processes): each thread must call it in the same order, as processes call a collective."""
  barrier, slots = threading.Barrier(count), [None] * count

  def gather_for(index):
    def all_gather(x):
      slots[index] = np.asarray(x)
      barrier.wait()
      gathered = np.stack(slots)
      barrier.wait()  # nobody overwrites a slot before everyone has read them all
      return gathered

    return all_gather

  return [Shard(i, count, gather_for(i)) for i in range(count)]


def _in_threads(make, shards):
  """[make(shard) for shard in shards], each in its own thread."""
  results = [None] * len(shards)

  def run(i):
    results[i] = make(shards[i])

  threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(shards))]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(timeout=60)
  assert all(r is not None for r in results)
  return results


def test_the_batch_plan_changes_with_the_row_multiple_where_the_rows_round_otherwise():
  """The device count enters translation batching through row_multiple: rows are rounded down
  to a multiple of it, so 1 and 2 devices can differ in rows and batches per epoch (W2)."""
  one, two = (
    TokenBatches(PAIRS, max_tokens=256, num_buckets=4, max_length=25, row_multiple=multiple)
    for multiple in (1, 2)
  )
  assert one.plan['rows'] == list(one.rows) and one.plan['processes'] == 1
  assert two.plan['rows'] == [rows // 2 * 2 for rows in one.rows] != one.plan['rows']
  assert one.plan != two.plan
  even = TokenBatches(PAIRS, max_tokens=16 * 26, boundaries=[26], max_length=25, row_multiple=2)
  assert even.plan == TokenBatches(PAIRS, max_tokens=16 * 26, boundaries=[26], max_length=25).plan


def test_sharded_batches_agree_on_shapes_and_cover_every_pair_once():
  whole = TokenBatches(PAIRS, max_tokens=256, num_buckets=4, max_length=25, row_multiple=2)
  shards = _thread_shards(2)
  parts = _in_threads(
    lambda shard: TokenBatches(
      [PAIRS[i] for i in shard.records(len(PAIRS))],
      max_tokens=256,
      num_buckets=4,
      max_length=25,
      seed=1,
      row_multiple=2,
      shard=shard,
    ),
    shards,
  )
  # Padded lengths are fitted to all pairs, as if one process read them all.
  assert all(part.boundaries == whole.boundaries for part in parts)
  assert all(part.rows == tuple(r // 2 for r in whole.rows) for part in parts)
  per_epoch = parts[0].batches_per_epoch
  # The plan a checkpoint records: global rows, and the processes (each shuffles its own).
  assert (
    parts[0].plan == parts[1].plan == {**whole.plan, 'processes': 2, 'batches_per_epoch': per_epoch}
  )
  assert parts[1].batches_per_epoch == per_epoch >= whole.batches_per_epoch
  for epoch in range(2):
    seen = []
    for step in range(epoch * per_epoch, (epoch + 1) * per_epoch):
      batches = [part.batch(step)[1] for part in parts]
      assert batches[0]['src'].shape == batches[1]['src'].shape  # one global shape per step
      for shard, batch in zip(shards, batches, strict=True):
        records = shard.records(len(PAIRS))
        local = _check_batch(batch, [PAIRS[i] for i in records])
        seen += [records[i] for i in local]
    assert sorted(seen) == sorted(whole.kept.tolist())


def test_iterate_once_in_order_with_fixed_rows_and_shared_boundaries():
  train = TokenBatches(PAIRS, max_tokens=512, num_buckets=4, max_length=30)
  evaluation = TokenBatches(PAIRS[:50], rows=8, boundaries=train.boundaries, max_length=30, seed=3)
  assert evaluation.boundaries == train.boundaries and set(evaluation.rows) == {8}
  seen = []
  for batch in evaluation.iterate_once():
    assert batch['src'].shape[0] == 8
    indices = _check_batch(batch, PAIRS)
    assert indices == sorted(indices)
    seen += indices
  assert sorted(seen) == list(range(50))
  assert sum(1 for _ in evaluation.iterate_once()) == evaluation.batches_per_epoch


def test_token_batches_errors():
  with pytest.raises(ValueError, match='exactly one of max_tokens'):
    TokenBatches(PAIRS, max_tokens=100, rows=4, num_buckets=2, max_length=30)
  with pytest.raises(ValueError, match='exactly one of num_buckets'):
    TokenBatches(PAIRS, max_tokens=100, max_length=30)
  with pytest.raises(ValueError, match='last boundary must be max_length \\+ 1 = 31'):
    TokenBatches(PAIRS, max_tokens=100, boundaries=[10, 30], max_length=30)
  with pytest.raises(ValueError, match='strictly increasing'):
    TokenBatches(PAIRS, max_tokens=100, boundaries=[20, 10, 31], max_length=30)
  with pytest.raises(ValueError, match=r'max_tokens=60 holds no 2 row\(s\).*config\.data\.max_t'):
    TokenBatches(PAIRS, max_tokens=60, num_buckets=2, max_length=30, row_multiple=2)
  with pytest.raises(ValueError, match='rows=6 must be a positive multiple of row_multiple=4'):
    TokenBatches(PAIRS, rows=6, num_buckets=2, max_length=30, row_multiple=4)
  with pytest.raises(
    ValueError, match='none of the 1 pairs has both sides within config.data.max_length'
  ):
    TokenBatches([([5] * 9, [5])], max_tokens=100, num_buckets=2, max_length=8)


# --- translation ----------------------------------------------------------------------------


def _moses(line: str) -> str:
  """A Moses-style tokenisation of the generated sentences: punctuation split off."""
  return line.replace(',', ' ,').replace('.', ' .').replace('?', ' ?').replace('!', ' !')


def _data_config(tmp_path, **overrides) -> ml_collections.ConfigDict:
  sources = [_moses(s) for s in SOURCES[:250]]
  targets = [_moses(t) for t in TARGETS[:250]]
  targets[0] = 'Ka &quot; ri &quot; &amp; to .'
  files = {
    'train_src': _write(tmp_path / 'train.en.gz', sources[:200]),
    'train_tgt': _write(tmp_path / 'train.de', targets[:200]),
    'eval_src': _write(tmp_path / 'eval.en', sources[200:]),
    'eval_tgt': _write(tmp_path / 'eval.de', targets[200:]),
  }
  config = translate_config().data
  config.update(
    kind='text',
    moses_detokenize=True,
    vocab_size=VOCAB_SIZE,
    max_length=80,
    max_tokens=800,
    length_buckets=3,
    **{k: str(v) for k, v in files.items()},
  )
  config.update(overrides)
  return config


def test_load_translation_data_text(tmp_path):
  config = _data_config(tmp_path, max_eval_examples=20)
  data = translation.load_translation_data(config, tmp_path / 'work', seed=0, row_multiple=2)
  assert data.eval_sources == SOURCES[200:220] and data.eval_references == TARGETS[200:220]
  assert data.tokenizer.vocab_size == VOCAB_SIZE
  assert data.tokenizer.path == tmp_path / 'work' / 'spm.model'
  assert data.train.num_examples == 200 and all(r % 2 == 0 for r in data.train.rows)
  assert len(data.eval_pairs) == 20
  for i in (0, 19):
    src_ids, tgt_ids = data.eval_pairs[i]
    assert data.tokenizer.decode(src_ids) == data.eval_sources[i]
    assert data.tokenizer.decode(tgt_ids) == data.eval_references[i]
  _, batch = data.train.batch(0)
  first = data.train.pairs[int(batch['index'][0])][1]
  assert batch['tgt_out'][0, : len(first)].tolist() == first.tolist()
  assert data.tokenizer.decode(data.train.pairs[0][1]) == 'Ka "ri" & to.'  # detokenised

  # A second run with the same workdir reuses the vocabulary.
  config.max_train_examples = 50
  again = translation.load_translation_data(config, tmp_path / 'work')
  assert again.train.num_examples == 50
  assert again.tokenizer.encode(SOURCES[0]) == data.tokenizer.encode(SOURCES[0])


def test_loading_many_pairs_says_what_it_does(tmp_path, capsys, monkeypatch):
  """On 1M pairs a translation start printed nothing for 88 to 125 s (reading, SentencePiece
  training, encoding). Now a split of many pairs gets a line before each phase (what, how
  many) and the encoding progress lines with the rate and ETA (`PassProgress`, every 30 s;
  here faked to every update, by a clock that ticks 30 s a call); the ids are those of one
  SentencePiece call. A small split (here, and in the tests and tiny runs) prints nothing."""
  config = _data_config(tmp_path)
  translation.load_translation_data(config, tmp_path / 'quiet')
  assert capsys.readouterr().out == ''
  size = sum(os.path.getsize(config[name]) for name in ('train_src', 'train_tgt'))
  monkeypatch.setattr(parallel_text, 'ANNOUNCED_PAIRS', 100)  # the eval split's 50: no line
  monkeypatch.setattr(parallel_text, 'ANNOUNCED_BYTES', size)
  monkeypatch.setattr(translation, 'ENCODE_CHUNK', 150)
  ticks = itertools.count(step=30.0)
  monkeypatch.setattr(
    translation,
    'PassProgress',
    lambda *args: messages.PassProgress(*args, clock=lambda: next(ticks)),
  )
  data = translation.load_translation_data(config, tmp_path / 'work')
  vocabulary = tmp_path / 'work' / 'spm.model'
  assert capsys.readouterr().out.splitlines() == [
    f'reading {config.train_src} and {config.train_tgt} ({size / 1e6:,.0f} MB)',
    'Moses-detokenising 200 train pairs (config.data.moses_detokenize)',
    f'training a {VOCAB_SIZE}-piece SentencePiece vocabulary (config.data.vocab_size) on 400 of '
    f'the 400 training sentences (config.data.vocab_train_sentences) into {vocabulary}',
    f'encoding 200 training pairs with {vocabulary}',
    # per chunk of 150 lines of a side: 150 and 200 sources, then 350 and 400 sentences
    'encoding training pairs: 150/400 sentences | 5.0 sentences/s | ETA 0m50s',
    'encoding training pairs: 200/400 sentences | 3.3 sentences/s | ETA 1m00s',
    'encoding training pairs: 350/400 sentences | 3.9 sentences/s | ETA 0m12s',
    'encoding training pairs: 400/400 sentences | 3.3 sentences/s | ETA 0m00s',
  ]
  sources, targets = translation.read_pairs(config, 'train')
  in_one_call = [data.tokenizer.processor.encode(side) for side in (sources, targets)]
  assert [data.train.pairs[i][0].tolist() for i in range(200)] == in_one_call[0]
  assert [data.train.pairs[i][1].tolist() for i in range(200)] == in_one_call[1]


def test_moses_detokenize_warns_about_text_that_is_not_moses_tokenised(tmp_path, capsys):
  """A toy-ende run's config (moses_detokenize=True) evaluating raw newstest2014 detokenised
  raw references (`the 'Grub'` -> `the'Grub'`) and scored against them in silence (W3b)."""
  config = _data_config(tmp_path)
  translation.read_pairs(config, 'train')
  translation.read_pairs(config, 'eval')
  assert capsys.readouterr().err == ''  # tokenised text: nothing to say
  config.eval_src = str(_write(tmp_path / 'raw.en', SOURCES[200:250]))
  config.eval_tgt = str(_write(tmp_path / 'raw.de', TARGETS[200:250]))
  sources, _ = translation.read_pairs(config, 'eval')
  warnings = capsys.readouterr().err.strip().split('\n')
  assert len(warnings) == 2 and all(line.startswith('warning: ') for line in warnings)
  assert warnings[0].startswith(f'warning: {tmp_path / "raw.en"} (config.data.eval_src): ')
  assert warnings[1].startswith(f'warning: {tmp_path / "raw.de"} (config.data.eval_tgt): ')
  assert 'shows no Moses tokenisation' in warnings[0]
  assert 'config.data.moses_detokenize=False' in warnings[0]
  assert len(sources) == 50  # still read as asked
  # One Moses escape is a sign of tokenisation; lines without punctuation show nothing.
  warn = parallel_text.warn_of_moses_tokenization
  warn(['It &apos;s raw, he said.', 'So.'], 'a', detokenize=True)
  warn(['no punctuation here', 'nor here'], 'b', detokenize=True)
  assert capsys.readouterr().err == ''


def test_moses_escapes_with_moses_detokenize_false_are_named(tmp_path, capsys):
  """OpenNMT's toy-ende (`&quot;`, `&apos;`, punctuation split off) with
  moses_detokenize=False, the default, trained and scored as escaped, tokenised text with no
  word; only the opposite mistake warned. The same rule now warns of this one (once)."""
  config = _data_config(tmp_path, moses_detokenize=False)
  sources, targets = translation.read_pairs(config, 'train')
  translation.read_pairs(config, 'train')  # train.py reads the files again: said once
  warnings = capsys.readouterr().err.strip().split('\n')
  assert warnings == [
    f'warning: {tmp_path / "train.de"} (config.data.train_tgt): '
    'config.data.moses_detokenize=False, but its text shows Moses tokenisation (1 of 200 lines '
    'hold &apos;/&quot;/&amp;-style escapes; 0 of 200 lines have punctuation attached to a word, '
    '200 split off), so it is trained on and scored as escaped, tokenised text, not as '
    'sacreBLEU scores raw text; give config.data.moses_detokenize=True for this data (eval.py '
    'takes it for other eval files)'
  ]
  assert targets[0] == 'Ka &quot; ri &quot; &amp; to .'  # still read as asked
  warn = parallel_text.warn_of_moses_tokenization
  warn(['He said &quot; no &quot; .', 'Yes .'], 'c', detokenize=False)
  assert capsys.readouterr().err.startswith('warning: c: config.data.moses_detokenize=False')
  warn(['AT&amp;T rose, it said.', 'It fell.'], 'd', detokenize=False)  # raw text, an entity
  warn(['It rose, it said.', 'It fell.'], 'e', detokenize=False)
  assert capsys.readouterr().err == ''


def test_references_that_are_not_nfc_are_named_once(tmp_path, capsys):
  """Translations come out composed (SentencePiece's NFKC), so NFD references scored lower
  (90.18 against 72.37 on newstest2014.de[:300]) with no word. One warning names the file and
  how many lines change under NFC; the references are scored as given."""
  config = _data_config(tmp_path, moses_detokenize=False)
  composed = ['Grüße aus Köln .', 'Das ist schön .', 'Ja .', 'Nein .']
  decomposed = [unicodedata.normalize('NFD', line) for line in composed]
  config.eval_src = str(_write(tmp_path / 'nfd.en', ['Greetings .', 'Nice .', 'Yes .', 'No .']))
  config.eval_tgt = str(_write(tmp_path / 'nfd.de', decomposed))
  _, references = translation.read_pairs(config, 'eval')
  translation.read_pairs(config, 'eval')
  assert references == decomposed  # not changed
  assert capsys.readouterr().err.strip().split('\n') == [
    f'warning: {tmp_path / "nfd.de"} (config.data.eval_tgt): 2 of 4 references (50%) change '
    'under Unicode NFC (decomposed characters), while translations come out composed '
    "(SentencePiece's NFKC normalisation), so BLEU against these references as given is "
    'lower than against NFC ones; to compare with scores on NFC references, normalise them '
    "(e.g. `uconv -x any-nfc`, or Python's unicodedata.normalize('NFC', line)) and give that "
    'file'
  ]
  config.eval_tgt = str(_write(tmp_path / 'nfc.de', composed))
  translation.read_pairs(config, 'eval')
  assert capsys.readouterr().err == ''


def test_eval_batches_take_the_training_shapes_else_fit_their_own(tmp_path):
  config = _data_config(tmp_path, max_eval_examples=20, length_buckets=2)
  data = translation.load_translation_data(config, tmp_path / 'work', seed=3)
  during_training = translation.eval_batches(config, data, seed=3)
  assert during_training.boundaries == data.train.boundaries  # no new shapes to compile
  assert during_training.num_examples == 20 and during_training.seed == 3
  evaluation = translation.load_eval_data(config, tmp_path / 'work')
  alone = translation.eval_batches(config, evaluation, seed=3)
  assert len(alone.boundaries) <= 2 and alone.boundaries[-1] == config.max_length + 1
  seen = sorted(int(i) for batch in alone.iterate_once() for i in batch['index'] if i >= 0)
  assert seen == list(range(20))  # every eval pair once


def test_load_translation_data_in_shards_then_for_evaluation(tmp_path):
  config = _data_config(tmp_path, max_eval_examples=20)
  parts = _in_threads(
    lambda shard: translation.load_translation_data(
      config, tmp_path / 'work', row_multiple=2, shard=shard
    ),
    _thread_shards(2),
  )
  assert [part.train.num_examples for part in parts] == [100, 100]
  assert parts[0].train.boundaries == parts[1].train.boundaries
  # Process 1 loaded the vocabulary process 0 trained; both read every eval pair.
  assert parts[1].tokenizer.path == parts[0].tokenizer.path == tmp_path / 'work' / 'spm.model'
  assert parts[1].tokenizer.encode(SOURCES[7]) == parts[0].tokenizer.encode(SOURCES[7])
  assert parts[0].eval_sources == parts[1].eval_sources == SOURCES[200:220]

  evaluation = translation.load_eval_data(config, tmp_path / 'work')  # no training text read
  assert evaluation.train is None and evaluation.eval_references == TARGETS[200:220]
  assert evaluation.eval_pairs[3][0].tolist() == parts[0].eval_pairs[3][0].tolist()
  with pytest.raises(FileNotFoundError, match=r'no vocabulary at .*spm\.model: train\.py writes'):
    translation.load_eval_data(config, tmp_path / 'untrained')


def test_load_translation_data_tfds(tmp_path, tfds_dir):
  config = translate_config().data
  config.update(tfds_data_dir=str(tfds_dir), vocab_size=VOCAB_SIZE, max_length=80, length_buckets=2)
  data = translation.load_translation_data(config, tmp_path)
  assert data.eval_sources == ["It's ok."] * 3 and data.eval_references == ['Grüße, "ja"!'] * 3
  assert data.train.num_examples == len(SOURCES) - 1


def test_load_translation_data_errors(tmp_path):
  with pytest.raises(ValueError, match=r"config\.data\.kind must be one of \('text', 'tfds'\)"):
    translation.load_translation_data(_data_config(tmp_path, kind='csv'), tmp_path)
  with pytest.raises(ValueError, match=r'config\.data\.eval_tgt, which is empty'):
    translation.load_translation_data(_data_config(tmp_path, eval_tgt=''), tmp_path)
  missing = str(tmp_path / 'missing.de')
  with pytest.raises(FileNotFoundError, match=r'config\.data\.train_tgt = .*missing\.de'):
    translation.load_translation_data(_data_config(tmp_path, train_tgt=missing), tmp_path)
  with pytest.raises(FileNotFoundError, match=r'config\.data\.tfds_data_dir='):
    config = translate_config().data
    config.tfds_data_dir = str(tmp_path)
    translation.load_translation_data(config, tmp_path)


def test_eval_files_of_other_line_counts_are_refused_before_the_vocabulary_trains(
  tmp_path, monkeypatch
):
  """Eval files whose line counts differ were refused only after SentencePiece had trained on
  the training pairs (minutes on a WMT-sized corpus): now before the vocabulary is touched."""
  config = _data_config(tmp_path)
  config.eval_tgt = str(_write(tmp_path / 'short.de', TARGETS[200:249]))
  vocabularies = []
  monkeypatch.setattr(translation, '_shared_vocabulary', lambda *a, **k: vocabularies.append(a))
  with pytest.raises(ValueError, match=r'parallel files differ in line count: .*eval\.en has 50 '):
    translation.load_translation_data(config, tmp_path)
  assert vocabularies == []


@pytest.mark.parametrize('content', [b'', b'\x00garbage' * 200], ids=['empty', 'garbage'])
def test_a_damaged_vocabulary_is_named_with_the_fix(tmp_path, content):
  """spm.model cut or overwritten: SentencePiece's RuntimeError ("could not parse ModelProto",
  "unk is not defined") was a traceback in train.py, eval.py and the translate tool."""
  path = tmp_path / 'spm.model'
  path.write_bytes(content)
  with pytest.raises(ValueError, match=r'spm\.model is damaged \(.+\); remove it and rerun'):
    tokenizer.load_tokenizer(path, VOCAB_SIZE)


def test_a_corpus_of_lines_too_long_for_sentencepiece_is_named():
  """A file that is one 5 MB line (no line breaks): SentencePiece skips every line over 4,192
  bytes and fails on none left, which was a traceback."""
  with pytest.raises(ValueError, match=r'longest line has 300,000 bytes .* one sentence per'):
    tokenizer.train_model(['x' * 300_000], VOCAB_SIZE)


def test_dropped_empty_pairs_are_warned_of_once_per_file(tmp_path, capsys):
  """train.py reads the eval files for its validation and again for its final evaluation: the
  warning of their pairs with an empty side was printed twice."""
  for side, text in (('src', 'a\n\nb\n'), ('tgt', 'x\ny\n\n')):
    (tmp_path / side).write_text(text)
  for _ in range(2):
    assert parallel_text.read_parallel(tmp_path / 'src', tmp_path / 'tgt') == (['a'], ['x'])
  warned = capsys.readouterr().err.splitlines()
  assert warned == [
    f'warning: {tmp_path}/src / {tmp_path}/tgt: dropped 2 pairs with an empty side (lines 2, 3)'
  ]


def test_dropped_empty_pairs_are_named_by_line(tmp_path, capsys):
  """A pair with an empty side is dropped, so the translations file has a line fewer than
  eval_src: the warning named no line, to line the two up again. It names the first few, 1-based
  lines of the files (of every process's shard), and counts the rest."""
  sources = ['' if i in (2, 9, 10, 11, 12, 13, 30) else f's{i}' for i in range(40)]
  src = _write(tmp_path / 'src', sources)
  tgt = _write(tmp_path / 'tgt', [f't{i}' for i in range(40)])
  assert len(parallel_text.read_parallel(src, tgt)[0]) == 33
  assert capsys.readouterr().err == (
    f'warning: {src} / {tgt}: dropped 7 pairs with an empty side (lines 3, 10, 11, 12, 13 and 2 '
    'more)\n'
  )
  parallel_text.read_parallel(src, tgt, shard=Shard(1, 2))  # lines 2, 4, ..., 40
  assert '(lines 10, 12, 14)' in capsys.readouterr().err


def test_line_count_mismatch_names_blank_lines_at_the_end(tmp_path):
  """A side ending in '\\n\\n' (an editor's, or `echo >>`) was 'has 21 lines, ... has 20' and
  no more; the longer side's empty lines at its end are named now, whichever side it is."""
  src = _write(tmp_path / 'a.en', ['s0', 's1', 's2'])
  blank = tmp_path / 'a.de'
  blank.write_text('t0\nt1\nt2\n\n')
  for sides in ((src, blank), (blank, src)):
    with pytest.raises(ValueError, match=re.escape(f"; {blank}'s last line is empty (the file ")):
      parallel_text.read_parallel(*sides)
  blank.write_text('t0\nt1\nt2\n\n \n')
  with pytest.raises(ValueError, match=re.escape(f'; the last 2 lines of {blank} are empty')):
    parallel_text.read_parallel(src, blank)
  # The shorter side's empty last line is no cause.
  blank.write_text('t0\n\n')
  with pytest.raises(ValueError, match=r'has 2; they must be line-aligned$'):
    parallel_text.read_parallel(src, blank)
