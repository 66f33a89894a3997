"""How far training moved each row of a translation run's Shaw tables, by distance.

    python -m relpos.studies.shaw_tables runs/study/k_sweep_900/max_relative_position=*/seed=* \\
        --out=docs/results/shaw_table_drift.png

Row k + d of a table w^K or w^V serves every query-key pair at clipped distance d = j - i.
A reading of a sweep over k is that the rows of long distances, which few pairs of short
sentences reach, stay near their random initialisation while k clips them into one edge row
that every long pair trains. This measures it: for each run the initial parameters are rebuilt
from its recorded config and seed (as `relpos.training.translation_task.build` drew them), its
newest
checkpoint is restored, and each row's drift is the L2 norm of (trained - initial). Runs of the
same k are averaged over runs, layers and the two tables, per stack (encoder, decoder) and d.

Prints, per stack, the drift at distances 0, ±1, ±2, ±4, ... up to ±k for each k, and the
initial rows' mean norm (Xavier-uniform over [2k+1, head_dim], so it shrinks as k grows);
`--out` draws drift against d, one line per k, a panel per stack. The decoder's positive
distances stay at 0: its causal mask hides every later key. A drift says where the optimizer
moved a row, not how much the model uses it; `config.eval.max_relative_position` asks that
(docs/results.md). A workdir that is missing, not a translation run, without Shaw tables or
without a checkpoint is one line, exit 1; an --out that cannot be written one line, exit 74
(`relpos.studies.figures.save`).
"""

import sys
from pathlib import Path

import numpy as np
from absl import flags

from relpos import runtime
from relpos.config.command_line import refuse_empty_paths
from relpos.files import distinct_paths
from relpos.studies.figures import save as save_figure
from relpos.studies.figures import subplots

STACKS = ('encoder', 'decoder')
_TABLES = ('rel_key', 'rel_value')


def row_drift(workdir) -> tuple[int, dict[str, np.ndarray], float]:
  """(k, {stack: mean drift of each row [2k+1], row k + d for distance d}, the initial rows'
  mean norm) of the run in `workdir`.

  Raises:
    FileNotFoundError: no run, vocabulary or checkpoint in `workdir`.
    ValueError: not a translation run, or a model without Shaw tables.
  """
  from flax import nnx  # imported after the runtime defaults

  from relpos.training import translation_task as translate

  def unclipped(config):  # a run with tables, read as trained
    if 'max_relative_position' in translate.TASK.unread_fields(config):
      raise ValueError(f'{workdir}: config.model.position={config.model.position!r} has no tables')
    config.eval.update(max_relative_position=-1)

  run = translate.TASK.trained_model(
    workdir, flag=None, needs="shaw_tables reads runs of task 'translate'", prepare=unclipped
  )  # workdirs are positional here

  def tables(model):
    params = nnx.to_flat_state(nnx.state(model, nnx.Param))
    return {path: np.asarray(v[...]) for path, v in params if path[-1] in _TABLES}

  trained = tables(run.model)
  initial = tables(translate.TASK.build_model(run.config, run.vocab.vocab_size))
  drift = {
    stack: np.mean(
      [
        np.linalg.norm(trained[path] - initial[path], axis=-1)
        for path in initial
        if path[0] == f'{stack}_layers'
      ],
      axis=0,
    )
    for stack in STACKS
  }
  initial_norm = float(np.mean([np.linalg.norm(t, axis=-1).mean() for t in initial.values()]))
  return run.config.model.max_relative_position, drift, initial_norm


def drift_by_k(workdirs) -> dict[int, tuple[dict[str, np.ndarray], float, int]]:
  """{k: ({stack: drift per row, mean over the runs of that k}, mean initial norm, runs)}."""
  runs = {}
  for workdir in workdirs:
    k, drift, initial_norm = row_drift(workdir)
    runs.setdefault(k, []).append((drift, initial_norm))
  return {
    k: (
      {stack: np.mean([drift[stack] for drift, _ in group], axis=0) for stack in STACKS},
      float(np.mean([norm for _, norm in group])),
      len(group),
    )
    for k, group in sorted(runs.items())
  }


def _distances(k: int) -> list[int]:
  """0, ±1, ±2, ±4, ... up to ±k."""
  positive = [2**i for i in range(k.bit_length())]
  positive += [k] if k and k not in positive else []
  return [-d for d in reversed(positive)] + [0] + positive


def markdown(by_k) -> str:
  """One table per stack: a row per k (runs, initial norm), a column per distance."""
  distances = _distances(max(by_k))
  lines = []
  for stack in STACKS:
    header = ['k', 'runs', 'initial norm', *(f'd={d:+d}' if d else 'd=0' for d in distances)]
    lines += [
      f'{stack}: mean L2 drift of the table rows from their initialisation',
      '',
      '| ' + ' | '.join(header) + ' |',
      '|' + '---|' * len(header),
    ]
    for k, (drift, initial_norm, runs) in by_k.items():
      cells = [f'{drift[stack][k + d]:.2f}' if abs(d) <= k else '' for d in distances]
      lines.append(f'| {k} | {runs} | {initial_norm:.2f} | ' + ' | '.join(cells) + ' |')
    lines.append('')
  return '\n'.join(lines)


def plot(by_k, out) -> Path:
  """Drift against distance, one line per k, a panel per stack; returns the path."""
  figure, axes = subplots(1, len(STACKS), figsize=(11, 3.8), sharey=True)
  for axis, stack in zip(axes, STACKS, strict=True):
    for k, (drift, _, runs) in by_k.items():
      axis.plot(np.arange(-k, k + 1), drift[stack], marker='.', label=f'k = {k} ({runs} runs)')
    axis.set_title(f'{stack} self-attention')
    axis.set_xlabel('distance d = j - i (row k + d)')
    axis.grid(alpha=0.3)
  axes[0].set_ylabel('L2 drift of the row from its initialisation')
  axes[0].legend(fontsize='small')
  return save_figure(figure, Path(out), flag='--out')


def main(argv):
  if len(argv) < 2:
    sys.exit('error: name at least one workdir: python -m relpos.studies.shaw_tables W1 [W2 ...]')
  refuse_empty_paths(flags.FLAGS, argv[1:])
  # A run training there now, before its first checkpoint, and an --out that cannot be written
  # (`figures.save`, exit 74) are FAULTS lines (`run_main`).
  by_k = drift_by_k(distinct_paths(argv[1:]))
  print(markdown(by_k))
  if flags.FLAGS.out:
    print(f'plot: {plot(by_k, flags.FLAGS.out)}')


if __name__ == '__main__':
  runtime.apply_defaults()
  from relpos.cli import run_main  # after the defaults: it imports jax

  flags.DEFINE_string('out', None, 'A PNG of drift against distance (default: none).')
  run_main(main, positional=True)  # quiet logging: orbax logs every restore at INFO
