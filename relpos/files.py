"""Writing a run's small files whole or not at all.

A process killed while it writes (kill -9, Ctrl-C's immediate exit, a full disk) leaves a file
cut short: a config.json that no longer parses, an eval_results.json a sweep then reads as
damaged. `write_atomically` writes beside the file and renames over it, which POSIX makes
atomic within a filesystem, so a reader sees the old file or the new one, never a part.

Also here, what the commands check of a path before they write or read there: a directory that
takes files (`check_takes_files`), a symbolic link to nothing (`dangling_link`); and the one way
text files of a line per sentence (data, translations, stdin) are cut into lines
(`split_lines`, `read_text_lines`).

And the mark relpos leaves beside a file it makes in a workdir (`write_marked`, `made_here`),
which tells it apart from a file a user placed there under the same name; and the record of
where a file came from (`record_source`, `copy_with_source`, `recorded_source`,
`recorded_original`), which a sweep leaves beside the vocabularies it trains and hands from one
run to the next.
"""

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path


def write_atomically(path, content: str | bytes) -> None:
  """Writes `content` (text as UTF-8, or bytes) to `path` through a temporary file beside it.

  An OSError of the write names `path` as its filename: a full disk's ENOSPC from the write
  itself names no file at all, and one from opening the temporary file names that, which the
  callers' fault lines (`relpos.faults.filesystem_fault`) would show, or, naming
  no file, not tell from a data file's error. Removing the temporary file afterwards may fail
  too: on a read-only filesystem even unlinking a file that is not there is EROFS (the kernel
  refuses the write before it looks the name up), naming the temporary file; that error would
  replace the write's, so it is let go (there is nothing to remove where it cannot be made)."""
  path = Path(path)
  partial = path.with_name(f'.{path.name}.partial-{os.getpid()}')
  try:
    if isinstance(content, bytes):
      partial.write_bytes(content)
    else:
      partial.write_text(content, encoding='utf-8')
    os.replace(partial, path)
  except OSError as error:
    if not error.errno:
      raise
    # OSError(errno, ...) is the errno's own subclass again (PermissionError, say).
    raise OSError(error.errno, error.strerror, str(path)) from error
  finally:
    with contextlib.suppress(OSError):
      partial.unlink(missing_ok=True)


def made_mark(path) -> Path:
  """The file beside `path` (`<name>.made`) that `write_marked` writes: the sha256 of the
  content relpos wrote to `path`."""
  path = Path(path)
  return path.with_name(f'{path.name}.made')


def write_marked(path, content: bytes) -> None:
  """Writes `content` to `path` (`write_atomically`), its sha256 to `made_mark(path)` first.

  A workdir's file relpos makes before its run is recorded (the vocabulary spm.model) and a
  file a user placed there to share (an spm.model copied in) look the same once a start is
  killed (SIGKILL, a requeued job) between the two: the mark tells them apart (`made_here`).
  Written first, a kill between the two leaves a mark whose digest no file matches, and
  holding the digest, a mark left beside a file placed later does not claim it."""
  write_atomically(made_mark(path), hashlib.sha256(content).hexdigest())
  write_atomically(path, content)


def made_here(path) -> bool:
  """Whether `path` is the file `write_marked` wrote there (its mark holds its digest), not one
  placed there by hand."""
  try:
    mark = made_mark(path).read_text(encoding='utf-8').strip()
    return mark == hashlib.sha256(Path(path).read_bytes()).hexdigest()
  except (OSError, UnicodeDecodeError):
    return False


def source_mark(path) -> Path:
  """The file beside `path` (`<name>.source`) that says where its content came from: what
  `record_source` and `copy_with_source` write, and `recorded_source` reads."""
  path = Path(path)
  return path.with_name(f'{path.name}.source')


def record_source(
  path, source: str, content: bytes | None = None, *, copied_from: Path | None = None
) -> None:
  """Writes `source_mark(path)`: `source` (a line saying where the file at `path` came from)
  and the SHA-256 of its content (`content`, by default what `path` holds now), so that the
  record claims that content only: a file put there later, or changed since, has none
  (`recorded_source`). `copied_from`: the file it is a copy of, recorded as an absolute path
  (`recorded_original`)."""
  content = Path(path).read_bytes() if content is None else content
  record = {'source': source, 'sha256': hashlib.sha256(content).hexdigest()}
  if copied_from is not None:
    record['copied_from'] = str(Path(copied_from).absolute())
  write_atomically(source_mark(path), json.dumps(record) + '\n')


def copy_with_source(original, path, source: str) -> None:
  """Copies the file `original` to `path` (`write_atomically`, its directory made), its
  `record_source` first, naming `original`: as with `write_marked`, a kill between the two
  leaves a record that no file matches."""
  content = Path(original).read_bytes()
  Path(path).parent.mkdir(parents=True, exist_ok=True)
  record_source(path, source, content, copied_from=original)
  write_atomically(path, content)


def _source_record(path) -> dict | None:
  """The record `record_source` wrote beside `path`, where it is of the content `path` holds
  now; None for any other file, or none at all."""
  try:
    record = json.loads(source_mark(path).read_text(encoding='utf-8'))
    content = Path(path).read_bytes()
  except (OSError, UnicodeDecodeError, ValueError):
    return None
  if not isinstance(record, dict) or record.get('sha256') != hashlib.sha256(content).hexdigest():
    return None
  return record


def recorded_source(path) -> str | None:
  """Where the file at `path` came from, as `record_source` recorded it beside the file, where
  that record is of the content `path` holds now; None for any other file, or none at all."""
  source = (_source_record(path) or {}).get('source')
  return source if isinstance(source, str) else None


def recorded_original(path) -> Path | None:
  """The file that the file at `path` is a copy of (`copy_with_source`), as recorded beside it,
  where that record is of the content `path` holds now; None for a file not copied so (or
  copied before the original was recorded), or changed since."""
  original = (_source_record(path) or {}).get('copied_from')
  return Path(original) if isinstance(original, str) else None


def check_takes_files(directory) -> None:
  """Makes `directory` (with its missing parents) and checks that it takes files, by making and
  removing a file there (`tempfile.TemporaryFile`): what a command that will write there checks
  before its work (train.py its workdir, before training; eval.py its output directory, before
  scoring), so that a directory that refuses files ends the command at once, not after hours.

  Raises:
    OSError: the directory cannot be made or takes no file; its filename is `directory` (the
      probe file's own name, a random one, would mean nothing to the reader of the error).
  """
  directory = Path(directory)
  try:
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=directory, prefix='.relpos-write-check-'):
      pass
  except OSError as error:
    if not error.errno or error.filename is None or Path(error.filename).parent != directory:
      raise  # the directory's own error (or a parent's), named as it is
    raise OSError(error.errno, error.strerror, str(directory)) from error


def dangling_link(path) -> str | None:
  """What is wrong with `path` where it, or a directory on it, is a symbolic link to something
  that does not exist (a volume not mounted, a target moved), as the words of an error and
  what to do; None where there is none. Made through, such a link fails as 'File exists' (a
  writer's mkdir meets the link) or reads as no directory at all, and read, as no file at all
  ('does not exist', 'no text file'), neither saying why: the one check of it for a workdir
  (`relpos.training.run_config.check_path`), a data file
  (`relpos.data.data_file.refuse_dangling_link`) and --config's file
  (`relpos.config.command_line`)."""
  path = Path(path)
  for link in (path, *path.parents):
    if link.is_symlink() and not link.exists():
      which = 'it is' if link == path else f'{link} is'
      return (
        f'{which} a symbolic link to {os.readlink(link)}, which does not exist: mount it or '
        'point the link elsewhere'
      )
  return None


def split_lines(text: str) -> list[str]:
  """The lines of `text`, split on '\n' only, each without a trailing '\r' (CRLF), a final
  '\n' ending the last line rather than starting an empty one.

  Never `str.splitlines()`, which also splits on the other line breaks Unicode knows (U+0085,
  U+2028, U+2029, '\x1c'..'\x1e', '\v', '\f'): a sentence holding one (U+0085 is the cp1252
  "…" read as Latin-1, and survives SentencePiece's normalisation into a translation) became
  two, so translations no longer lined up with their references (a sweep's paired test:
  '79 baseline and 79 system translations for 40 references'), nor a source side with its
  target side."""
  lines = text.split('\n')
  if lines[-1] == '':
    lines.pop()
  return [line.removesuffix('\r') for line in lines]


def read_text_lines(path) -> list[str]:
  """The lines (`split_lines`) of the UTF-8 file at `path` as written, with no newline
  translation (`Path.read_text` reads a bare '\r' as a line end too)."""
  return split_lines(Path(path).read_bytes().decode('utf-8'))


def distinct_paths(paths) -> list:
  """`paths` with each file or directory once, in the order given: a path that resolves to
  one named before (`W` and `W/`, `./W`, a symbolic link to it) is left out, and one `warning:`
  line names the repeats. For the study tools that read several runs
  (`relpos.studies.shaw_tables`, `relpos.studies.plot`): a run named twice was counted twice
  in a mean (runs=2) and drawn twice. A path that cannot be resolved is kept as it is, for the
  tool's own line about it."""
  kept, seen, repeated = [], set(), []
  for path in paths:
    try:
      key = Path(path).resolve()
    except (OSError, RuntimeError):  # a loop of links: the tool's check names it
      key = path
    if key in seen:
      repeated.append(str(path))
      continue
    seen.add(key)
    kept.append(path)
  if repeated:
    from relpos.messages import warn

    warn(f'{", ".join(repeated)}: named before (the same directory), read once')
  return kept
