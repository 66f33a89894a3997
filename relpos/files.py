"""Writing a run's small files whole or not at all.

A process killed while it writes (kill -9, Ctrl-C's immediate exit, a full disk) leaves a file
cut short: a config.json that no longer parses, an eval_results.json a sweep then reads as
damaged. `write_atomically` writes beside the file and renames over it, which POSIX makes
atomic within a filesystem, so a reader sees the old file or the new one, never a part.
"""

import os
from pathlib import Path


def write_atomically(path, content: str | bytes) -> None:
  """Writes `content` (text as UTF-8, or bytes) to `path` through a temporary file beside it.

  An OSError of the write names `path` as its filename: a full disk's ENOSPC from the write
  itself names no file at all, and one from opening the temporary file names that, which the
  callers' fault lines (`relpos.training.checkpoints.filesystem_fault`) would show, or, naming
  no file, not tell from a data file's error."""
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
    partial.unlink(missing_ok=True)
