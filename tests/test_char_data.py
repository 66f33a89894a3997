"""Character LM data: enwik8 reading and checks, splits, vocabularies, ordered batches.

Everything runs on small generated files (no network, no downloaded corpus): an enwik8-like
corpus is checked against its own size and md5 through the `expected_*` parameters.
"""

import bz2
import functools
import gzip
import hashlib
import lzma
import os
import tracemalloc
import zipfile

import ml_collections
import numpy as np
import pytest

from relpos.config.char_lm_defaults import char_lm_config
from relpos.data import char_corpus, data_directory, download, enwik8, ordered, text

# A tiny enwik8 look-alike: XML-ish text with newlines and a few non-ASCII bytes.
CORPUS = (b'<page>\n  <title>Caf\xc3\xa9</title>\n  <text>[[A]] b &amp; c.</text>\n</page>\n') * 20
CHECK = {'expected_bytes': len(CORPUS), 'expected_md5': hashlib.md5(CORPUS).hexdigest()}


def _write_zip(path, member='enwik8', data=CORPUS):
  with zipfile.ZipFile(path, 'w', compression=zipfile.ZIP_DEFLATED) as archive:
    archive.writestr(member, data)
  return path


@pytest.fixture
def enwik8_zip(tmp_path):
  return _write_zip(tmp_path / 'enwik8.zip')


@pytest.fixture
def enwik8_raw(tmp_path):
  path = tmp_path / 'enwik8'
  path.write_bytes(CORPUS)
  return path


def test_enwik8_constants():
  assert enwik8.ENWIK8_BYTES == 100_000_000
  assert enwik8.ENWIK8_MD5 == 'a1fa5ffddb56f4953e226637dabbb36a'
  assert enwik8.ENWIK8_URL == 'http://mattmahoney.net/dc/enwik8.zip'


@pytest.mark.parametrize('fixture', ['enwik8_zip', 'enwik8_raw'])
def test_read_enwik8_file_and_directory(fixture, request):
  path = request.getfixturevalue(fixture)
  assert enwik8.read_enwik8(path, **CHECK) == CORPUS
  assert enwik8.read_enwik8(path.parent, **CHECK) == CORPUS


def test_a_directory_as_a_text_path_is_named_as_one(tmp_path):
  """config.data.path a directory (the Transformer-XL prep's layout: train/valid/test.txt and
  enwik8) was 'no text file at <dir>'; the line says it is a directory, what kind 'text' reads,
  and kind 'enwik8' where the directory holds enwik8."""
  for name in ('train.txt', 'valid.txt', 'test.txt'):
    (tmp_path / name).write_text('text\n')
  message = str(pytest.raises(ValueError, text.read_text_bytes, tmp_path).value)
  assert message == (
    f"config.data.path={tmp_path} is a directory: config.data.kind='text' reads one file "
    '(plain, or gzip, bzip2, xz or a zip of one file) and splits it 90/5/5 into '
    'train/valid/test; give that file (relpos reads no corpus already split into '
    'train/valid/test files)'
  )
  (tmp_path / 'enwik8').write_bytes(CORPUS)
  message = str(pytest.raises(ValueError, text.read_text_bytes, tmp_path).value)
  assert message.endswith(
    "give that file; it holds enwik8, which --config.data.kind='enwik8' reads from this directory"
  )


def test_read_enwik8_directory_prefers_raw_file(tmp_path, enwik8_raw):
  _write_zip(tmp_path / 'enwik8.zip', data=b'other')
  assert enwik8.read_enwik8(tmp_path, **CHECK) == CORPUS


@pytest.mark.parametrize(
  'check',
  [
    {'expected_bytes': len(CORPUS), 'expected_md5': '0' * 32},
    {'expected_bytes': len(CORPUS) + 1, 'expected_md5': CHECK['expected_md5']},
  ],
)
def test_read_enwik8_rejects_wrong_checksum_or_size(enwik8_zip, check):
  with pytest.raises(ValueError) as info:
    enwik8.read_enwik8(enwik8_zip, **check)
  message = str(info.value)
  assert '\n' not in message
  for part in (str(enwik8_zip), check['expected_md5'], str(check['expected_bytes'])):
    assert part in message
  assert f'found {len(CORPUS)} bytes with md5 {CHECK["expected_md5"]}' in message
  assert 're-download' in message


def test_another_corpus_given_as_enwik8_is_named_as_such_not_as_a_damaged_copy(tmp_path):
  """An XML file of another name and size given to kind 'enwik8' (configs/enwik8_base.py with
  config.data.path=dump.xml) was told to be deleted and enwik8 downloaded again: it is said
  not to be enwik8, with kind 'text' for other corpora."""
  other = tmp_path / 'dump.xml'
  other.write_bytes(CORPUS)
  message = str(pytest.raises(ValueError, enwik8.read_enwik8, other).value)
  assert message.endswith(
    "it is not enwik8: for another corpus set --config.data.kind='text' (any file, split "
    '90/5/5); for enwik8 itself, `python -m relpos.data.prepare enwik8` fetches it'
  )
  assert 'delete' not in message


def test_read_enwik8_defaults_are_the_real_file(enwik8_raw):
  with pytest.raises(ValueError, match='expected 100000000 bytes with md5 a1fa5ffd'):
    enwik8.read_enwik8(enwik8_raw)


def test_read_enwik8_missing(tmp_path):
  with pytest.raises(FileNotFoundError, match='neither enwik8 nor enwik8.zip'):
    enwik8.read_enwik8(tmp_path, **CHECK)
  with pytest.raises(FileNotFoundError, match='nowhere'):
    enwik8.read_enwik8(tmp_path / 'nowhere', **CHECK)


def test_enwik8_is_read_where_prepare_writes_it_and_a_missing_one_names_prepare(
  tmp_path, monkeypatch
):
  """config.data.path defaulted to 'enwik8' of the current directory, while prepare writes
  data/enwik8.zip; and the missing file's error said to download it from mattmahoney.net."""
  assert char_lm_config().data.path == str(enwik8.prepared_path())
  assert enwik8.prepared_path() == data_directory() / 'enwik8.zip'  # prepare's --out default
  monkeypatch.setenv('RELPOS_DATA_DIR', str(tmp_path))
  message = str(pytest.raises(FileNotFoundError, enwik8.read_enwik8, tmp_path / 'enwik8.zip').value)
  assert message == (
    f'no enwik8 at {tmp_path}/enwik8.zip; fetch it with `python -m relpos.data.prepare enwik8` '
    f'(it writes {tmp_path}/enwik8.zip, the default config.data.path), or give a copy '
    'elsewhere as --config.data.path'
  )
  message = str(pytest.raises(FileNotFoundError, enwik8.read_enwik8, tmp_path).value)
  assert f'fetch it there with `python -m relpos.data.prepare enwik8 --out={tmp_path}`' in message


def test_read_enwik8_zip_without_member(tmp_path):
  path = _write_zip(tmp_path / 'enwik8.zip', member='other')
  with pytest.raises(ValueError, match='without an enwik8 member'):
    enwik8.read_enwik8(path, **CHECK)


def test_download_enwik8_from_file_url(tmp_path, enwik8_zip):
  target = enwik8.download_enwik8(tmp_path / 'out', url=enwik8_zip.as_uri(), **CHECK)
  assert target == tmp_path / 'out' / 'enwik8.zip'
  assert enwik8.read_enwik8(target, **CHECK) == CORPUS
  assert sorted(p.name for p in target.parent.iterdir()) == ['enwik8.zip']


def test_download_enwik8_rejects_bad_file_and_leaves_nothing(tmp_path, enwik8_zip):
  out = tmp_path / 'out'
  with pytest.raises(ValueError, match='the download of file://.* failed its check'):
    enwik8.download_enwik8(out, url=enwik8_zip.as_uri(), expected_bytes=3, expected_md5='0')
  assert list(out.iterdir()) == []


def test_a_failed_download_names_its_url_and_leaves_nothing(tmp_path):
  """Without a network the error was urllib's alone, `<urlopen error ...>` (P8)."""
  out = tmp_path / 'out'
  url = (tmp_path / 'absent.zip').as_uri()
  with pytest.raises(download.DownloadError, match=rf'cannot download {url} \('):
    enwik8.download_enwik8(out, url=url, **CHECK)
  assert list(out.iterdir()) == []


def test_enwik8_splits_at_90_and_95_percent():
  data = bytes(range(200))
  splits = enwik8.enwik8_splits(data)
  assert [splits[k].dtype for k in ('train', 'valid', 'test')] == [np.uint8] * 3
  np.testing.assert_array_equal(splits['train'], np.arange(180))
  np.testing.assert_array_equal(splits['valid'], np.arange(180, 190))
  np.testing.assert_array_equal(splits['test'], np.arange(190, 200))


def test_read_text_bytes(tmp_path):
  path = tmp_path / 'input.txt'
  path.write_bytes(b'abc\n')
  assert text.read_text_bytes(path) == b'abc\n'
  with pytest.raises(FileNotFoundError, match='missing.txt'):
    text.read_text_bytes(tmp_path / 'missing.txt')
  (tmp_path / 'empty.txt').write_bytes(b'')
  with pytest.raises(ValueError, match='empty.txt is empty'):
    text.read_text_bytes(tmp_path / 'empty.txt')


# Compressed files under names that do not say so: read by their first bytes (C11).
COMPRESSED = {
  'gzip': gzip.compress,
  'bzip2': bz2.compress,
  'xz': lzma.compress,
  'zip': lambda data: data,  # _write_zip compresses
}


@pytest.mark.parametrize('kind', sorted(COMPRESSED))
def test_read_text_bytes_decompresses_by_content_not_name(tmp_path, kind):
  path = tmp_path / 'corpus.txt'
  if kind == 'zip':
    _write_zip(path, member='inner/corpus.txt')
  else:
    path.write_bytes(COMPRESSED[kind](CORPUS))
  assert text.read_text_bytes(path) == CORPUS
  # The same bytes as the start of a plain text are text, a truncated file is named.
  path.write_bytes(COMPRESSED[kind](CORPUS)[:-20] if kind != 'zip' else path.read_bytes()[:40])
  with pytest.raises(ValueError, match=rf'corpus\.txt is a {kind} file but not a complete one'):
    text.read_text_bytes(path)


def test_read_text_bytes_refuses_a_zip_of_several_files(tmp_path):
  path = _write_zip(tmp_path / 'texts.zip', member='a.txt')
  with zipfile.ZipFile(path, 'a') as archive:
    archive.writestr('sub/', b'')  # a directory is not a file
    archive.writestr('sub/b.txt', b'more')
  with pytest.raises(
    ValueError, match=r'texts\.zip is a zip holding 2 files \(a\.txt, sub/b\.txt\)'
  ):
    text.read_text_bytes(path)
  path.write_bytes(b'BZh9 is how this plain text starts, not bzip2\n')
  assert text.read_text_bytes(path).startswith(b'BZh9 is')


def test_contiguous_splits():
  data = bytes(range(100))
  splits = text.contiguous_splits(data, fractions=(0.5, 0.3, 0.2))
  np.testing.assert_array_equal(
    np.concatenate([splits['train'], splits['valid'], splits['test']]), np.arange(100)
  )
  assert [len(splits[k]) for k in ('train', 'valid', 'test')] == [50, 30, 20]
  assert splits['train'].dtype == np.uint8
  assert [len(v) for v in text.contiguous_splits(data).values()] == [90, 5, 5]


@pytest.mark.parametrize('fractions', [(0.5, 0.5), (0.9, 0.2, -0.1), (0.5, 0.3, 0.3)])
def test_contiguous_splits_rejects_bad_fractions(fractions):
  with pytest.raises(ValueError, match='fractions'):
    text.contiguous_splits(b'abcdefghij', fractions)


def test_contiguous_splits_rejects_empty_split():
  with pytest.raises(ValueError, match='the test split of 10 bytes'):
    text.contiguous_splits(b'0123456789')


def test_vocab_bytes_round_trip():
  vocab = char_corpus.CharVocab.bytes()
  assert vocab.size == 256
  ids = vocab.encode(CORPUS)
  assert ids.dtype == np.uint8
  np.testing.assert_array_equal(ids, np.frombuffer(CORPUS, np.uint8))
  assert vocab.decode(ids) == CORPUS


def test_char_ids_take_a_byte_each_until_segments_are_cut(tmp_path):
  """A 100 MB corpus took 1.13 GB of memory (1.77 GB with 'original'): int32 ids, 4 bytes per
  byte, and the symbol count of np.bincount, 8. The ids are uint8 (the 'bytes' ones the data
  itself, not a copy), counting needs no memory the size of the data, and `OrderedBatches`
  keeps the stream's type and casts each segment to int32: the same batches as int32 ids."""
  path = tmp_path / 'corpus.txt'
  data = (CORPUS * (8_000_000 // len(CORPUS) + 1))[:8_000_000]
  path.write_bytes(data)
  # Peak memory of reading and encoding, in bytes per byte of text: it was 5.5 and 10.7.
  for vocab_kind, most in (('bytes', 1.5), ('original', 4.5)):
    tracemalloc.start()
    splits, vocab = char_corpus.load_char_splits(_config(path=str(path), vocab=vocab_kind))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert {split.dtype for split in splits.values()} == {np.dtype(np.uint8)}
    assert peak < most * len(data), (vocab_kind, peak / len(data))
    widened = ordered.OrderedBatches(splits['train'].astype(np.int32), 8, 16)
    batches = ordered.OrderedBatches(splits['train'], 8, 16)
    assert batches.rows_BN.dtype == np.uint8
    for step in (0, 1, 5000):
      got_batch, expected_batch = batches.training_batch(step), widened.training_batch(step)
      for got, expected in zip(got_batch, expected_batch, strict=True):
        assert np.asarray(got).dtype == np.asarray(expected).dtype
        np.testing.assert_array_equal(got, expected)
  text_bytes = np.frombuffer(data, np.uint8)
  assert np.shares_memory(char_corpus.CharVocab.bytes().encode(text_bytes), text_bytes)


def test_vocab_original_drops_newline_and_sorts():
  vocab = char_corpus.CharVocab.from_data(b'cab\nba\n\xe9', drop_newlines=True)
  assert vocab.symbols == (ord('a'), ord('b'), ord('c'), 0xE9)
  np.testing.assert_array_equal(vocab.encode(b'cab\xe9'), [2, 0, 1, 3])
  assert vocab.decode([3, 0, 2]) == b'\xe9ac'
  with pytest.raises(ValueError, match=r"byte 10 \(b'\\n'\) at position 1"):
    vocab.encode(b'a\nb')
  kept = char_corpus.CharVocab.from_data(np.frombuffer(b'b\na', np.uint8), drop_newlines=False)
  assert kept.symbols == (10, ord('a'), ord('b'))


def test_vocab_json_round_trip():
  vocab = char_corpus.CharVocab.from_data(CORPUS, drop_newlines=True)
  restored = char_corpus.CharVocab.from_json(vocab.to_json())
  assert restored == vocab
  ids = vocab.encode(CORPUS.replace(b'\n', b''))
  assert restored.decode(ids) == CORPUS.replace(b'\n', b'')


def test_vocab_rejects_bad_symbols():
  with pytest.raises(ValueError, match='distinct byte values'):
    char_corpus.CharVocab((1, 1))
  with pytest.raises(ValueError, match='distinct byte values'):
    char_corpus.CharVocab((256,))


def _config(**fields):
  return ml_collections.ConfigDict({'kind': 'text', 'vocab': 'bytes', **fields})


def test_load_char_splits_text(tmp_path):
  path = tmp_path / 'input.txt'
  path.write_bytes(CORPUS)
  splits, vocab = char_corpus.load_char_splits(_config(path=str(path)))
  assert vocab == char_corpus.CharVocab.bytes()
  assert all(v.dtype == np.uint8 for v in splits.values())
  joined = np.concatenate([splits['train'], splits['valid'], splits['test']])
  assert vocab.decode(joined) == CORPUS

  splits, vocab = char_corpus.load_char_splits(
    _config(path=str(path), vocab='original', max_bytes=600)
  )
  raw = CORPUS[:600]
  assert vocab.symbols == tuple(sorted(set(raw) - {10}))
  assert vocab.decode(splits['train']) == raw[:540].replace(b'\n', b'')
  assert vocab.decode(splits['valid']) == raw[540:570].replace(b'\n', b'')
  assert vocab.decode(splits['test']) == raw[570:].replace(b'\n', b'')


def test_original_vocab_holds_the_bytes_of_every_split(tmp_path):
  """'original' counts train, valid and test, as the official Transformer-XL `Corpus` does for
  enwik8: a byte that only valid or test holds is a symbol too (it was refused: 'byte 122 is
  not in the 3-symbol vocabulary')."""
  path = tmp_path / 'unseen.txt'
  path.write_bytes(b'ab\n' * 30 + b'zab\nab\n\xa9b')  # z at 90: valid's first byte; \xa9 in test
  splits, vocab = char_corpus.load_char_splits(_config(path=str(path), vocab='original'))
  assert vocab.symbols == (ord('a'), ord('b'), ord('z'), 0xA9)
  assert vocab.decode(splits['valid']) == b'zab'
  assert vocab.decode(splits['test']) == b'ab\xa9b'


def test_a_given_vocab_is_the_one_encoded_with(tmp_path):
  """A run's recorded vocabulary is used as it is (its ids are the model's), also when the data
  given holds fewer symbols; a byte outside it is one line naming config.data.vocab, where the
  vocabulary came from, and 'bytes'."""
  path = tmp_path / 'text.txt'
  path.write_bytes(b'ba\n' * 40)
  recorded = char_corpus.CharVocab((ord('a'), ord('b'), ord('c')))
  splits, vocab = char_corpus.load_char_splits(
    _config(path=str(path), vocab='original'), recorded, recorded_in='w/vocab.json'
  )
  assert vocab is recorded
  np.testing.assert_array_equal(splits['valid'], [1, 0, 1, 0])
  path.write_bytes(b'ba\n' * 40 + b'x')
  with pytest.raises(
    ValueError,
    match=r"^test split of \S*text\.txt: byte 120 \(b'x'\) at position 3 is not in the "
    r"3-symbol vocabulary \(recorded in w/vocab\.json\), made by config\.data\.vocab='original' "
    r".*: give data within it, or train a new run with config\.data\.vocab='bytes'",
  ):
    char_corpus.load_char_splits(
      _config(path=str(path), vocab='original'), recorded, recorded_in='w/vocab.json'
    )


@pytest.mark.parametrize('kind', ['text', 'enwik8'])
def test_a_pipe_as_the_data_path_says_so(tmp_path, kind):
  """A named pipe, or a process substitution (`<(zcat x.gz)`: /dev/fd/63), was refused as 'no
  text file at /dev/fd/63'; it is named as a pipe, with why and the remedy."""
  fifo = tmp_path / 'fifo.txt'
  os.mkfifo(fifo)
  read, write = os.pipe()
  try:
    for path in (str(fifo), f'/dev/fd/{read}'):
      with pytest.raises(
        ValueError,
        match=rf'^config\.data\.path={path} is a pipe \(a named pipe or a process substitution '
        r'such as <\(zcat x\.gz\)\), not a file: .* write them to a file',
      ):
        char_corpus.load_char_splits(_config(kind=kind, path=path))
  finally:
    os.close(read)
    os.close(write)


def _check_against_corpus(monkeypatch):
  """Makes `load_char_splits` check enwik8 files against CORPUS instead of the real file."""
  monkeypatch.setattr(enwik8, 'read_enwik8', functools.partial(enwik8.read_enwik8, **CHECK))


@pytest.mark.parametrize('fixture', ['enwik8_zip', 'enwik8_raw'])
def test_load_char_splits_enwik8(fixture, request, monkeypatch):
  path = request.getfixturevalue(fixture)
  _check_against_corpus(monkeypatch)
  splits, vocab = char_corpus.load_char_splits(
    _config(kind='enwik8', path=str(path.parent), vocab='original')
  )
  n = len(CORPUS)
  assert vocab.size == len(set(CORPUS)) - 1
  assert vocab.decode(splits['valid']) == CORPUS[n * 90 // 100 : n * 95 // 100].replace(b'\n', b'')

  splits, _ = char_corpus.load_char_splits(
    _config(kind='enwik8', path=str(path), vocab='bytes', max_bytes=200)
  )
  assert [len(splits[k]) for k in ('train', 'valid', 'test')] == [180, 10, 10]


def test_load_char_splits_enwik8_checks_full_file(tmp_path, monkeypatch):
  _check_against_corpus(monkeypatch)
  _write_zip(tmp_path / 'enwik8.zip', data=CORPUS[:-1])
  with pytest.raises(ValueError, match='md5'):
    char_corpus.load_char_splits(_config(kind='enwik8', path=str(tmp_path), max_bytes=100))


@pytest.mark.parametrize(
  'fields,error,message',
  [
    (
      {'kind': 'wiki'},
      ValueError,
      r"^config.data.kind must be one of \('enwik8', 'text'\), got 'wiki'$",
    ),
    (
      {'vocab': 'bpe'},
      ValueError,
      r"^config.data.vocab must be one of \('bytes', 'original'\), got 'bpe'$",
    ),
    ({'path': 'missing.txt'}, FileNotFoundError, 'missing.txt'),
    ({'path': 'empty.txt'}, ValueError, 'empty.txt is empty'),
    (
      {'path': 'one.txt'},
      ValueError,
      r'^config.data.path=.*one.txt: the valid split of 1 bytes .* is empty; give more text',
    ),
  ],
)
def test_load_char_splits_errors(tmp_path, fields, error, message):
  (tmp_path / 'empty.txt').write_bytes(b'')
  (tmp_path / 'one.txt').write_bytes(b'a')
  fields = {'path': 'empty.txt', **fields}
  fields['path'] = str(tmp_path / fields['path'])
  with pytest.raises(error, match=message):
    char_corpus.load_char_splits(_config(**fields))


# Ordered batches. Tokens are 0..N-1, so every token names its own stream position.
N, B, T = 103, 4, 6  # n_step = 25: 24 targets per row, 4 full segments of 6, none short.


def test_ordered_batches_shapes_and_shift():
  batches = ordered.OrderedBatches(np.arange(N, dtype=np.int32), B, T)
  assert batches.num_segments == batches.num_full_segments == 4
  for s, inputs, targets in batches:
    assert inputs.shape == targets.shape == (B, T)
    assert inputs.dtype == targets.dtype == np.int32
    np.testing.assert_array_equal(targets, inputs + 1)
    np.testing.assert_array_equal(inputs[:, 0], np.arange(B) * 25 + s * T)


@pytest.mark.parametrize('tgt_len', [1, 5, 6, 7, 24, 30])
def test_ordered_batches_one_pass_covers_each_target_once(tgt_len):
  tokens = np.random.default_rng(0).integers(0, 50, N).astype(np.int32)
  batches = ordered.OrderedBatches(tokens, B, tgt_len)
  n_step = N // B
  rows = tokens[: B * n_step].reshape(B, n_step)
  inputs = np.concatenate([x for _, x, _ in batches.iterate()], axis=1)
  targets = np.concatenate([y for _, _, y in batches.iterate()], axis=1)
  # Inputs and targets are exactly the rows less their last and first token: contiguous
  # across segments, each target position once.
  np.testing.assert_array_equal(inputs, rows[:, :-1])
  np.testing.assert_array_equal(targets, rows[:, 1:])
  assert targets.size == ordered.eval_token_count(tokens, B) == B * (n_step - 1)
  assert batches.num_segments == len(list(batches.iterate()))


def test_ordered_batches_last_short_segment_and_start():
  batches = ordered.OrderedBatches(np.arange(N, dtype=np.int32), B, 7)  # 24 = 3 * 7 + 3
  assert (batches.num_segments, batches.num_full_segments) == (4, 3)
  inputs, targets = batches.segment(3)
  assert inputs.shape == targets.shape == (B, 3)
  np.testing.assert_array_equal(inputs[:, 0], np.arange(B) * 25 + 21)
  assert [s for s, _, _ in batches.iterate(start=2)] == [2, 3]
  with pytest.raises(IndexError):
    batches.segment(4)


def test_training_stream_wraps_drops_short_segment_and_resumes():
  batches = ordered.OrderedBatches(np.arange(N, dtype=np.int32), B, 7)
  stream = batches.training_stream()
  steps = [next(stream) for _ in range(8)]
  assert [t for t, *_ in steps] == list(range(8))
  assert [flag for *_, flag in steps] == [True, False, False] * 2 + [True, False]
  for t, inputs, targets, _ in steps:
    assert inputs.shape == targets.shape == (B, 7)
    np.testing.assert_array_equal(inputs, batches.segment(t % 3)[0])
    np.testing.assert_array_equal(targets, batches.segment(t % 3)[1])
  resumed = batches.training_stream(start_step=5)
  for expected in steps[5:]:
    got = next(resumed)
    assert got[0] == expected[0] and got[3] == expected[3]
    np.testing.assert_array_equal(got[1], expected[1])
    np.testing.assert_array_equal(got[2], expected[2])


def test_ordered_batches_errors():
  with pytest.raises(ValueError, match='at least 2 tokens'):
    ordered.OrderedBatches(np.arange(7, dtype=np.int32), 4, 3)
  with pytest.raises(ValueError, match='positive batch_size'):
    ordered.OrderedBatches(np.arange(7, dtype=np.int32), 0, 3)
  short = ordered.OrderedBatches(np.arange(N, dtype=np.int32), B, 30)
  assert short.num_segments == 1
  with pytest.raises(ValueError, match='no full segment of tgt_len=30'):
    next(short.training_stream())
