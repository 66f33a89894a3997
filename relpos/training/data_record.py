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

Each file is recorded by the path given (what config.json holds), by where that stood
(`absolute`: the path made absolute, links not followed) and by the absolute path it resolved to
then, symbolic links followed. A relative path (`data.txt`) resolves against the directory the
command runs in, so the same config given elsewhere names another file: that is said as such,
with the run's file (`<field>: data.txt names another file than the run's`), where comparing the
two as one file said it had "changed" (same size, other content); a path that stands where it
did but resolves elsewhere went through a symbolic link pointed elsewhere since, and its line
names the link and both files (it said to run from the directory the run was started in, where
the command already ran). Another file that holds the same bytes (a copy) is the same data and
not named. Records made before the
resolved path was recorded are matched by the path given alone.

A path given otherwise than config.json records it is the same data when it names the run's
file (the same resolved path: `data.txt` given as its absolute path, `~/x/../x/a.txt` as
`~/x/a.txt`) or a file with the run's bytes (its size and SHA-256 as recorded: the bundled
corpus of another clone of the repository). `same_data` is that rule, the one both checks of a
run's config use (`relpos.config.recorded`: an evaluation's warning, `run_config.data_changes`,
and a resume's refusal of a config change): such a field is not a change of config. What the
run's own file holds now is still compared here, however it is spelled; another path to other
bytes stays a config change (a warning, or a refusal without --allow_config_change).

A file inside the workdir (the run's vocabulary, which it made there) is the run's own, where
the workdir is now: it is recorded by its place in the workdir too (`in_workdir`), and the
file at that place is the recorded one, compared with its size and SHA-256 as recorded. By its
path, a copied or moved workdir's vocabulary was another file than the run's, never compared
(eval.py scored with a vocabulary swapped since, bleu=0.00, without a word, and a resume
blamed the batch plan). Records made before `in_workdir` was kept are matched by path.

Hashing is skipped for a file whose size and modification time are those recorded: a check
costs two `stat`s, and a file is hashed only when it is first recorded or looks touched (then
its SHA-256 decides: a file copied back unchanged is the same data). A run recorded before this
file existed has no record and is not checked.

A compressed file (gzip, bzip2, xz, a zip of one file: `relpos.data.data_file`, which the
readers decompress) is also recorded by what the run reads of it, its decompressed text's size
and SHA-256 (`text_bytes`, `text_sha256`), and either match is the same data: the same text
compressed again (another gzip header time, another level) or given as the plain file was "other
data" to a resume and an evaluation. A plain file's text is its bytes, so a plain file and a
compressed one are compared by their texts both ways; a compressed file recorded before the text
was has only its compressed bytes to compare.

What a run's data is depends on how its task reads it, and the task says so (`record`'s
`read_as_lines`, from `Task.data_read_as_lines`). The character LM reads bytes: a file converted
to CRLF line endings is other text to it, and its record compares bytes (and text), as above.
The translation reader reads lines (`relpos.data.data_file.decode_lines`: a '\\r\\n' ending is
its '\\n'), so a file converted to CRLF line endings, or back, reads as the very same sentences,
and was "changed since the run trained on it" all the same (eval.py refused to score the run's
test set into its workdir, a resume refused to go on). Such a file is also recorded by the
lines it reads as, their count and the SHA-256 of their text joined by '\\n' (`lines`,
`lines_sha256`), and a match of those is the same data too. A record made before the lines
were (or of a file read as bytes) has no `lines_sha256`, and is compared as it was; a resume
adds them to a record whose file matches it.

The run's vocabulary (`VOCABULARY`: the spm.model or vocab.json it made in its workdir) is the
one file that is never read changed, neither by a resume nor by an evaluation into any
directory (`check_vocabulary`): the model's ids are its pieces.
"""

import functools
import hashlib
import json
from collections.abc import Collection
from pathlib import Path

from relpos.data.data_file import compression, decode_lines, read_data_file
from relpos.files import write_atomically

DATA_FILES = 'data_files.json'
# `Task.data_files`' key of the vocabulary a run makes in its workdir (spm.model, vocab.json).
VOCABULARY = 'the vocabulary'
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


def _compressed(path: Path) -> bool:
  with open(path, 'rb') as file:
    return compression(file.read(16)) is not None


def _text(path: Path) -> tuple[int, str] | None:
  """(size, SHA-256) of what the readers read of the file at `path`: its bytes decompressed
  where it is compressed (`read_data_file`), else its bytes; None for a damaged archive (the
  readers name it)."""
  status = path.stat()
  return _text_of(str(path), status.st_size, status.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _text_of(path: str, size: int, mtime_ns: int) -> tuple[int, str] | None:
  if not _compressed(Path(path)):
    return size, _sha256_of(path, size, mtime_ns)
  try:
    data = read_data_file(path)
  except ValueError:
    return None
  return len(data), hashlib.sha256(data).hexdigest()


def _text_record(path: Path) -> dict:
  """A compressed file's `text_bytes` and `text_sha256` (none for a plain file: its text is
  its bytes, recorded as `bytes` and `sha256`)."""
  if not _compressed(path) or (text := _text(path)) is None:
    return {}
  return {'text_bytes': text[0], 'text_sha256': text[1]}


def _same_text(recorded: dict, path: Path) -> bool:
  """Whether the file at `path` reads as the text `recorded` describes (a compressed one's
  `text_*`, a plain one's bytes), where one of the two is compressed (both plain: their bytes
  were compared already)."""
  if 'text_sha256' not in recorded and not _compressed(path):
    return False
  then = (
    recorded.get('text_bytes', recorded.get('bytes')),
    recorded.get('text_sha256', recorded.get('sha256')),
  )
  return _text(path) == then


def _lines(path: Path) -> tuple[int, str] | None:
  """(count, SHA-256 of their text joined by '\\n') of the lines the file at `path` reads as
  (`decode_lines`, decompressed first where it is compressed); None for a damaged archive or
  text that is not UTF-8 (the readers name it)."""
  status = path.stat()
  return _lines_of(str(path), status.st_size, status.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _lines_of(path: str, size: int, mtime_ns: int) -> tuple[int, str] | None:
  del size, mtime_ns  # the cache key: a file rewritten since has another
  try:
    lines = decode_lines(read_data_file(path), path)
  except ValueError:
    return None
  return len(lines), hashlib.sha256('\n'.join(lines).encode('utf-8')).hexdigest()


def _lines_record(path: Path) -> dict:
  """The `lines` and `lines_sha256` of a file its task reads as lines (none where it does not
  read as text)."""
  if (lines := _lines(path)) is None:
    return {}
  return {'lines': lines[0], 'lines_sha256': lines[1]}


def _same_lines(recorded: dict, path: Path) -> bool:
  """Whether the file at `path` reads as the lines `recorded` describes, where it records any
  (a file its task reads as lines: `record`'s `read_as_lines`)."""
  if 'lines_sha256' not in recorded:
    return False
  return _lines(path) == (recorded.get('lines'), recorded['lines_sha256'])


def _stat(path: Path) -> dict:
  status = path.stat()
  return {
    'path': str(path),
    'absolute': str(path.absolute()),
    'resolved': str(path.resolve()),
    'bytes': status.st_size,
    'mtime_ns': status.st_mtime_ns,
  }


def _read(workdir) -> dict:
  path = Path(workdir) / DATA_FILES
  try:
    return json.loads(path.read_text())
  except (FileNotFoundError, ValueError):  # none recorded (an older run), or a damaged record
    return {}


def _in_workdir(path: Path, workdir) -> str | None:
  """`path`'s place in `workdir` ('spm.model'), None where it lies outside it."""
  try:
    return str(path.absolute().relative_to(Path(workdir).absolute()))
  except ValueError:
    return None


def _is_recorded_file(recorded: dict, path: Path, workdir) -> bool:
  """Whether `path` is the file `recorded` (its entry) was made of: for a file the record
  places in the run's workdir, the file at that place in `workdir`, wherever that is now;
  else the same resolved path, or for a record without one (made before it was recorded), the
  same path given."""
  if 'in_workdir' in recorded:
    return _in_workdir(path, workdir) == recorded['in_workdir']
  if 'resolved' in recorded:
    return str(path.resolve()) == recorded['resolved']
  return str(path) == recorded.get('path')


def _same_file_bytes(recorded: dict, path: Path) -> bool:
  """Whether the file at `path`, the recorded one, holds the bytes `recorded` describes (the
  time as recorded spares the hash)."""
  now = _stat(path)
  if now['bytes'] != recorded.get('bytes'):
    return False
  return now['mtime_ns'] == recorded.get('mtime_ns') or _sha256(path) == recorded.get('sha256')


def _same_reading(recorded: dict, path: Path) -> bool:
  """Whether the file at `path`, whatever its bytes, reads as the data `recorded` describes:
  the same text (`_same_text`), or the same lines for a file its task reads as lines
  (`_same_lines`)."""
  return _same_text(recorded, path) or _same_lines(recorded, path)


def _same(recorded: dict, path: Path) -> bool:
  """Whether the file at `path`, the recorded one, holds the data `recorded` describes: its
  bytes, or what they read as (`_same_reading`)."""
  return _same_file_bytes(recorded, path) or _same_reading(recorded, path)


def _same_bytes(recorded: dict, path: Path) -> bool:
  """Whether the file at `path`, another than the recorded one, holds the same data: the same
  bytes (its time says nothing of that), or what they read as (`_same_reading`)."""
  same = path.stat().st_size == recorded.get('bytes') and _sha256(path) == recorded.get('sha256')
  return same or _same_reading(recorded, path)


def names_recorded_data(recorded: dict, path: Path, workdir) -> bool:
  """Whether `path` names the data `recorded` (a field's entry for the run in `workdir`) was
  made of: the recorded file itself (`_is_recorded_file`; whatever it holds now, which
  `changes` compares), or another file with the same bytes. A file that cannot be read (or
  resolved) is not: the data readers name it, as they do a missing one."""
  try:
    return _is_recorded_file(recorded, path, workdir) or (
      path.is_file() and _same_bytes(recorded, path)
    )
  except (OSError, RuntimeError):  # RuntimeError: a symbolic link loop, resolved
    return False


def same_data(workdir, files: dict[str, Path]) -> set[str]:
  """The fields of `files` (field -> path) given another path than the run in workdir recorded
  that name its data all the same (`names_recorded_data`): the config checks read such a
  path as the run's (`relpos.config.recorded`). Empty when nothing is recorded."""
  recorded = _read(workdir)
  return {
    field
    for field, path in files.items()
    if isinstance(entry := recorded.get(field), dict)
    and entry.get('path') != str(path)
    and names_recorded_data(entry, Path(path), workdir)
  }


# What `changes` says of a run's own file (its recorded path) whose data differs now: no field
# given otherwise, so no field to give back (`run_results.check_own_result` tells it by this).
REWRITTEN = 'changed since the run trained on it'


def changes(workdir, files: dict[str, Path]) -> list[str]:
  """A line for each of `files` (field -> path) recorded in workdir whose data differs now:
  '<field>: <path> changed since the run trained on it (<what>)' for the run's own file, and
  '<field>: <path> names another file than the run's (...)' for the same path given resolving
  to another file with other bytes (a relative path from another directory, a link pointed
  elsewhere, `_elsewhere`). A file that is gone, or cannot be read, is left to the data readers
  to name."""
  recorded = _read(workdir)
  lines = []
  for field, path in files.items():
    entry = recorded.get(field)
    path = Path(path)
    if not isinstance(entry, dict) or not path.is_file():
      continue
    try:
      line = _change(field, entry, path, workdir)
    except (OSError, RuntimeError):  # unreadable (or a link loop): the readers name it
      continue
    if line:
      lines.append(line)
  return lines


def _change(field: str, entry: dict, path: Path, workdir) -> str | None:
  """`changes`'s line for one field, None when its data is the run's."""
  if _is_recorded_file(entry, path, workdir):
    if not _same(entry, path):
      size = path.stat().st_size
      what = (
        f'{entry.get("bytes"):,} bytes then, {size:,} now'
        if size != entry.get('bytes')
        else 'same size, other content'
      )
      return f'{field}: {path} {REWRITTEN} ({what})'
  elif entry.get('path') == str(path) and not _same_bytes(entry, path):
    return _elsewhere(field, entry, path)
  return None


def _last_link(path: Path) -> Path | None:
  """The symbolic link nearest the file on `path`'s absolute path (the file itself, or a
  directory above it), None where there is none."""
  absolute = path.absolute()
  return next((p for p in (absolute, *absolute.parents) if p.is_symlink()), None)


def _elsewhere(field: str, entry: dict, path: Path) -> str:
  """`changes`'s line for the path the run was given, resolving now to another file with other
  bytes. Where it stands as it did (the same absolute path, recorded as `absolute`), a symbolic
  link on it points elsewhere since: the line names the link and both files, for the remedy is
  the link's, not the directory the command runs in. Otherwise the command runs from another
  directory than the run's (a relative path); a record made before `absolute` was kept cannot
  tell the two apart, and its line names both causes."""
  then, now = entry['resolved'], path.resolve()
  link = _last_link(path)
  if entry.get('absolute') == str(path.absolute()):
    if link is None:  # the link that led to the run's file was replaced by a file
      return (
        f'{field}: {path} is a file of its own now; when the run trained on it, it was a '
        f'symbolic link to {then}: give {then}, or make {path} that link again'
      )
    return (
      f'{field}: {path} reads {now} now: the symbolic link {link} on it points elsewhere since '
      f'the run trained, when it led to {then}: point it back, or give {then}'
    )
  relinked = (
    '' if 'absolute' in entry or link is None else f', or the link {link} points elsewhere since'
  )
  return (
    f"{field}: {path} names another file than the run's (here {now}; the run read {then}, "
    f'resolved from where it was started{relinked}): run from the directory the run was '
    f'started in, or give {then}'
  )


def record(workdir, files: dict[str, Path], read_as_lines: Collection[str] = ()) -> None:
  """Writes workdir/data_files.json for `files` (field -> path; those that are not files are
  left out), hashing only files whose record does not already match; a file inside `workdir`
  also by its place there (`in_workdir`), and one of the fields `read_as_lines` (the files its
  task reads as lines) by those lines too (`lines`, `lines_sha256`)."""
  recorded = _read(workdir)
  entries = {}
  for field, path in files.items():
    path = Path(path)
    if not path.is_file():
      continue
    entry = recorded.get(field)
    if (
      isinstance(entry, dict)
      and _is_recorded_file(entry, path, workdir)
      and _same_file_bytes(entry, path)
    ):
      entries[field] = {**entry, **_stat(path)}
    else:
      entries[field] = {**_stat(path), 'sha256': _sha256(path), **_text_record(path)}
    if field in read_as_lines and 'lines_sha256' not in entries[field]:
      entries[field].update(_lines_record(path))
    if (place := _in_workdir(path, workdir)) is not None:
      entries[field]['in_workdir'] = place
  write_atomically(Path(workdir) / DATA_FILES, json.dumps(entries, indent=2) + '\n')


def recorded_lines(workdir, field: str) -> int | None:
  """The number of lines the run in `workdir` recorded for the file of `field` (a file its
  task reads as lines, `record`'s `read_as_lines`); None where it recorded none."""
  entry = _read(workdir).get(field)
  lines = entry.get('lines') if isinstance(entry, dict) else None
  return lines if isinstance(lines, int) else None


def check_vocabulary(workdir: Path, files: dict[str, Path]) -> None:
  """Refuses to read the run in `workdir` with a vocabulary changed since it trained
  (`files`: `Task.data_files`, whose `VOCABULARY` is the workdir's spm.model or vocab.json,
  compared with its record, `changes`). Unlike other data, it is not something to
  score elsewhere: the model's ids are its vocabulary's pieces, so another vocabulary reads
  every sentence as other ids (with --output_dir, eval.py scored them so, exit 0, a fraction
  of the run's BLEU). eval.py and the tools that read a run (`task_base.Task.trained_model`)
  refuse it, with or without --output_dir, and so does a resume, with
  or without --allow_config_change (it trained the checkpoint's embeddings on other pieces).

  Raises:
    ValueError: naming the file and the remedy, to put the run's own file back.
  """
  vocabulary = files.get(VOCABULARY)
  if vocabulary is None or not (changed := changes(workdir, {VOCABULARY: vocabulary})):
    return
  raise ValueError(
    f"{changed[0]}: the model's ids are the pieces of the vocabulary it trained with, so the "
    "run is not resumed, read or scored (into any directory) with another: restore the run's "
    f'{vocabulary.name} (from a backup or from where the run came from)'
  )
