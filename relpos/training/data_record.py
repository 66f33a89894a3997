"""The data files a run trained on, recorded beside its config, so that a file changed since is
named rather than read in silence.

config.json records the data fields, the paths. A file rewritten under the same path (a corpus
regenerated, a preprocessing bug fixed, another download) would give a resumed run other text
at the same data position (the step fixes it) and an evaluation other references, with nothing
said. So when a run records its config it also records `data_files.json`: for each file its task
names (`Task.data_files`: the fields that give a path), its size, modification time and
SHA-256. A resume compares the files with that record (the loop refuses a change unless
--allow_config_change, as it refuses a changed config), and so does an evaluation (a warning:
scoring other data is allowed, not silent).

Hashing is skipped for a file whose size and modification time are those recorded: a check
costs two `stat`s, and a file is hashed only when it is first recorded or looks touched (then
its SHA-256 decides: a file copied back unchanged is the same data). Fields whose path itself
changed are config changes, reported as such, and not compared here; a run recorded before this
file existed has no record and is not checked.
"""

import functools
import hashlib
import json
from pathlib import Path

from relpos.files import write_atomically

DATA_FILES = 'data_files.json'
_CHUNK = 1 << 20


def _sha256(path: Path) -> str:
  """The file's SHA-256, read once per process for a file of a given size and mtime (a resume
  that finds a file touched hashes it in `changes` and would again in `record`)."""
  status = path.stat()
  return _sha256_of(str(path), status.st_size, status.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
  del size, mtime_ns  # the cache key: a file rewritten since has another
  digest = hashlib.sha256()
  with open(path, 'rb') as file:
    while chunk := file.read(_CHUNK):
      digest.update(chunk)
  return digest.hexdigest()


def _stat(path: Path) -> dict:
  status = path.stat()
  return {'path': str(path), 'bytes': status.st_size, 'mtime_ns': status.st_mtime_ns}


def _read(workdir) -> dict:
  path = Path(workdir) / DATA_FILES
  try:
    return json.loads(path.read_text())
  except (FileNotFoundError, ValueError):  # none recorded (an older run), or a damaged record
    return {}


def _same(recorded: dict, path: Path) -> bool:
  """Whether the file at `path` holds what `recorded` (its entry) describes."""
  now = _stat(path)
  if now['bytes'] != recorded.get('bytes'):
    return False
  return now['mtime_ns'] == recorded.get('mtime_ns') or _sha256(path) == recorded.get('sha256')


def changes(workdir, files: dict[str, Path]) -> list[str]:
  """'<field>: <path> changed since the run trained on it (<what>)' for each of `files`
  (field -> path) recorded in workdir with the same path whose content differs now; a file that
  is gone is left to the data readers to name."""
  recorded = _read(workdir)
  lines = []
  for field, path in files.items():
    entry = recorded.get(field)
    path = Path(path)
    if not isinstance(entry, dict) or entry.get('path') != str(path) or not path.is_file():
      continue
    if not _same(entry, path):
      size = path.stat().st_size
      what = (
        f'{entry.get("bytes"):,} bytes then, {size:,} now'
        if size != entry.get('bytes')
        else 'same size, other content'
      )
      lines.append(f'{field}: {path} changed since the run trained on it ({what})')
  return lines


def record(workdir, files: dict[str, Path]) -> None:
  """Writes workdir/data_files.json for `files` (field -> path; those that are not files are
  left out), hashing only files whose record does not already match."""
  recorded = _read(workdir)
  entries = {}
  for field, path in files.items():
    path = Path(path)
    if not path.is_file():
      continue
    entry = recorded.get(field)
    if isinstance(entry, dict) and entry.get('path') == str(path) and _same(entry, path):
      entries[field] = {**entry, **_stat(path)}
    else:
      entries[field] = {**_stat(path), 'sha256': _sha256(path)}
  write_atomically(Path(workdir) / DATA_FILES, json.dumps(entries, indent=2) + '\n')
