"""Reading a data file whatever it is stored as: compressed files are recognised by their first
bytes, never by their names, and decompressed.

The character LM's text file (`relpos.data.text`) and the translation sides
(`relpos.data.parallel_text`) are read here, so both take the same files: plain, gzip, bzip2,
xz, or a zip holding one file (read as that file). A name says little: `corpus.txt` may be a
gzip file someone renamed, and a `.gz` suffix alone once decided whether a file was
decompressed, so a renamed gzip or a `.bz2` file was read as raw bytes (a character LM trained
on compressed noise, a translation refused as "not valid UTF-8"). enwik8's reader keeps its own
zip handling: it names the member it expects and checks the md5 of the full file.
"""

import bz2
import gzip
import io
import lzma
import pathlib
import shlex
import zipfile
import zlib

from relpos.files import dangling_link, split_lines

# The formats, by the bytes their files start with.
_GZIP, _BZIP2, _XZ, _ZIP = b'\x1f\x8b', b'BZh', b'\xfd7zXZ\x00', b'PK\x03\x04'
# What follows bzip2's 'BZh' and its block size digit: a block's magic (the digits of pi) or,
# in a file of no data, the end of the stream's (those of sqrt(pi)).
_BZIP2_NEXT = (b'1AY&SY', b'\x17rE8P\x90')


def compression(data: bytes) -> str | None:
  """'gzip', 'bzip2', 'xz' or 'zip' by the first bytes of `data`; None for anything else.

  bzip2's 'BZh' must be followed by its block size digit (1-9) and a block's magic, so a
  text starting 'BZh9' is still text.
  """
  if data.startswith(_GZIP):
    return 'gzip'
  if data.startswith(_BZIP2) and data[3:4] in b'123456789' and data[4:10] in _BZIP2_NEXT:
    return 'bzip2'
  if data.startswith(_XZ):
    return 'xz'
  if data.startswith(_ZIP):
    return 'zip'
  return None


def refuse_pipe(path, field: str | None) -> None:
  """Raises ValueError if `path` is a pipe: a named pipe (FIFO), or a shell's process
  substitution (`<(zcat x.gz)`, given as /dev/fd/63). A run reads its data files more than once
  (training, each resume, each evaluation) and records their size and SHA-256
  (`relpos.training.data_record`) to tell another file from the one it trained on; a pipe's
  bytes can be read once, and it has no size or content to record. Refused as "no file at" it
  looked missing.

  Args:
    field: the config field that named `path` (e.g. 'config.data.path'), for the message.
  """
  path = pathlib.Path(path)
  if path.is_fifo():
    named = f'{field}={path}' if field else str(path)
    raise ValueError(
      f'{named} is a pipe (a named pipe or a process substitution such as <(zcat x.gz)), not '
      'a file: a run reads its data again on each resume and evaluation and records its size '
      'and hash, and a pipe gives its bytes once; write them to a file (`zcat x.gz > x.txt`; '
      'a gzip, bzip2, xz or zip file is read as it is) and give that file'
    )


def refuse_dangling_link(path, field: str | None) -> None:
  """Raises FileNotFoundError naming `path` (given as `field`) and the missing target where it,
  or a directory on it, is a symbolic link to nothing (`relpos.files.dangling_link`: a volume
  not mounted, a target moved), which the readers' own test of a file met as no file at all.
  Called where a data file was found missing, before that is said."""
  if problem := dangling_link(path):
    named = f'{field}={path}' if field else str(path)
    raise FileNotFoundError(f'{named}: {problem}')


_DECOMPRESS = {'gzip': gzip.decompress, 'bzip2': bz2.decompress, 'xz': lzma.decompress}
# The shell command that writes a compressed file's text to standard output, by `compression`.
_DECOMPRESS_COMMANDS = {'gzip': 'zcat', 'bzip2': 'bzcat', 'xz': 'xzcat', 'zip': 'unzip -p'}


def decompress_command(path) -> str | None:
  """The shell command that writes the text of the compressed file at `path` to standard output
  (`zcat <path>`; `bzcat`, `xzcat`, `unzip -p` for the others, by `compression`, as
  `read_data_file` reads it), the path quoted for the shell where it needs it; None for a file
  that is not compressed. For a remedy that pipes a data file's text into a converter."""
  with open(path, 'rb') as file:
    kind = compression(file.read(16))
  return f'{_DECOMPRESS_COMMANDS[kind]} {shlex.quote(str(path))}' if kind else None


def read_data_file(path) -> bytes:
  """The bytes of the file at `path`, decompressed if it is gzip, bzip2, xz or a zip of one
  file (`compression`; the name does not matter). A zip's directories are not files.

  Raises:
    ValueError: a compressed file is truncated or corrupt, or a zip holds other than one file
      (the message lists them).
    OSError: the file cannot be read.
  """
  path = pathlib.Path(path)
  data = path.read_bytes()
  kind = compression(data)
  if kind is None:
    return data
  try:
    if kind != 'zip':
      return _DECOMPRESS[kind](data)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
      members = [info.filename for info in archive.infolist() if not info.is_dir()]
      if len(members) == 1:
        return archive.read(members[0])
  except (EOFError, OSError, ValueError, lzma.LZMAError, zlib.error, zipfile.BadZipFile) as error:
    raise ValueError(
      f'{path} is a {kind} file but not a complete one ({error}): it is truncated or corrupt; '
      'compress or download it again'
    ) from None
  held = f'{len(members)} files ({", ".join(members)})' if members else 'no file'
  raise ValueError(
    f'{path} is a zip holding {held}; a data file may be a zip of one file only: extract the '
    'one you mean and give its path'
  )


def decode_utf8(data: bytes, name) -> str:
  """`data` decoded as UTF-8, a leading byte order mark removed.

  Args:
    name: the file the bytes are from, for the message.
  Raises:
    ValueError: `data` is not valid UTF-8 (the message names `name` and the line).
  """
  try:
    return data.decode('utf-8').removeprefix('\ufeff')
  except UnicodeDecodeError as error:
    line = data.count(b'\n', 0, error.start) + 1
    # Both counted from 1, as the line is: the byte in the whole was error.start, 0-based, one
    # byte before where `head -c` or `cmp` lands.
    column = error.start - data.rfind(b'\n', 0, error.start)
    raise ValueError(
      f'{name} line {line} is not valid UTF-8 ({error.reason} at byte {column} of the line, '
      f'byte {error.start + 1} of the whole, counted from 1); re-encode it as UTF-8'
    ) from None


def decode_lines(data: bytes, name) -> list[str]:
  """The lines of the UTF-8 text `data` (`decode_utf8`, then `relpos.files.split_lines`: a
  '\\r\\n' ending read as '\\n'), as the translation reader reads a file
  (`relpos.data.parallel_text.read_lines`), and what a run's record of such a file compares
  (`relpos.training.data_record`).

  Raises:
    ValueError: `data` is not valid UTF-8 (`decode_utf8`).
  """
  return split_lines(decode_utf8(data, name))
