"""enwik8 (first 10^8 bytes of a 2006 English Wikipedia XML dump, Hutter Prize).

The standard character-LM split (Transformer-XL, Al-Rfou et al.) is train [0, 90M),
valid [90M, 95M), test [95M, 100M) of the raw bytes.

`PREPARE_COMMAND` writes `prepared_path()`, data/enwik8.zip of the repository (or of
$RELPOS_DATA_DIR: `relpos.data.data_directory`), which is config.data.path's default; a copy
elsewhere is given as --config.data.path.
"""

import hashlib
import pathlib
import zipfile

import numpy as np

from relpos.data import data_directory, download
from relpos.data.data_file import refuse_dangling_link, refuse_pipe
from relpos.data.text import split_at

ENWIK8_BYTES = 100_000_000
ENWIK8_MD5 = 'a1fa5ffddb56f4953e226637dabbb36a'
ENWIK8_URL = 'http://mattmahoney.net/dc/enwik8.zip'
ARCHIVE = 'enwik8.zip'  # what `download_enwik8` writes in its directory
PREPARE_COMMAND = 'python -m relpos.data.prepare enwik8'


def prepared_path() -> pathlib.Path:
  """Where `PREPARE_COMMAND` writes enwik8 (its --out's default: `relpos.data.data_directory`)."""
  return data_directory() / ARCHIVE


def resolve_enwik8_path(path) -> pathlib.Path:
  """`path` itself if it is a file, else `path/enwik8` or `path/enwik8.zip`, first found.

  Raises:
    FileNotFoundError: none of these exists.
    ValueError: `path` is a pipe (`relpos.data.data_file.refuse_pipe`).
  """
  path = pathlib.Path(path)
  refuse_pipe(path, 'config.data.path')
  if path.is_file():
    return path
  if path.is_dir():
    for name in ('enwik8', 'enwik8.zip'):
      if (path / name).is_file():
        return path / name
    raise FileNotFoundError(
      f'{path} holds neither enwik8 nor enwik8.zip; fetch it there with '
      f'`{PREPARE_COMMAND} --out={path}`'
    )
  refuse_dangling_link(path, 'config.data.path')
  raise FileNotFoundError(
    f'no enwik8 at {path}; fetch it with `{PREPARE_COMMAND}` (it writes {prepared_path()}, the '
    'default config.data.path), or give a copy elsewhere as --config.data.path'
  )


def read_enwik8(path, *, expected_bytes=ENWIK8_BYTES, expected_md5=ENWIK8_MD5) -> bytes:
  """The enwik8 bytes from the raw file, `enwik8.zip` or a directory holding either.

  Args:
    path: the raw `enwik8` file, a zip with an `enwik8` member, or a directory with either.
    expected_bytes, expected_md5: what the uncompressed bytes must be; the defaults are
      the real enwik8's.
  Raises:
    FileNotFoundError: nothing to read at `path`.
    ValueError: the zip has no `enwik8` member, or size or md5 differ from the expected.
  """
  path = resolve_enwik8_path(path)
  if zipfile.is_zipfile(path):
    with zipfile.ZipFile(path) as archive:
      if 'enwik8' not in archive.namelist():
        raise ValueError(f'{path} is a zip without an enwik8 member; re-download {ENWIK8_URL}')
      data = archive.read('enwik8')
  else:
    data = path.read_bytes()
  md5 = hashlib.md5(data).hexdigest()
  if (len(data), md5) != (expected_bytes, expected_md5):
    found = (
      f'{path}: expected {expected_bytes} bytes with md5 {expected_md5}, found {len(data)} '
      f'bytes with md5 {md5}'
    )
    raise ValueError(f'{found}; {_mismatch_remedy(path, len(data) == expected_bytes)}')
  return data


_OTHER_CORPUS = "for another corpus set --config.data.kind='text' (any file, split 90/5/5)"


def _mismatch_remedy(path: pathlib.Path, enwik8_size: bool) -> str:
  """What to do about a file that is not the enwik8 it should be. Of enwik8's size, or named
  as its download is (enwik8, enwik8.zip), it is a damaged copy: download it again. Otherwise
  it is most likely another corpus given to kind 'enwik8' (another XML dump, say), and 'delete
  it and re-download' told the user to delete their own data: kind 'text' reads it."""
  if enwik8_size or path.name in ('enwik8', ARCHIVE):
    return (
      f'the copy is truncated or corrupt, delete it and re-download {ENWIK8_URL} ({_OTHER_CORPUS})'
    )
  return f'it is not enwik8: {_OTHER_CORPUS}; for enwik8 itself, `{PREPARE_COMMAND}` fetches it'


def enwik8_splits(data: bytes) -> dict[str, np.ndarray]:
  """train/valid/test uint8 arrays cut at 90% and 95% of `data` (90M and 95M for enwik8)."""
  return split_at(data, [len(data) * 90 // 100, len(data) * 95 // 100])


def download_enwik8(
  directory, *, url=ENWIK8_URL, expected_bytes=ENWIK8_BYTES, expected_md5=ENWIK8_MD5
) -> pathlib.Path:
  """Downloads `url` to `directory/enwik8.zip`, checked by `read_enwik8` before it is put in
  place (`relpos.data.download.fetch`), and returns that path.

  Raises:
    relpos.data.download.DownloadError: the download failed.
    ValueError: the downloaded zip fails `read_enwik8`'s checks.
  """

  def check(path):
    read_enwik8(path, expected_bytes=expected_bytes, expected_md5=expected_md5)

  return download.fetch(url, pathlib.Path(directory) / ARCHIVE, check=check)
