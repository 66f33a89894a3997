"""The task of a config (`get`: config.task names it in the registry `relpos.config.TASKS`) and
the launcher train.py and eval.py share (`launch`; `eval_command`, the eval.py command a training
run names to score it).

What every command shares (the exit policy, `run_main` for the other commands) is `relpos.cli`;
the parsing of --config and its diagnosis, `relpos.config.command_line`; joining
jax.distributed, `relpos.training.distributed`.
"""

import contextlib
import importlib
import shlex
import sys
from pathlib import Path

import ml_collections
from absl import app, flags
from ml_collections import config_flags

from relpos.cli import FAULTS, USER_ERRORS, exit_for_fault, start_command
from relpos.config import TASKS, no_task_line, run_file
from relpos.config.command_line import config_arg, config_overrides, home_expanded, parse_flags
from relpos.config.recorded import CONFIG_FILE
from relpos.signals import PreemptedError, finish_quietly, stop_at_signals
from relpos.training import distributed
from relpos.training.run_config import check_output_dir, not_a_run
from relpos.training.task_base import Task
from relpos.training.workdir_setup import stopped_evaluation


def get(config: ml_collections.ConfigDict, config_file: str | None = None) -> Task:
  """The `relpos.training.task_base.Task` config.task names; a config of no task is a
  ValueError with `relpos.config.no_task_line`'s line (naming --config=`config_file`, where
  the caller has it)."""
  refusal = no_task_line(config, config_file)
  if refusal is not None:
    raise ValueError(refusal)
  return importlib.import_module(TASKS[config.task].task_module).TASK


def eval_command(argv: list[str], workdir) -> str:
  """The eval.py command that scores the run `argv` (a train.py command line) trains in
  `workdir`: train.py's --config and --config.<field> overrides, each argument quoted for the
  shell where it needs it."""
  config = config_arg(argv)
  args = [
    'python',
    str(Path(argv[0]).with_name('eval.py')),
    *([f'--config={config}'] if config else []),
    *config_overrides(argv),
    f'--workdir={workdir}',
  ]
  return ' '.join(shlex.quote(arg) for arg in args)


def with_run_config(argv: list[str]) -> list[str]:
  """`argv`, an eval.py command line, with `--config=<run_file>:<workdir>` added
  (`relpos.config.run_file`: the run's own recorded config) where it gives a --workdir that
  holds a run's config.json and no --config; else `argv` as it is."""
  if config_arg(argv) is not None:
    return argv
  workdir = None
  for i, arg in enumerate(argv):
    if arg.startswith('--workdir='):
      workdir = arg.removeprefix('--workdir=')
    elif arg == '--workdir' and i + 1 < len(argv):
      workdir = argv[i + 1]
  if not workdir or not (Path(home_expanded(workdir)) / CONFIG_FILE).is_file():
    return argv
  # First: ml_collections takes a --config.<field> override only after --config.
  return [argv[0], f'--config={run_file.__file__}:{home_expanded(workdir)}', *argv[1:]]


def launch(action: str):
  """Parses --config and --workdir, runs the config's task `action`, prints the result.

  `action` is 'train_and_evaluate' (which also takes --allow_config_change) or 'evaluate'
  (which also takes --output_dir, where eval_results.json and translations go). A
  USER_ERRORS exception ends the run with `error: <message>` and exit code 1, without a
  traceback unless --traceback is given; SIGTERM or a first Ctrl-C during training saves a
  checkpoint and exits with 128 + the signal's number (`PreemptedError.exit_code`); during
  the evaluation (train.py's after training, eval.py's) either ends it at once with one line
  saying what is kept and how to score the run (`relpos.signals.stop_at_signals`); either
  elsewhere ends it at once in one line (`relpos.signals.stop_at_ctrl_c_or_sigterm`), but for
  after the result is written: printing it and exiting, where a signal ends nothing that is
  not done (`relpos.signals.finish_quietly`: SIGTERM is ignored, Ctrl-C exits 0). With
  --distributed, every process runs the same command (its own --process_id) and
  jax.distributed is initialised before anything touches a device.
  """
  config = config_flags.DEFINE_config_file('config', None, 'Experiment config file.')
  workdir = flags.DEFINE_string('workdir', None, 'Directory for checkpoints and metrics.')
  show_traceback = flags.DEFINE_bool(
    'traceback', False, 'Show the traceback of config/data errors.'
  )
  initialize_distributed = distributed.define_flags()
  kwargs = {}
  if action == 'train_and_evaluate':
    allow_change = flags.DEFINE_bool(
      'allow_config_change', False, 'Continue a run in --workdir with a different config.'
    )
  else:
    output_dir = flags.DEFINE_string(
      'output_dir', None, 'Where eval_results.json (and translations) go; default --workdir.'
    )
  # eval.py without --config evaluates with the run's own (`with_run_config`).
  flags.mark_flags_as_required(['config', 'workdir'] if action != 'evaluate' else ['workdir'])
  # `train.py --help` lists the key flags of the program (sys.argv[0]); these are defined here.
  for flag in flags.FLAGS.flags_by_module_dict().get(__name__, []):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)

  def main(argv):
    start_command(argv)
    initialize_distributed()
    if action == 'train_and_evaluate':
      kwargs['allow_config_change'] = allow_change.value
      kwargs['score_command'] = eval_command(sys.argv, workdir.value)
      signals = contextlib.nullcontext()  # training saves on them; its evaluation stops
    else:
      kwargs['output_dir'] = output_dir.value
    if config.value is None:  # eval.py, where --workdir holds no run's config (`with_run_config`)
      given = f'--workdir={workdir.value}'
      line = not_a_run(workdir.value, given) or (
        f'--config is missing, and {given} holds no run (its {CONFIG_FILE}) to evaluate with '
        'its own config: give the config it trained with'
      )
      sys.exit(f'error: {line}')
    try:
      if action == 'evaluate':  # before anything is read: nothing there it would destroy
        check_output_dir(kwargs['output_dir'], workdir.value)
        # Its line is told as the signal comes, from what is on disk then.
        signals = stop_at_signals(stopped_evaluation(Path(kwargs['output_dir'] or workdir.value)))
      task = get(config.value, config_arg(sys.argv))
      with signals:
        result = getattr(task, action)(config.value, workdir.value, **kwargs)
      finish_quietly()  # written (or kept): a signal now fails nothing (its docstring)
    except PreemptedError as stopped:
      print(stopped, file=sys.stderr)
      sys.exit(stopped.exit_code)
    except FAULTS as fault:
      if show_traceback.value:
        raise
      exit_for_fault(fault, silence_full_disk=True)
    except USER_ERRORS as error:
      if show_traceback.value:
        raise
      sys.exit(f'error: {error}')  # one line; --traceback (docs/faults.md) shows where
    print('\n'.join(task.result_lines(result)))

  if action == 'evaluate':
    sys.argv = with_run_config(sys.argv)
  app.run(main, flags_parser=parse_flags)
