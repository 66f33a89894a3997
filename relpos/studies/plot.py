"""Training and evaluation curves of one or more runs, from their metrics.jsonl, in one PNG.

    python -m relpos.studies.plot runs/tiny_shaw runs/tiny_absolute --out=curves.png

One panel per scalar the runs logged (train/loss, train/bpc, valid/bpc, eval/perplexity, ...;
not throughput), one line per run, against the step. A resumed run's repeated steps keep their
last value. A workdir that does not exist or holds no metrics yet, or runs of different tasks,
are one line, exit 1; an --out the filesystem will not take (read-only, full, under a file) is
one line, exit 74 (`relpos.studies.figures.save`).
"""

import json
import math
import sys
from pathlib import Path

from absl import flags

from relpos.cli import run_main
from relpos.config.command_line import refuse_empty_paths
from relpos.files import distinct_paths
from relpos.studies.figures import save as save_figure
from relpos.studies.figures import subplots
from relpos.training.run_config import check_path, check_task, not_a_run

_SKIPPED = ('step', 'time', 'train/tok_per_s')


def read_curves(workdir) -> dict[str, dict[int, float]]:
  """{scalar: {step: value}} of workdir/metrics.jsonl (later lines win: a resumed run's).

  Raises:
    FileNotFoundError: no such workdir, or no metrics.jsonl in it.
    ValueError: the file holds no scalar, or the OS refuses the path (`check_path`).
  """
  check_path(workdir, flag=None)
  workdir = Path(workdir)
  if not workdir.is_dir():
    raise FileNotFoundError(f'{workdir} is not a directory: give the --workdir of a run')
  path = workdir / 'metrics.jsonl'
  if not path.is_file():
    raise FileNotFoundError(
      not_a_run(workdir, str(workdir))
      or f'{path} does not exist: the run has not logged a step yet'
    )
  curves = {}
  for line in path.read_text().splitlines():
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      continue  # a line cut by a kill
    if not isinstance(record, dict) or not isinstance(record.get('step'), int):
      raise ValueError(
        f'{path}: {line[:80]!r} is not a metrics record (an object with an integer "step")'
      )
    for name, value in record.items():
      if name not in _SKIPPED and isinstance(value, int | float) and math.isfinite(value):
        curves.setdefault(name, {})[int(record['step'])] = float(value)
  if not curves:
    raise ValueError(f'{path} holds no scalars yet')
  return curves


def check_one_task(workdirs) -> None:
  """Raises TaskMismatchError (a ValueError) when the workdirs hold runs of different tasks
  (their config.json; workdirs without one are not checked)."""
  task = first = None
  for workdir in workdirs:
    needs = f'{first} holds a run of task {task!r}: plot runs of one task together'
    recorded = check_task(workdir, task, flag=None, needs=needs)
    if recorded is not None and task is None:
      task, first = recorded.get('task'), workdir


def plot_runs(workdirs, out) -> Path:
  """Writes the curves of `workdirs` to `out`; returns its path."""
  check_one_task(workdirs)
  runs = {str(workdir): read_curves(workdir) for workdir in workdirs}
  names = sorted({name for curves in runs.values() for name in curves})
  columns = min(3, len(names))
  rows = math.ceil(len(names) / columns)
  figure, axes = subplots(rows, columns, figsize=(4.5 * columns, 3.2 * rows), squeeze=False)
  for axis, name in zip(axes.flat, names, strict=False):
    for label, curves in runs.items():
      if name in curves:
        steps = sorted(curves[name])
        axis.plot(
          steps,
          [curves[name][s] for s in steps],
          label=label,
          marker='.' if len(steps) < 20 else None,
        )
    axis.set_title(name)
    axis.set_xlabel('step')
    axis.grid(alpha=0.3)
  for axis in list(axes.flat)[len(names) :]:
    axis.set_visible(False)
  axes.flat[0].legend(fontsize='small')
  return save_figure(figure, Path(out), flag='--out')


def main(argv):
  if len(argv) < 2:
    sys.exit(
      'error: name at least one workdir: python -m relpos.studies.plot W1 [W2 ...] --out=F.png'
    )
  refuse_empty_paths(flags.FLAGS, argv[1:])
  # --out that cannot be written (`figures.save`) is a FAULTS line, exit 74 (`run_main`).
  print(f'wrote {plot_runs(distinct_paths(argv[1:]), flags.FLAGS.out)}')


if __name__ == '__main__':
  flags.DEFINE_string('out', 'curves.png', 'The PNG to write.')
  run_main(main, positional=True)  # quiet logging: matplotlib logs its font cache at INFO
