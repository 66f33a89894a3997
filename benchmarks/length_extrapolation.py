"""Length extrapolation of the char LM's position schemes: train at L, score at 1x..16x L.

    python benchmarks/length_extrapolation.py --config=configs/length_extrapolation.py \\
        --workdir=runs/length_extrapolation

For each scheme of `config.positions` and seed of `config.seeds`, trains `config.run` (the
char_tiny model, its position replaced) on segments of L = `config.tgt_len` characters with
no memory, in `<workdir>/<position>/seed=<s>`. Then scores bits-per-char on the run's eval
split in segments of m * L for every m of `config.multiples`, with no memory (the model has
never seen a distance >= L), and in segments of L with a memory of `config.memory_len` (the
memory is a context the model has never trained with either). Every segment after the first
of a row starts cold, so longer segments give more context to most characters: a scheme that
extrapolates gets better with m, one that does not gets worse.

Writes `<workdir>/extrapolation.md` (mean ± std over seeds, per scheme and length),
`extrapolation.csv` (one row per run and length) and `extrapolation.png` (bpc against the
evaluation length, one line per scheme). Finished runs and their scores are kept
(`<run>/extrapolation.json`), so a stopped study resumes where it was and extra lengths only
cost their scoring.
"""

import csv
import json
import statistics
import sys
from pathlib import Path

import matplotlib
import ml_collections
from absl import app, flags
from ml_collections import config_flags

matplotlib.use('Agg')
from matplotlib import pyplot as plt  # noqa: E402

from relpos import runtime  # noqa: E402
from relpos.training import loop, run_config, tasks  # noqa: E402
from relpos.training.checkpoints import Checkpoints  # noqa: E402
from relpos.training.preemption import PreemptionSignal  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'configs/length_extrapolation.py')
flags.DEFINE_string('workdir', None, 'Where the runs, tables and plot go.')
flags.mark_flags_as_required(['config', 'workdir'])
SCORES_FILE = 'extrapolation.json'


def run_config_for(config, position: str, seed: int) -> ml_collections.ConfigDict:
  """The run of one scheme and seed: segments of L, no memory in training."""
  run = ml_collections.ConfigDict(config.run.to_dict())
  run.seed = seed
  run.model.position = position
  run.train.update(tgt_len=config.tgt_len, mem_len=0, same_length=False)
  return run


def settings(config) -> dict[str, tuple[int, int]]:
  """{label: (eval segment length, eval memory length)}, in table order."""
  lengths = {f'{m}x': (m * config.tgt_len, 0) for m in config.multiples}
  return lengths | {'1x+mem': (config.tgt_len, config.memory_len)}


def train(run, workdir: Path) -> None:
  """Trains the run unless its last checkpoint is there with the same config."""
  checkpoints = Checkpoints(workdir)
  finished = checkpoints.latest_step() == run.train.steps
  checkpoints.close()
  if finished and not run_config.changes_from_recorded(run, workdir):
    return
  with PreemptionSignal() as preemption:
    loop.train(tasks.get(run), run, workdir, preemption, allow_config_change=False)


def score(run, workdir: Path, labels: dict[str, tuple[int, int]]) -> dict[str, dict]:
  """{label: {'bpc', 'tokens', 'tgt_len', 'mem_len'}} of the run, scoring only what its
  scores file lacks."""
  path = workdir / SCORES_FILE
  scores = json.loads(path.read_text()) if path.exists() else {}
  task = tasks.get(run)
  for label, (tgt_len, mem_len) in labels.items():
    if scores.get(label, {}).get('tgt_len') == tgt_len and scores[label]['mem_len'] == mem_len:
      continue
    evaluation = ml_collections.ConfigDict(run.to_dict())
    evaluation.eval.update(tgt_len=tgt_len, mem_len=mem_len, same_length=False)
    result = task.score(evaluation, workdir)
    scores[label] = {
      'bpc': result['bpc'],
      'tokens': result['tokens'],
      'tgt_len': tgt_len,
      'mem_len': mem_len,
    }
    print(f'  {label:>7}: bpc {result["bpc"]:.4f} ({result["tokens"]} chars)', flush=True)
    path.write_text(json.dumps(scores, indent=2))
  return scores


def mean_std(values: list[float]) -> str:
  if len(values) == 1:
    return f'{values[0]:.3f}'
  return f'{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}'


def write_report(config, rows: list[dict], root: Path) -> str:
  """extrapolation.csv (per run) and extrapolation.md (mean ± std over seeds); returns the
  markdown table."""
  with open(root / 'extrapolation.csv', 'w', newline='') as file:
    writer = csv.DictWriter(file, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  labels = settings(config)
  header = ' | '.join(
    f'{label} ({length}{f" + mem {mem}" if mem else ""})' for label, (length, mem) in labels.items()
  )
  lines = [
    f'bits-per-char on {config.run.eval.split}, trained at L = {config.tgt_len} with no memory '
    f'for {config.run.train.steps} steps; mean ± std over seeds {tuple(config.seeds)}',
    '',
    f'| position | {header} |',
    '|---|' + '---|' * len(labels),
  ]
  for position in config.positions:
    cells = [
      mean_std([r['bpc'] for r in rows if r['position'] == position and r['label'] == label])
      for label in labels
    ]
    lines.append(f'| {position} | {" | ".join(cells)} |')
  table = '\n'.join(lines) + '\n'
  (root / 'extrapolation.md').write_text(table)
  return table


def plot(config, rows: list[dict], root: Path) -> Path:
  """bpc (mean, ± std over seeds) against the evaluation length, one line per scheme."""
  figure, axis = plt.subplots(figsize=(6.5, 4.2))
  lengths = [m * config.tgt_len for m in config.multiples]
  for position in config.positions:
    means, stds = [], []
    for m in config.multiples:
      values = [r['bpc'] for r in rows if r['position'] == position and r['label'] == f'{m}x']
      means.append(statistics.mean(values))
      stds.append(statistics.stdev(values) if len(values) > 1 else 0.0)
    axis.errorbar(lengths, means, yerr=stds, marker='o', capsize=3, label=position)
  axis.set_xscale('log', base=2)
  axis.set_xticks(lengths, [str(length) for length in lengths])
  axis.axvline(config.tgt_len, color='grey', linestyle=':', linewidth=1)
  axis.set_xlabel(f'evaluation segment length (trained at {config.tgt_len}, no memory)')
  axis.set_ylabel(f'bits-per-char ({config.run.eval.split})')
  axis.grid(alpha=0.3)
  axis.legend(fontsize='small')
  figure.tight_layout()
  out = root / 'extrapolation.png'
  figure.savefig(out, dpi=110)
  plt.close(figure)
  return out


def study(config, root: Path) -> list[dict]:
  """Trains and scores every run; writes the report and plot; returns the per-run rows."""
  labels = settings(config)
  runs = [(p, s, run_config_for(config, p, s)) for p in config.positions for s in config.seeds]
  for _, _, run in runs:  # every config error before any training
    tasks.get(run).check_config(run)
  rows = []
  for position, seed, run in runs:
    workdir = root / position / f'seed={seed}'
    print(f'=== position={position} seed={seed} ({workdir})', flush=True)
    train(run, workdir)
    scores = score(run, workdir, labels)
    rows += [
      {'position': position, 'seed': seed, 'label': label, **scores[label]} for label in labels
    ]
  print(write_report(config, rows, root))
  print(f'plot: {plot(config, rows, root)}')
  return rows


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  root = Path(flags.FLAGS.workdir)
  root.mkdir(parents=True, exist_ok=True)
  try:
    study(_CONFIG.value, root)
  except tasks.USER_ERRORS as error:
    sys.exit(f'error: {error}')


if __name__ == '__main__':
  runtime.apply_defaults()  # relpos's allocator (re-executes), as train.py
  app.run(main, flags_parser=tasks.parse_flags)
