"""How every relpos plot is drawn and written: matplotlib's Agg backend (no display needed),
`subplots` from here, and `save`, which lays a figure out, writes it and frees it.

matplotlib is imported on the first figure, not with this module: the study tools' commands
that draw nothing (their errors, `--print_only`) start without it. `pyplot` is still an
attribute of this module (imported when first read)."""

import io
from pathlib import Path

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
  none, as matplotlib would) after a tight layout, then closes it; returns the path written.
  The figure is drawn in memory and written whole (`relpos.files.write_atomically`): an
  OSError names the file, also a full disk met only as matplotlib's file was flushed.

  Raises:
    ValueError: `path` is a directory (matplotlib would write path.png beside it), a format
      matplotlib does not write, or (as FileNotFoundError, PermissionError) a path it cannot
      write; prefixed with `flag`=path where a command's flag named it.
  """
  path = Path(path)
  try:
    if path.is_dir():
      raise ValueError(f'{path} is a directory: give a file name, e.g. {path / "figure.png"}')
    if not path.suffix:
      path = path.with_name(path.name.rstrip('.') + '.png')
    figure.tight_layout()
    drawn = io.BytesIO()
    figure.savefig(drawn, dpi=dpi, format=path.suffix.removeprefix('.'))
    write_atomically(path, drawn.getvalue())
  except (OSError, ValueError) as error:
    if flag is None:
      raise
    cause = error.strerror if isinstance(error, OSError) and error.strerror else error
    raise type(error)(f'{flag}={path}: {cause}') from None
  finally:
    _pyplot().close(figure)
  return path
