"""How every relpos plot is drawn and written: matplotlib's Agg backend (no display needed),
`pyplot` from here, and `save`, which lays a figure out, writes it and frees it."""

from pathlib import Path

import matplotlib

matplotlib.use('Agg')
from matplotlib import pyplot  # noqa: E402


def save(figure, path, dpi: int = 120) -> Path:
  """Writes `figure` to `path` (its format from the suffix) after a tight layout, then closes
  it; returns the path."""
  figure.tight_layout()
  path = Path(path)
  figure.savefig(path, dpi=dpi)
  pyplot.close(figure)
  return path
