"""Sweep one config field over values and seeds: train, evaluate, test, tabulate, plot.

    python -m relpos.studies.sweep --config=configs/translate_tiny.py:shaw --workdir=runs/k_sweep \\
        --values=0,1,2,4,16,64 --seeds=0,1,2
    python -m relpos.studies.sweep --config=configs/translate_tiny.py --workdir=runs/positions \\
        --field=model.position --values=shaw,absolute,shaw_absolute --seeds=0,1,2
    python -m relpos.studies.sweep --config=configs/translate_tiny.py --workdir=runs/ablation \\
        --field=preset --values=shaw,shaw_keys_only,shaw_values_only,none --seeds=0,1,2
    python -m relpos.studies.sweep --config=configs/char_tiny.py:xl --workdir=runs/eval_mem \\
        --field=eval.mem_len --values=0,64,192,512 --seeds=0,1,2
    python -m relpos.studies.sweep --config=configs/translate_tiny.py:shaw --workdir=runs/k_clip \\
        --field=eval.max_relative_position --values=-1,8,4,2,0 --seeds=0,1,2

This module is the command: its flags, its checks before anything trains, the training of
every unfinished run and the faults of its root. Which runs a sweep has, of which configs, in
which directories (`--field=preset`, an eval field, `--evaluations`) is
`relpos.studies.sweep_grid`'s; the tables, plot and p-values written from the finished runs are
`relpos.studies.sweep_tables`'.

A run whose eval_results.json is there for the config's last step is not touched again, so a
sweep stopped anywhere (or spread over sessions) resumes where it was; an unfinished run
resumes from its last checkpoint. A run whose loss goes non-finite is a result too: its
eval_results.json records `diverged_at_step`, a warning names it, and the sweep goes on
(`record_divergence`). The sweep holds its root's workdir lock while it trains, so a second
sweep on the same root is refused at once.

Everything that can be wrong is an error before any training: an unknown field or value, a
metric the task does not report, a field the model never reads at the swept values (k on an
absolute model), an `--evaluations` setting the config checks refuse for any value's model.
`--print_only` prints the commands the sweep runs instead (for a cluster; an eval.py line only
for a score train.py does not write, `sweep_grid.commands`);
`--collect_only` rebuilds the tables from finished runs, with a warning naming each result
that is not of the config as given (another training config, step or config.eval, or
scored from another workdir's checkpoint), then their count and the command that trained the
sweep (`sweep_command.txt` in the root). Any
`--config.*` override on this command line is passed on to every run.
"""

import contextlib
import json
import shlex
import sys
import time
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

from relpos import cli, flag_types, runtime
from relpos.config import checks, command_line
from relpos.faults import UNWRITABLE, error_errno, error_path, filesystem_fault, is_write_fault
from relpos.files import (
  copy_with_source,
  made_here,
  record_source,
  write_atomically,
)
from relpos.messages import duration, warn
from relpos.signals import PreemptedError
from relpos.studies import breakdown, sweep_grid, sweep_tables
from relpos.training import (
  data_record,
  finished_run,
  loop,
  run_config,
  run_results,
  tasks,
  workdir_lock,
  workdir_setup,
)

# The fields a sweep cannot vary, and why: what its runs share by construction, so that a
# value of one would not be a run of this sweep (its table, its metric, its seed axis).
UNSWEPT_FIELDS = {
  'seed': 'every run sets config.seed from --seeds, so each value would be the same run; give '
  'the seeds as --seeds and sweep another field',
  'task': "every run of a sweep is of its config's task, whose metric it tabulates; another "
  "task is another config file: sweep one of the task's fields, and compare tasks with a sweep "
  'of each',
}


def _check_evaluation(task, field: str, variants: list, setting: str, overrides: dict) -> None:
  """Checks what eval.py checks of the config it scores with (`Task.evaluate`) for
  --evaluations' `setting` on each swept config (`variants`: (value, config) pairs). A setting
  that only some of the swept models read (eval.clamp_len, xl's alone, over a model.position
  sweep) is refused for the others (`run_config.check_unread_settings`), naming the values that
  read it: sweep those alone with that setting, or drop it. It is not applied to a model that
  never reads it, which would record it in eval_results.json as used."""
  scored = []
  for value, variant in variants:
    try:
      scored.append((value, variant, sweep_grid.evaluated(variant, overrides)))
      task.check_config(scored[-1][2])
    except ValueError as error:
      raise ValueError(f'--evaluations={setting} for {field}={value}: {error}') from None

  def refusal(variant, config, remedy: str) -> str | None:
    try:
      unread = task.unread_run_fields(config)
      run_config.check_unread_settings(config, unread, variant.to_dict(), remedy)
    except ValueError as error:
      return str(error)
    return None

  refused = [
    (value, variant, config) for value, variant, config in scored if refusal(variant, config, '')
  ]
  if refused:
    refused_values = [value for value, _, _ in refused]
    readers = [str(value) for value, _, _ in scored if value not in refused_values]
    alone = f'sweep {field}={",".join(readers)} alone with it, or ' if readers else ''
    value, variant, config = refused[0]
    error = refusal(variant, config, f'{alone}drop it from --evaluations')
    raise ValueError(f'--evaluations={setting} for {field}={value}: {error}')


def check_sweep(
  config, field: str, values, seeds, metric: str, variant_of=None, evaluations=None
) -> None:
  """Raises ValueError for a sweep that cannot give its table, before anything trains: a
  metric the task does not report, a value the task's checks refuse, a field that the model
  does not read at any swept value (sweeping it would train one model n times), an
  `--evaluations` setting (`sweep_grid.parse_evaluations`) the checks refuse for the model of
  some value (a clip beyond its trained k, say: each run trained, then failed to score).
  `variant_of` (value -> config) replaces setting config.<field>
  (`sweep_grid.preset_variants`)."""
  task = tasks.get(config)
  if metric not in task.metrics:
    raise ValueError(
      f'--metric={metric}: a {config.task} run reports {", ".join(task.metrics)}, not {metric}'
    )
  if not seeds:
    raise ValueError('--seeds is empty: give at least one seed')
  if field in UNSWEPT_FIELDS:
    raise ValueError(f'--field={field}: {UNSWEPT_FIELDS[field]}')
  read_somewhere = variant_of is not None
  variants = []
  for value in values:
    try:
      variant = (
        sweep_grid.with_value(config, field, value) if variant_of is None else variant_of(value)
      )
      task.check_config(variant)
    except ValueError as error:
      raise ValueError(f'--field={field} at {value!r}: {error}') from None
    variants.append((value, variant))
  for setting, overrides in (evaluations or {}).items():
    _check_evaluation(task, field, variants, setting, overrides)
  for _, variant in variants:
    leaf = field.removeprefix('model.')
    if field.startswith('model.'):
      read_somewhere |= leaf not in task.unread_fields(variant)
    else:
      read_somewhere |= field not in task.unread_run_fields(variant)
  if not read_somewhere:
    position = config.model.position
    raise ValueError(
      f'--field={field}: config.model.position={position!r} does not read it, so every '
      'value would train the same model; sweep it with a position that does'
    )


def warn_stale(
  config, root: Path, field: str, values, seeds, variant_of, overrides, setting_runs
) -> set:
  """--collect_only: a `warning:` line for each result of `setting_runs`
  (`sweep_tables.read_runs`' of every run at one --evaluations setting, whose eval fields are
  `overrides`) that is not of the sweep's config as given (`finished_run.stale_reason`, of the
  results `sweep_tables.read_runs` read); returns them, {(value, seed)}. The tables show such a
  result as it is (its mean, std and seed test), but leave it out of the paired bootstrap over
  test items (`sweep_tables.p_value`), which pairs each item of a run with the same item of the
  baseline's: a result scored with another config.eval (tgt_len, say) has other items, or other
  numbers of them, and one of another config is not the sweep's run to pair. Each setting's
  results are checked as they are tabulated (the first's before the tables, the others' for
  sweep_by_evaluation.*). Each warning says what the sweep without --collect_only does with
  the run: train or score it again, or refuse it as trained with another config or on data
  changed since (`check_rerun`)."""
  stale, task = set(), tasks.get(config)
  every_run = sweep_grid.runs(config, field, values, seeds, variant_of)
  for (value, seed, variant), (_, _, path, results) in zip(every_run, setting_runs, strict=True):
    if results is None:
      continue  # `sweep_tables.read_runs` named it
    workdir = sweep_grid.model_dir(root, field, value, seed)
    scored = sweep_grid.evaluated(variant, overrides)
    if reason := finished_run.stale_reason(task, path.parent, scored, workdir, results):
      stale.add((value, seed))
      try:
        trained = sweep_grid.as_trained(config, field, variant)
        check_rerun(trained, workdir, task, f'{field}={value} seed={seed}')
        then = 'trains or scores it again'
      except ValueError:
        then = 'refuses it (a new --workdir, or the config and data the run trained with)'
      warn(
        f'{field}={value} seed {seed}: tabulated as it is, though {reason}, and left out of '
        f'the p-values over test items; the sweep without --collect_only {then}'
      )
  return stale


# The root's record of the command line that trained its sweep (`sweep(command=)`).
COMMAND_RECORD = 'sweep_command.txt'


def stale_summary(root: Path, stale: int, count: int) -> str:
  """--collect_only's last warning where `stale` of the `count` results under `root` are not
  of the config given (each named in a warning above it): how many, and the command that
  trained the sweep (`COMMAND_RECORD`; for a root without it, where each run's config is), for
  a collection given other overrides than the sweep's, whose tables call its runs stale."""
  line = (
    f'{stale} of the {count} results under {root} are not of the config given (the warnings '
    'above say why) and are marked so in the tables'
  )
  try:
    command = (root / COMMAND_RECORD).read_text().strip()
  except (OSError, UnicodeDecodeError):
    return f"{line}; each run's config.json records the config it trained with"
  return f'{line}; the sweep trained with: {command}'


def record_divergence(error: loop.DivergedError, metrics, run: str, unscored) -> None:
  """A diverged run is a result of the sweep, not a fault of it: eval_results.json in each of
  the run's results directories (`unscored`: (config, directory) pairs) records the step
  (`run_results.DIVERGED`), what went non-finite, and null for every metric of the task, so a
  reader of the file alone cannot take it for a score (null, not NaN, which standard JSON has
  not). A rerun keeps it as finished (`finished_run.stale_reason`; the same config diverges
  again), and the tables leave it out with a note (`sweep_tables.collect`,
  `sweep_tables.diverged_runs`). One warning names the run (`run`, 'field=value seed s') and the
  step."""
  for scored, results_dir in unscored:
    results_dir.mkdir(parents=True, exist_ok=True)
    record = {
      **dict.fromkeys(metrics),
      run_results.DIVERGED: error.step,
      'diverged': error.what,
      'eval': scored.eval.to_dict(),
    }
    write_atomically(results_dir / run_results.RESULTS_FILE, json.dumps(record, indent=2))
  warn(
    f'{run} diverged ({error.what}); recorded in {unscored[0][1] / "eval_results.json"}, left '
    'out of the tables and p-values; the sweep goes on with the other runs'
  )


def check_rerun(trained, workdir: Path, task, run: str) -> None:
  """What train.py refuses when a run resumes (`relpos.config.recorded.check_config_change`,
  `relpos.training.data_record`), checked for every run before the first trains and told
  with the sweep's remedies (train.py's --allow_config_change is not the sweep's).

  Raises:
    ValueError: `workdir` holds a run trained with another config than `trained`, or on data
      files changed since; naming the run (`run`) and the changes.
  """
  files = task.data_files(trained, workdir)
  if changes := run_config.run_config_changes(workdir, trained, files):
    raise ValueError(
      f'{run}: {workdir} holds a run trained with another config ({"; ".join(changes)}): give '
      'the sweep a new --workdir for the new config, or the config its runs were trained with '
      f'({workdir / run_config.CONFIG_FILE} records it)'
    )
  if other_data := data_record.changes(workdir, files):
    raise ValueError(
      f'{run}: {workdir} holds a run trained on other data ({"; ".join(other_data)}): give the '
      'sweep a new --workdir to train on the data as it is now, or restore the data its runs '
      'trained on'
    )


def progress(done: int, total: int, started: float) -> str:
  """'run 3 of 8, ...' for the sweep's next run: with runs done in this call, the elapsed
  time and an ETA for the rest at their mean time (a resumed run may take less), written as
  the training loop writes its own (`messages.duration`)."""
  text = f'run {done + 1} of {total} to run'
  if done:
    elapsed = time.monotonic() - started
    remaining = elapsed / done * (total - done)
    text += f', {duration(elapsed)} so far, about {duration(remaining)} left'
  return text


def sweep(
  config,
  root: Path,
  field: str,
  values,
  seeds,
  metric: str,
  baseline,
  *,
  train=True,
  variant_of=None,
  breakdowns=(),
  evaluations=None,
  command: str | None = None,
):
  """Trains and evaluates every unfinished run (if `train`), then writes the tables and plot
  (and those of each (`relpos.studies.breakdown.Breakdown`, edges) in `breakdowns`); returns the
  per-value summary. `variant_of`: see `check_sweep`. `evaluations` ({setting: {eval field:
  value}}, `sweep_grid.parse_evaluations`) scores every trained model at each setting: the
  tables, plot and breakdowns are those of the first setting, and `sweep_by_evaluation.*` holds
  them all. `command`: the sweep's command line, recorded in the root when it trains
  (`COMMAND_RECORD`), which --collect_only names where results are not of its config
  (`stale_summary`)."""
  task = tasks.get(config)
  sweep_grid.check_root(root, field)  # a root of another field's sweep: before it is made
  prepare_root(root, train=train)
  settings = evaluations or {None: {}}
  if train:
    # One sweep at a time on a root: a second one would score the runs the first finishes,
    # then stop at the run the first trains (its workdir's lock); it is refused at once.
    with workdir_lock.hold(root):
      sweep_grid.record_field(root, field)
      if command is not None:
        write_atomically(root / COMMAND_RECORD, (command + '\n').encode())
      train_unfinished(config, task, root, field, values, seeds, variant_of, settings)

  def tabulated(setting, setting_runs: list) -> list[dict]:
    """`sweep_tables.collect`'s rows of `setting_runs` (`sweep_tables.read_runs` at `setting`),
    with --collect_only those of results not of the sweep's config marked (`warn_stale`)."""
    rows = sweep_tables.collect(setting_runs, metric)
    if not train:
      stale = warn_stale(
        config, root, field, values, seeds, variant_of, settings[setting], setting_runs
      )
      for row in rows:
        row['stale'] = (row['value'], row['seed']) in stale
    return rows

  first = next(iter(settings))
  first_runs = sweep_tables.read_runs(root, field, values, seeds, first, task=config.task)
  rows = tabulated(first, first_runs)
  if not train and (stale := sum(row['stale'] for row in rows)):
    warn(stale_summary(root, stale, len(rows)))
  diverged = sweep_tables.diverged_runs(first_runs)
  if not rows:
    raise FileNotFoundError(
      f'no finished runs under {root}'
      + (f': all {len(diverged)} diverged (each eval_results.json says where)' if diverged else '')
    )
  summary = sweep_tables.summarise(config, rows, values, metric, baseline, diverged)
  compared = any(row['value'] == baseline for row in rows)
  if not compared:
    sweep_tables.warn_baseline_without_runs(summary, field, baseline, breakdowns or evaluations)
  print(sweep_tables.write_tables(summary, rows, root, field, metric, baseline, first))
  if not train:  # its tables claim the root (sweep.csv still its first write, `first_write`)
    sweep_grid.record_field(root, field)
  sweep_tables.write_diverged(diverged, root, field)
  print(f'plot: {sweep_tables.plot(summary, rows, root, field, metric)}')
  if not compared:
    return summary  # the breakdowns and evaluations compare every bucket with the baseline
  for kind, edges in breakdowns:
    sweep_tables.write_breakdown(config, rows, baseline, root, field, kind, edges)
  if evaluations:
    by_setting = {
      s: rows if s == first else tabulated(s, sweep_tables.read_runs(root, field, values, seeds, s))
      for s in evaluations
    }
    sweep_tables.write_evaluations(config, by_setting, baseline, root, field, metric)
  return summary


def train_unfinished(config, task, root: Path, field: str, values, seeds, variant_of, settings):
  """`sweep`'s training: trains and scores (at each of `settings`) every run not finished,
  after checking all of them first (their evaluation plans, their recorded configs); a run
  that diverges is recorded as such (`record_divergence`) and the others go on."""
  todo, every_run = [], list(sweep_grid.runs(config, field, values, seeds, variant_of))
  for value, seed, variant in every_run:
    workdir, unscored = sweep_grid.model_dir(root, field, value, seed), []
    for setting, overrides in settings.items():
      results_dir = sweep_grid.run_dir(root, field, value, seed, setting)
      scored = sweep_grid.evaluated(variant, overrides)
      if finished_run.is_finished(task, results_dir, scored, workdir):
        print(f'=== {field}={value} seed={seed}: finished, kept ({results_dir})', flush=True)
      else:
        try:  # what train.py checks before training, for every run before the first trains
          loop.check_evaluation_plan(scored, workdir)
        except ValueError as error:
          raise ValueError(f'{field}={value} seed={seed}: {error}') from None
        unscored.append((scored, results_dir))
    if unscored:
      check_rerun(
        sweep_grid.as_trained(config, field, variant), workdir, task, f'{field}={value} seed={seed}'
      )
      todo.append((value, seed, variant, workdir, unscored))
  started = time.monotonic()
  diverged = {}  # workdir -> its DivergedError: an eval field's one training, for every value
  trained_dirs = list(
    dict.fromkeys(sweep_grid.model_dir(root, field, v, s) for v, s, _ in every_run)
  )
  for done, (value, seed, variant, workdir, unscored) in enumerate(todo):
    print(f'=== {field}={value} seed={seed} ({progress(done, len(todo), started)})', flush=True)
    try:
      if workdir not in diverged:
        train_run(task, sweep_grid.as_trained(config, field, variant), workdir, trained_dirs)
    except loop.DivergedError as error:
      diverged[workdir] = error
    if workdir in diverged:
      record_divergence(diverged[workdir], task.metrics, f'{field}={value} seed {seed}', unscored)
      continue
    for scored, results_dir in unscored:
      result = task.evaluate(scored, workdir, output_dir=results_dir)
      print('\n'.join(task.result_lines(result)), flush=True)


# What the record beside a vocabulary a sweep's run trained says (`files.record_source`): one
# that another run of the sweep may take (`reuse_vocabulary`).
TRAINED_BY_SWEEP = 'trained by relpos.studies.sweep, in one process'


def train_run(task, trained, workdir: Path, trained_dirs: list[Path]) -> None:
  """Trains the run of the config `trained` in `workdir` (`Task.train_model`), on the
  vocabulary of another of the sweep's runs (`trained_dirs`) where that is the one it would
  train (`reuse_vocabulary`). A vocabulary the run trains itself is recorded as the sweep's
  (`TRAINED_BY_SWEEP`, beside it), for the runs after it, in this sweep or when it resumes;
  also where the run diverges (its vocabulary is no worse for that)."""
  reuse_vocabulary(task, trained, workdir, trained_dirs)
  vocabulary = task.data_files(trained, workdir).get(data_record.VOCABULARY)
  had_one = vocabulary is None or vocabulary.exists()
  try:
    task.train_model(trained, workdir)
  finally:
    if not had_one and made_here(vocabulary) and run_config.has_run(workdir):
      # Only a later run's training is at stake: a record that cannot be written is none.
      with contextlib.suppress(OSError):
        record_source(vocabulary, TRAINED_BY_SWEEP)


def reuse_vocabulary(task, trained, workdir: Path, trained_dirs: list[Path]) -> None:
  """Copies into `workdir`, before its run's first start, the vocabulary of one of the sweep's
  runs in `trained_dirs` that trained the very vocabulary this run would train: a k sweep over
  1M pairs trained the same 32000-piece SentencePiece model, byte for byte, in every run. The
  donor is a run whose vocabulary the sweep trained (in one process: `TRAINED_BY_SWEEP`) or
  copied, as recorded beside it, for which the task finds nothing that makes the two differ
  (`workdir_setup.vocabulary_donor_changes`: the data and fields the vocabulary is trained
  on, the draw's seed). The copy's own record names where it came from, so its start uses it
  without the warning of a placed vocabulary, and one line here says so. A copy an earlier
  start of the run was given, which died before it recorded the run (SIGKILL, a refusal), is
  decided again: kept where it is still its donor's, else removed with a line
  (`workdir_setup.remove_stale_copy`: the data changed since, say) and another donor looked
  for. Nothing is copied for a task without such a vocabulary (the character LM), a run
  started already, or where the copy cannot be written (the run trains its own, and its start
  names the fault)."""
  vocabulary = task.data_files(trained, workdir).get(data_record.VOCABULARY)
  if vocabulary is None or run_config.has_run(workdir):
    return
  workdir_setup.remove_stale_copy(task, trained, workdir)
  if vocabulary.exists():
    return
  for other in trained_dirs:
    if other == workdir or workdir_setup.vocabulary_donor_changes(task, trained, other):
      continue
    theirs = task.data_files(trained, other)[data_record.VOCABULARY]
    try:
      copy_with_source(theirs, vocabulary, f'copied by relpos.studies.sweep from {theirs}')
    except OSError:
      return
    print(
      f'vocabulary: {theirs} copied to {vocabulary}, not trained again (the same training '
      'data, vocabulary fields and draw)',
      flush=True,
    )
    return


def root_write_fault(error: OSError, root: Path, *, resume: bool, path: Path | None = None):
  """The exit-74 fault (`relpos.faults.filesystem_fault`, as train.py's) of an OSError writing the
  sweep's own files under `root` (its lock, the tables, the plot) on a full disk or a read-only
  or unwritable filesystem, naming the file (the tables and plot are written through
  `write_atomically`, whose errors name the file also where a full disk is met only as it is
  flushed; the root where an error names none); None for any other error, reported as it is.
  Its runs' own writes are their training's and evaluation's faults already. `resume`: whether
  the same command resumes the sweep (not --collect_only's, whose remedy is a writable root:
  it writes its tables beside the runs it reads, so another --workdir would hold none).
  `path`: the file the write stands for, where the error names another (the root's write
  probe, `first_write`). Which errors those are is train.py's rule for its workdir
  (`relpos.faults.is_write_fault`), but for the other errors of a file under the root (a missing
  one), which are reported as they are: the sweep reads its runs' files there too."""
  path = path or error_path(error)
  if not is_write_fault(error, root, path, reads_others_there=True):
    return None
  collecting = not resume and error_errno(error) in UNWRITABLE
  return filesystem_fault(
    error,
    f"cannot write {path or root} (the sweep's --workdir={root})",
    last_good=f'the finished runs under {root} are intact',
    resume=resume,
    todo='make it writable, then rerun (--collect_only writes its tables into the root it '
    'reads the runs from)'
    if collecting
    else None,
  )


def first_write(root: Path, *, train: bool) -> Path:
  """The first file the sweep writes under `root`: its lock when it trains, else (with
  --collect_only) its table sweep.csv; what a root that takes no files is reported as failing
  to write (`prepare_root`)."""
  return root / (workdir_lock.LOCK_FILE if train else sweep_tables.SUMMARY_TABLE)


def prepare_root(root: Path, *, train: bool) -> None:
  """Checks and makes the sweep's root as train.py's workdir is, also for --collect_only
  (which writes its tables there): a dangling link is one line (exit 1,
  `run_config.check_path`), a file in its place or above it one exit-74 line
  (`workdir_setup.prepare_workdir`). A root that takes no files (read-only, not writable) is the
  sweep's own line (`root_write_fault`), naming the file it would write first
  (`first_write`), not train.py's 'before training ... rerun the same command to resume'."""
  run_config.check_path(root)
  workdir_setup.prepare_workdir(
    root,
    probe_fault=lambda error: root_write_fault(
      error, root, resume=train, path=first_write(root, train=train)
    ),
  )


def main(argv):
  cli.start_command(argv)
  args = flags.FLAGS
  if not args.workdir:
    sys.exit('error: --workdir is required: the root directory of the sweep (a folder per run)')
  config, field, root = args.config, args.field, Path(args.workdir)
  config_arg = command_line.config_arg(sys.argv)
  overrides = [
    arg for arg in command_line.config_overrides(sys.argv) if not arg.startswith('--config.seed=')
  ]
  try:
    task = tasks.get(config)
    task.check_complete(config)  # a field deleted from the file, before --field reads one
    metric = args.metric or task.metric
    if field == sweep_grid.PRESET:
      variant_of = sweep_grid.preset_variants(config_arg.split(':')[0], overrides)
      values, baseline = list(args.values), args.baseline
    else:
      variant_of = None
      sweep_grid.field_type(config, field, f'--field={field}')
      values = [sweep_grid.parse_value(config, field, text) for text in args.values]
      baseline = (
        None
        if args.baseline is None
        else sweep_grid.parse_value(config, field, args.baseline, '--baseline')
      )
    sweep_grid.check_values(values)
    seeds = args.seeds
    baseline = values[0] if baseline is None else baseline
    if baseline not in values:
      raise ValueError(f'--baseline={args.baseline} is not one of --values')
    evaluations = sweep_grid.parse_evaluations(config, args.evaluations or ())
    sweep_grid.check_evaluations(field, evaluations)
    check_sweep(config, field, values, seeds, metric, variant_of, evaluations)
    breakdowns = []
    for kind, edges in (
      (breakdown.SOURCE_LENGTH, args.by_source_length),
      (breakdown.SOURCE_PIECES, args.by_source_pieces),
      (breakdown.POSITION, args.by_position),
    ):
      if edges:
        if metric != kind.metric:
          raise ValueError(f'{kind.flag} needs a sweep of {kind.metric}, not {metric}')
        breakdown.buckets(edges, kind)
        breakdowns.append((kind, edges))
    if args.print_only:
      sweep_grid.check_root(root, field)
      print(
        '\n'.join(
          sweep_grid.commands(config_arg, overrides, root, field, values, seeds, evaluations)
        )
      )
      return
    sweep(
      config,
      root,
      field,
      values,
      seeds,
      metric,
      baseline,
      train=not args.collect_only,
      variant_of=variant_of,
      breakdowns=breakdowns,
      evaluations=evaluations,
      command=shlex.join(['python', '-m', 'relpos.studies.sweep', *sys.argv[1:]]),
    )
  except PreemptedError as stopped:  # SIGTERM, Ctrl-C: the run in progress saved a checkpoint
    print(f'{stopped} (the sweep command resumes it and skips finished runs)', file=sys.stderr)
    sys.exit(stopped.exit_code)
  except cli.FAULTS as fault:  # a full disk, a workdir of another task, out of memory
    cli.exit_for_fault(fault)
  except OSError as error:  # the sweep's own files: one line, as train.py's (exit 74)
    fault = root_write_fault(error, root, resume=not args.collect_only)
    if fault is not None:
      cli.exit_for_fault(fault)
    if not isinstance(error, cli.USER_ERRORS):
      raise
    print(f'error: {error}', file=sys.stderr)
    sys.exit(1)
  except cli.USER_ERRORS as error:
    sys.exit(f'error: {error}')


def define_flags():
  """The command-line flags (defined only when run as a program, so importing is free)."""
  config_flags.DEFINE_config_file('config', None, 'Experiment config file.')
  flags.DEFINE_string('workdir', None, 'Root directory; one subdirectory per value and seed.')
  flags.DEFINE_string(
    'field', 'model.max_relative_position', "Config field to sweep, or 'preset' (the file's)."
  )
  flags.DEFINE_list('values', '0,1,2,4,16,64', 'Values of the field, comma-separated.')
  flag_types.define_int_list(
    'seeds',
    '0',
    'Seeds (config.seed) to train each value with.',
    minimum=0,
    maximum=checks.SEED_MAX,
    distinct=True,
  )
  flags.DEFINE_string('baseline', None, 'The value p-values are against (default: the first).')
  flags.DEFINE_string('metric', None, "Result to tabulate (default: the task's, bleu or bpc).")
  flags.DEFINE_bool('print_only', False, 'Print the commands, run nothing.')
  flags.DEFINE_bool('collect_only', False, 'Tabulate finished runs, run nothing.')
  flags.DEFINE_list(
    'by_source_length', None, 'Also BLEU per bucket of source words, e.g. 4,6,8 (translation).'
  )
  flags.DEFINE_list(
    'by_source_pieces',
    None,
    "Also BLEU per bucket of source pieces (the run's vocabulary), e.g. 8,16,32 (translation).",
  )
  flags.DEFINE_list(
    'evaluations',
    None,
    'Also score every model at these config.eval settings, e.g. tgt_len=128,tgt_len=64+mem_len=64.',
  )
  flags.DEFINE_list(
    'by_position', None, 'Also bpc per bucket of position in the segment, e.g. 1,4,8,16,32.'
  )
  flags.mark_flag_as_required('config')


if __name__ == '__main__':
  runtime.apply_defaults()  # relpos's allocator (re-executes), as train.py
  define_flags()
  app.run(main, flags_parser=command_line.parse_flags)
