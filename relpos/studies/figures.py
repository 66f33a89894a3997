"""How every relpos plot is drawn and written: matplotlib's Agg backend (no display needed),
`subplots` from here, and `save`, which lays a figure out, writes it and frees it.

matplotlib is imported on the first figure, not with this module: the study tools' commands
that draw nothing (their errors, `--print_only`) start without it. `pyplot` is still an
attribute of this module (imported when first read)."""

from pathlib import Path


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


def save(figure, path, dpi: int = 120) -> Path:
  """Writes `figure` to `path` (its format from the suffix; a PNG named path.png where it has
  none, as matplotlib would) after a tight layout, then closes it; returns the path written.

  Raises:
    ValueError: `path` is a directory (matplotlib would write path.png beside it).
  """
  path = Path(path)
  if path.is_dir():
    _pyplot().close(figure)
    raise ValueError(f'{path} is a directory: give a file name, e.g. {path / "figure.png"}')
  if not path.suffix:
    path = path.with_name(path.name + '.png')
  figure.tight_layout()
  figure.savefig(path, dpi=dpi)
  _pyplot().close(figure)
  return path
