"""How every relpos plot is drawn and written: matplotlib's Agg backend (no display needed),
`subplots` from here, and `save`, which lays a figure out, writes it and frees it.

matplotlib is imported on the first figure, not with this module: the study tools' commands
that draw nothing (their errors, `--print_only`) start without it. `pyplot` is still an
attribute of this module (imported when first read)."""

import io
import warnings
from pathlib import Path

from relpos.faults import filesystem_fault
from relpos.files import write_atomically


def _pyplot():
  """matplotlib.pyplot on the Agg backend, imported on first use."""
  import matplotlib

  matplotlib.use('Agg')
  from matplotlib import pyplot

  return pyplot


def __getattr__(name: str):
  if name == 'pyplot':
    return _pyplot()
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def subplots(*args, **kwargs):
  """matplotlib.pyplot.subplots (on the Agg backend): (figure, axes)."""
  return _pyplot().subplots(*args, **kwargs)


def save(figure, path, dpi: int = 120, *, flag: str | None = None) -> Path:
  """Writes `figure` to `path` (its format from the suffix; a PNG named path.png where it has
  none, as matplotlib would) after a tight layout (where the labels leave room for one; no
  warning where they do not), then closes it; returns the path written.
  The figure is drawn in memory and written whole (`relpos.files.write_atomically`): an
  OSError names the file, also a full disk met only as matplotlib's file was flushed.

  Where a command's flag named the path (`flag`, a study's --out), a write the filesystem
  refuses is that command's exit-74 fault (`relpos.faults.filesystem_fault`, as
  train.py's), which the tools report as their launchers do (`relpos.cli.exit_for_fault`):
  every tool that writes a figure says it the same way, here.

  Raises:
    ValueError: `path` is a directory (matplotlib would write path.png beside it) or a format
      matplotlib does not write; prefixed with `flag`=path where a command's flag named it.
    FilesystemFaultError: with `flag`, the file cannot be written (a read-only or full disk,
      permission, a missing directory or a file in the way of one); nothing was written.
    OSError: without `flag`, the same, naming the file.
  """
  path = Path(path)
  try:
    if path.is_dir():
      raise ValueError(f'{path} is a directory: give a file name, e.g. {path / "figure.png"}')
    if not path.suffix:
      path = path.with_name(path.name.rstrip('.') + '.png')
    with warnings.catch_warnings():
      # Labels too long for the figure (a sweep over long paths or value names) leave
      # matplotlib's layout as it was, and it says so as a two-line UserWarning on stderr, a
      # library's traceback-like text among relpos's own lines; the figure is written all the
      # same (the long labels cut at its edge), so there is nothing for the user to do.
      warnings.filterwarnings('ignore', 'Tight layout not applied', UserWarning)
      figure.tight_layout()
    drawn = io.BytesIO()
    figure.savefig(drawn, dpi=dpi, format=path.suffix.removeprefix('.'))
    write_atomically(path, drawn.getvalue())
  except OSError as error:
    if flag is None:
      raise
    raise filesystem_fault(
      error,
      f'cannot write {flag}={path}',
      last_good='nothing was written',
      resume=False,
      flag=flag,
      flag_names_file=True,
    ) from error
  except ValueError as error:
    if flag is None:
      raise
    raise ValueError(f'{flag}={path}: {error}') from None
  finally:
    _pyplot().close(figure)
  return path
