"""Tatoeba English-German: the CPU-scale translation corpus, prepared from the public export.

The ManyThings.org Anki export of Tatoeba (`deu-eng.zip`, tab-separated `English<TAB>German`
lines in `deu.txt`; CC-BY 2.0 FR, attribution tatoeba.org and manythings.org/anki) is split
deterministically, so that any copy of the same export gives the same files:

- pairs are grouped by their normalised English sentence (lower case, whitespace collapsed),
  so every translation of one English sentence lands in one split;
- a group goes to dev if sha1(group) % 100 is 0 or 1, to test if it is 2 or 3, else to train;
- dev and test pairs whose normalised German sentence also occurs in train are dropped, so no
  test reference was seen in training.

Each split is written as `<split>.en.gz` / `<split>.de.gz` (one sentence per line, gzip with
mtime 0, so the bytes are reproducible) with `SOURCE.json` recording the zip's md5, the
counts and the licence. The export is updated from time to time; the 2018-05-13 one (md5
`REFERENCE_ZIP_MD5`) gives 163,069 / 3,096 / 2,914 pairs. A zip with another md5 is
prepared all the same and its md5 recorded, with a warning that its figures are not
comparable with docs/translation.md's.
"""

import gzip
import hashlib
import io
import json
import os
import pathlib
import shutil
import tempfile
import zipfile

from relpos.data.data_file import decode_utf8
from relpos.data.download import fetch
from relpos.messages import warn

URL = 'https://www.manythings.org/anki/deu-eng.zip'
REFERENCE_ZIP_MD5 = 'cc46c2911b1904233954ca7858ae9378'  # the 2018-05-13 export
MEMBER = 'deu.txt'
SPLITS = ('train', 'dev', 'test')
LANGS = ('en', 'de')
DIRECTORY = 'tatoeba_ende'  # the corpus's directory under prepare's --out
PREPARE_COMMAND = 'python -m relpos.data.prepare tatoeba --out=data/'
LICENCE = (
  'Tatoeba sentences, CC-BY 2.0 FR; attribution: tatoeba.org and its contributors, '
  'www.manythings.org/anki'
)


def _normalised(sentence: str) -> str:
  return ' '.join(sentence.lower().split())


def read_pairs(text: str) -> list[tuple[str, str]]:
  """(English, German) of each tab-separated line with both sides non-empty (later columns,
  such as the attribution of newer exports, are ignored)."""
  pairs = []
  for line in text.split('\n'):
    columns = line.rstrip('\r').split('\t')
    if len(columns) < 2:
      continue
    english, german = columns[0].strip(), columns[1].strip()
    if english and german:
      pairs.append((english, german))
  return pairs


def split_pairs(pairs: list[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
  """train / dev / test by the hash of the normalised English sentence (module docstring)."""
  splits = {name: [] for name in SPLITS}
  for english, german in pairs:
    bucket = int(hashlib.sha1(_normalised(english).encode()).hexdigest(), 16) % 100
    splits['dev' if bucket < 2 else 'test' if bucket < 4 else 'train'].append((english, german))
  train_german = {_normalised(german) for _, german in splits['train']}
  for name in ('dev', 'test'):
    splits[name] = [pair for pair in splits[name] if _normalised(pair[1]) not in train_german]
  return splits


def _check_splits(zip_path, splits: dict[str, list]) -> None:
  """Raises ValueError if a split is empty: training or its evaluation would fail on it later."""
  empty = [name for name, split in splits.items() if not split]
  if empty:
    counts = ', '.join(f'{name} {len(split)}' for name, split in splits.items())
    raise ValueError(
      f'{zip_path}: its {MEMBER} gives no {" and no ".join(empty)} pairs ({counts}): too few '
      f'sentences for the 2% dev and test splits; use the full export, {URL}'
    )


def _readable_directory(path: pathlib.Path) -> None:
  """Gives `path` (made by tempfile.mkdtemp, mode 0700) the mode a new directory gets under
  the umask, so others on a shared data directory can read the corpus."""
  umask = os.umask(0)
  os.umask(umask)
  path.chmod(0o777 & ~umask)


def _write_gzip(path: pathlib.Path, lines: list[str]) -> None:
  with open(path, 'wb') as raw, gzip.GzipFile(fileobj=raw, mode='wb', mtime=0, filename='') as f:
    f.write(''.join(line + '\n' for line in lines).encode('utf-8'))


def prepare(zip_path, out) -> pathlib.Path:
  """Splits the export at `zip_path` into `out/tatoeba_ende/` (module docstring); returns
  that directory. The files are written to a temporary directory first and moved into place
  together, so a prepared directory is never partial.

  deu.txt is read as UTF-8, a byte order mark removed (and '\r' at line ends).

  Raises:
    FileNotFoundError: no file at `zip_path`.
    ValueError: it is not a zip holding deu.txt, deu.txt is not UTF-8, it has no pairs, or
      a split would be empty.
  """
  zip_path = pathlib.Path(zip_path)
  if not zip_path.is_file():
    raise FileNotFoundError(f'--zip={zip_path} is not a file; download {URL}')
  data = zip_path.read_bytes()
  md5 = hashlib.md5(data).hexdigest()
  try:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
      member = archive.read(MEMBER)
  except (zipfile.BadZipFile, KeyError) as error:
    raise ValueError(
      f'{zip_path} is not a Tatoeba export with {MEMBER} ({error}); download {URL}'
    ) from None
  pairs = read_pairs(decode_utf8(member, f'{MEMBER} in {zip_path}'))
  if not pairs:
    raise ValueError(
      f'{zip_path}: {MEMBER} holds no tab-separated English/German pairs; download {URL}'
    )
  if md5 != REFERENCE_ZIP_MD5:
    warn(
      f'{zip_path} has md5 {md5}, not the 2018-05-13 export ({REFERENCE_ZIP_MD5}) that '
      'the docs/ figures used: the splits differ, and so do the scores'
    )
  splits = split_pairs(pairs)
  _check_splits(zip_path, splits)
  target = pathlib.Path(out) / DIRECTORY
  target.parent.mkdir(parents=True, exist_ok=True)
  staging = pathlib.Path(tempfile.mkdtemp(dir=target.parent, prefix=f'.{DIRECTORY}.'))
  try:
    _readable_directory(staging)
    for name, split in splits.items():
      for index, lang in enumerate(LANGS):
        _write_gzip(staging / f'{name}.{lang}.gz', [pair[index] for pair in split])
    source = {
      'zip': str(zip_path),
      'zip_md5': md5,
      'reference_export': md5 == REFERENCE_ZIP_MD5,
      'pairs': {name: len(split) for name, split in splits.items()},
      'licence': LICENCE,
    }
    (staging / 'SOURCE.json').write_text(json.dumps(source, indent=2) + '\n')
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return target


def download(directory, *, url: str = URL) -> pathlib.Path:
  """Fetches `url` to `directory/deu-eng.zip` (`relpos.data.download.fetch`: never partial)."""
  return fetch(url, pathlib.Path(directory) / 'deu-eng.zip')


def split_files(directory, split: str) -> tuple[pathlib.Path, pathlib.Path]:
  """(English, German) files of `split` ('train' | 'dev' | 'test') in a prepared directory."""
  directory = pathlib.Path(directory)
  return directory / f'{split}.en.gz', directory / f'{split}.de.gz'


def missing_hint(path) -> str:
  """What to run when `path`, a file of a prepared Tatoeba directory, is missing ('' for the
  files of any other directory)."""
  return f'; prepare it with `{PREPARE_COMMAND}`' if DIRECTORY in pathlib.Path(path).parts else ''
