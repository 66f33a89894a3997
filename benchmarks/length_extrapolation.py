"""Length extrapolation of the position schemes: train short, evaluate long.

    python benchmarks/length_extrapolation.py --config=configs/length_extrapolation.py:char \\
        --workdir=runs/length_extrapolation/char
    python benchmarks/length_extrapolation.py --config=configs/length_extrapolation.py:translate \\
        --workdir=runs/length_extrapolation/translate

For each scheme of `config.positions` and seed of `config.seeds`, trains `config.run` with
that position in `<workdir>/<position>/seed=<s>`, then:

- char: scores bits-per-char on the run's eval split in segments of m * L for every m of
  `config.multiples`, with no memory (training used segments of L = `config.tgt_len` and no
  memory, so no distance >= L was ever seen), and in segments of L with a memory of
  `config.memory_len` (a context never trained with either). Every segment after the first of a
  row starts cold, so longer segments give more context to most characters: a scheme that
  extrapolates gets better with m, one that does not gets worse.
- translate: trains on the pairs whose sides both have at most N = `config.max_length`
  pieces, translates the whole eval set (beam search, as eval.py) and reports sacreBLEU per
  bucket of source length in pieces (<= N, N..2N, 2N..4N, > 4N) and over all sentences.

Writes `<workdir>/extrapolation.md` (mean ± std over seeds, per scheme and column),
`extrapolation.csv` (one row per run and column) and `extrapolation.png` (the metric against
the evaluation length, one line per scheme); for translation also
`extrapolation_lengths.md`, the translations' length over the references' per bucket (how
much of BLEU's drop past N is the brevity penalty). Finished runs and their scores are kept
(`<run>/extrapolation.json`), so a stopped study resumes where it was and extra char lengths
only cost their scoring.
"""

import csv
import json
import statistics
import sys
from pathlib import Path

import ml_collections
from absl import app, flags
from ml_collections import config_flags

from relpos import runtime, scoring  # noqa: E402
from relpos.data.translation import load_eval_data  # noqa: E402
from relpos.studies.figures import pyplot as plt
from relpos.studies.figures import save as save_figure
from relpos.training import loop, run_config, tasks  # noqa: E402
from relpos.training.checkpoints import Checkpoints  # noqa: E402
from relpos.training.preemption import PreemptionSignal  # noqa: E402

SCORES_FILE = 'extrapolation.json'
# What a run's scores file holds per label, besides 'count' and 'at'.
_RECORDED = {'char': {'bpc'}, 'translate': {'bleu', 'length_ratio'}}


def run_config_for(config, position: str, seed: int) -> ml_collections.ConfigDict:
  """The run of one scheme and seed: char, segments of L with no memory; translate, pairs
  within N pieces."""
  run = ml_collections.ConfigDict(config.run.to_dict())
  run.seed = seed
  run.model.position = position
  if config.task == 'char':
    run.train.update(tgt_len=config.tgt_len, mem_len=0, same_length=False)
  else:
    run.data.max_length = config.max_length
  return run


def settings(config) -> dict[str, tuple[int, int]]:
  """The table's columns, in order. char: {label: (eval segment length, memory length)};
  translate: {label: (shortest, longest source length in pieces)}, the last 'all'."""
  if config.task == 'char':
    lengths = {f'{m}x': (m * config.tgt_len, 0) for m in config.multiples}
    return lengths | {'1x+mem': (config.tgt_len, config.memory_len)}
  n = config.max_length
  return {
    f'<={n}': (0, n),
    f'{n + 1}-{2 * n}': (n + 1, 2 * n),
    f'{2 * n + 1}-{4 * n}': (2 * n + 1, 4 * n),
    f'>{4 * n}': (4 * n + 1, sys.maxsize),
    'all': (0, sys.maxsize),
  }


def metric_name(config) -> str:
  return 'bpc' if config.task == 'char' else 'bleu'


def train(run, workdir: Path) -> None:
  """Trains the run unless its last checkpoint is there with the same config."""
  checkpoints = Checkpoints(workdir)
  finished = checkpoints.latest_step() == run.train.steps
  checkpoints.close()
  if finished and not run_config.changes_from_recorded(run, workdir):
    return
  with PreemptionSignal() as preemption:
    loop.train(tasks.get(run), run, workdir, preemption, allow_config_change=False)


def score(config, run, workdir: Path, labels: dict[str, tuple[int, int]]) -> dict[str, dict]:
  """{label: {metric, count, ...}} of the run, computing only what its scores file lacks (a
  char length not scored yet; for translation, everything once)."""
  path = workdir / SCORES_FILE
  scores = json.loads(path.read_text()) if path.exists() else {}
  recorded = _RECORDED[config.task]
  missing = [
    label
    for label, at in labels.items()
    if scores.get(label, {}).get('at') != list(at) or not recorded <= scores[label].keys()
  ]
  if missing:
    compute = _char_scores if config.task == 'char' else _translation_scores
    scores.update(compute(run, workdir, {label: labels[label] for label in missing}))
    path.write_text(json.dumps(scores, indent=2))
  return scores


def _char_scores(run, workdir: Path, labels) -> dict[str, dict]:
  """Bits-per-char with each label's eval segment and memory lengths."""
  task, scores = tasks.get(run), {}
  for label, (tgt_len, mem_len) in labels.items():
    evaluation = ml_collections.ConfigDict(run.to_dict())
    evaluation.eval.update(tgt_len=tgt_len, mem_len=mem_len, same_length=False)
    result = task.score(evaluation, workdir)
    scores[label] = {'bpc': result['bpc'], 'count': result['tokens'], 'at': [tgt_len, mem_len]}
    print(f'  {label:>7}: bpc {result["bpc"]:.4f} ({result["tokens"]} chars)', flush=True)
  return scores


def _translation_scores(run, workdir: Path, labels) -> dict[str, dict]:
  """sacreBLEU of the eval translations (eval.py's, written once) within each label's source
  lengths in pieces, and their length over the references' (below 1: the brevity penalty)."""
  result = tasks.get(run).evaluate(run, workdir)
  translations = Path(result['translations']).read_text().splitlines()
  data = load_eval_data(run.data, workdir)
  lengths = [len(data.tokenizer.encode(source)) for source in data.eval_sources]
  scores = {}
  for label, (shortest, longest) in labels.items():
    chosen = [i for i, length in enumerate(lengths) if shortest <= length <= longest]
    bleu = length_ratio = float('nan')
    if chosen:
      hypotheses = [translations[i] for i in chosen]
      bucket = scoring.corpus_bleu(hypotheses, [data.eval_references[i] for i in chosen])
      bleu, length_ratio = bucket.score, bucket.length_ratio
    scores[label] = {
      'bleu': bleu,
      'length_ratio': length_ratio,
      'count': len(chosen),
      'at': [shortest, longest],
    }
    print(f'  {label:>7}: BLEU {bleu:.2f} ({len(chosen)} sentences)', flush=True)
  return scores


def mean_std(values: list[float]) -> str:
  if len(values) == 1:
    return f'{values[0]:.3f}'
  return f'{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}'


def _values(rows, position: str, label: str, metric: str) -> list[float]:
  return [r[metric] for r in rows if r['position'] == position and r['label'] == label]


def _markdown_table(config, rows: list[dict], metric: str, title: str, header) -> str:
  """`metric` per scheme (rows) and label (columns), mean ± std over seeds."""
  lines = [
    f'{title}; mean ± std over seeds {tuple(config.seeds)}',
    '',
    f'| position | {" | ".join(header)} |',
    '|---|' + '---|' * len(header),
  ]
  for position in config.positions:
    cells = [mean_std(_values(rows, position, label, metric)) for label in settings(config)]
    lines.append(f'| {position} | {" | ".join(cells)} |')
  return '\n'.join(lines) + '\n'


def write_report(config, rows: list[dict], root: Path) -> str:
  """extrapolation.csv (per run) and extrapolation.md (mean ± std over seeds); for translation
  also extrapolation_lengths.md, the translations' length over the references' (sacreBLEU's,
  13a tokens), which says how much of a drop past N is translations stopping short. Returns
  the markdown tables."""
  with open(root / 'extrapolation.csv', 'w', newline='') as file:
    writer = csv.DictWriter(file, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  labels = settings(config)
  if config.task == 'char':
    title = (
      f'bits-per-char on {config.run.eval.split}, trained at L = {config.tgt_len} with no memory'
    )
    header = [
      f'{label} ({length}{f" + mem {mem}" if mem else ""})'
      for label, (length, mem) in labels.items()
    ]
  else:
    title = (
      f'sacreBLEU per source length in pieces, trained on pairs within N = {config.max_length}'
    )
    counts = {r['label']: r['count'] for r in rows}
    header = [f'{label} ({counts[label]} sentences)' for label in labels]
  steps = f' for {config.run.train.steps} steps'
  table = _markdown_table(config, rows, metric_name(config), title + steps, header)
  (root / 'extrapolation.md').write_text(table)
  if config.task == 'char':
    return table
  lengths = _markdown_table(
    config,
    rows,
    'length_ratio',
    'translation length / reference length (sacreBLEU, 13a tokens) per source length in pieces, '
    f'trained on pairs within N = {config.max_length}',
    list(labels),
  )
  (root / 'extrapolation_lengths.md').write_text(lengths)
  return f'{table}\n{lengths}'


def plot(config, rows: list[dict], root: Path) -> Path:
  """The metric (mean, ± std over seeds) against the evaluation length, one line per scheme:
  char, the segment lengths without memory; translate, the source-length buckets."""
  metric, labels = metric_name(config), list(settings(config))
  if config.task == 'char':
    labels = labels[: len(config.multiples)]
    xs = [m * config.tgt_len for m in config.multiples]
    xlabel = f'evaluation segment length (trained at {config.tgt_len}, no memory)'
  else:
    labels = labels[:-1]  # not 'all'
    xs = [config.max_length * 2**i for i in range(len(labels))]
    xlabel = f'source length in pieces (trained within {config.max_length})'
  figure, axis = plt.subplots(figsize=(6.5, 4.2))
  for position in config.positions:
    values = [_values(rows, position, label, metric) for label in labels]
    means = [statistics.mean(v) for v in values]
    stds = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values]
    axis.errorbar(xs, means, yerr=stds, marker='o', capsize=3, label=position)
  axis.set_xscale('log', base=2)
  axis.set_xticks(xs, labels if config.task != 'char' else [str(x) for x in xs])
  axis.set_xlabel(xlabel)
  axis.set_ylabel(f'{metric} ({config.run.eval.split if config.task == "char" else "eval set"})')
  axis.grid(alpha=0.3)
  axis.legend(fontsize='small')
  return save_figure(figure, root / 'extrapolation.png')


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
    scores = score(config, run, workdir, labels)
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
    study(flags.FLAGS.config, root)
  except tasks.USER_ERRORS as error:
    sys.exit(f'error: {error}')


if __name__ == '__main__':
  runtime.apply_defaults()  # relpos's allocator (re-executes), as train.py
  # Defined only when run as a program, so that tests can import this file beside others.
  config_flags.DEFINE_config_file('config', None, 'configs/length_extrapolation.py')
  flags.DEFINE_string('workdir', None, 'Where the runs, tables and plot go.')
  flags.mark_flags_as_required(['config', 'workdir'])
  app.run(main, flags_parser=tasks.parse_flags)
