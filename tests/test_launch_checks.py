"""What train.py, eval.py and the sweep check before anything else, each refusal one line: a
config file that lacks a field or a section, an empty path flag, a sweep's root or an
evaluation's directory given as a run's workdir, a config file that does not load, a fault of
the sweep's own files."""

import builtins
import errno
import io
import json
import os
from pathlib import Path

import pytest
from helpers import REPO, call_absl_main, load_config, one_error_line, run_sweep_main

from relpos.config import command_line
from relpos.training import loop, task_base, tasks, workdir_lock, workdir_setup


def _incomplete(name: str):
  """char_tiny's config without `name` (a field, dotted, or a whole section)."""
  config = load_config('char_tiny', 'shaw')
  *sections, last = name.split('.')
  node = config
  for section in sections:
    node = node[section]
  del node[last]
  return config


@pytest.mark.parametrize(
  ('name', 'message'),
  [
    ('train.steps', 'config.train.steps is missing from the config'),
    ('eval', 'config.eval is missing from the config'),
    ('model', 'config.model is missing from the config'),
  ],
)
def test_a_config_lacking_a_field_is_named_before_any_other_check(tmp_path, name, message):
  """Before, train.py's evaluation plan read config.train.steps first: an AttributeError."""
  config = _incomplete(name)
  task = tasks.get(config)
  with pytest.raises(ValueError, match=message):
    task.train_and_evaluate(config, tmp_path / 'run')
  with pytest.raises(ValueError, match=message):
    task.evaluate(config, tmp_path / 'run')
  assert not (tmp_path / 'run').exists()


def test_a_sweep_of_a_config_lacking_a_field_names_it(tmp_path, monkeypatch):
  """Before, the sweep's --field read config.model first: 'the config has no section'."""
  config_file = tmp_path / 'only_task.py'
  config_file.write_text(
    'import ml_collections\n\n\ndef get_config():\n'
    "  return ml_collections.ConfigDict({'task': 'char_lm'})\n"
  )
  code = run_sweep_main(
    monkeypatch, f'--config={config_file}', f'--workdir={tmp_path / "sweep"}', '--values=2'
  )
  assert code == 'error: config.seed is missing from the config'
  assert not (tmp_path / 'sweep').exists()


CHAR_TINY = REPO / 'configs' / 'char_tiny.py'


@pytest.mark.parametrize(
  ('argv', 'flag'),
  [
    (['train.py', f'--config={CHAR_TINY}', '--workdir='], '--workdir='),
    (
      ['eval.py', f'--config={CHAR_TINY}', '--workdir=runs/x', '--output_dir='],
      '--output_dir=',
    ),
    (['relpos/tools/sample.py', '--workdir='], '--workdir='),
    (['relpos/tools/translate.py', '--workdir=', '--text=a'], '--workdir='),
    (['relpos/studies/sweep.py', f'--config={CHAR_TINY}', '--workdir='], '--workdir='),
    (['relpos/studies/plot.py', 'runs/x', '--out='], '--out='),
    (['relpos/studies/plot.py', ''], 'a workdir given is empty'),
    (['relpos/studies/shaw_tables.py', ''], 'a workdir given is empty'),
  ],
)
def test_an_empty_path_is_refused_not_read_as_the_current_directory(commands, tmp_path, argv, flag):
  """Before, `train.py --workdir=` trained a whole run into the current directory and
  `eval.py --output_dir=` wrote eval_results.json there."""
  argv = [str(REPO / argv[0]) if argv[0].endswith('.py') else argv[0], *argv[1:]]
  line = one_error_line(commands.run(argv, cwd=tmp_path, timeout=120))
  assert line.startswith(f'error: {flag}'), line
  assert list(tmp_path.iterdir()) == []


def _sweep_root_and_evaluation(tmp_path):
  """A sweep's root (a run folder and sweep.csv) and an evaluation's output directory."""
  root = tmp_path / 'sweep'
  (root / 'model.max_relative_position=2' / 'seed=0').mkdir(parents=True)
  (root / 'sweep.csv').write_text('value,n\n')
  evaluation = tmp_path / 'scored'
  evaluation.mkdir()
  checkpoint = tmp_path / 'run' / 'checkpoints' / '10'
  (evaluation / 'eval_results.json').write_text(f'{{"checkpoint": "{checkpoint}", "bpc": 2.0}}')
  return root, evaluation


def test_train_and_eval_refuse_a_sweeps_root_or_an_evaluations_directory(tmp_path):
  """Before, eval.py said 'train first (python train.py ... --workdir=<sweep root>)', and
  train.py trained into the sweep's root, mixing a run into it."""
  root, evaluation = _sweep_root_and_evaluation(tmp_path)
  config = load_config('char_tiny', 'shaw')
  config.data.path = str(tmp_path / 'absent.txt')  # without the check: refused, not trained
  task = tasks.get(config)
  sweep_line = f'--workdir={root} is the root of a sweep, not a run: give its run directories'
  evaluation_line = f'--workdir={evaluation} holds only an evaluation'
  for directory, line in ((root, sweep_line), (evaluation, evaluation_line)):
    with pytest.raises(ValueError, match='a new run needs a directory of its own') as refused:
      task.train_and_evaluate(config, directory)
    assert str(refused.value).startswith(line)
    with pytest.raises(FileNotFoundError) as refused:
      task.evaluate(config, directory)
    assert str(refused.value).startswith(line)
  assert sorted(path.name for path in root.iterdir()) == [
    'model.max_relative_position=2',
    'sweep.csv',
  ]
  assert [path.name for path in evaluation.iterdir()] == ['eval_results.json']


def test_eval_py_without_config_names_what_the_directory_holds(commands, tmp_path):
  """eval.py without --config reads the run's recorded config; given a sweep's root or an
  evaluation's directory it said '--config is missing, ... give the config it trained with',
  which would not have helped: now the line of what the directory is, as with --config."""
  root, evaluation = _sweep_root_and_evaluation(tmp_path)
  for directory, line in (
    (root, f'error: --workdir={root} is the root of a sweep, not a run: give its run directories'),
    (evaluation, f'error: --workdir={evaluation} holds only an evaluation (eval_results.json)'),
    (tmp_path / 'empty', f'error: --config is missing, and --workdir={tmp_path}/empty holds no'),
  ):
    assert one_error_line(commands.run(['eval.py', f'--workdir={directory}'])).startswith(line)


class _StartedError(Exception):
  """Raised where a run would restore its checkpoint: the warnings of its start were said."""


def test_the_warmup_warning_comes_once_after_the_data_loaded(tmp_path, monkeypatch, capsys):
  """Before, train.py warned of the warmup, then refused to start for missing data; and a
  sweep printed the same line for every run."""

  config = load_config('char_tiny', 'shaw')
  config.data.path = str(tmp_path / 'absent.txt')
  config.optim.warmup_steps = config.train.steps  # the learning rate never peaks: a warning
  task = tasks.get(config)
  with pytest.raises(FileNotFoundError, match='absent.txt'):
    task.train_model(config, tmp_path / 'no_data')
  assert 'warning' not in capsys.readouterr().err

  def started(*args, **kwargs):
    raise _StartedError

  monkeypatch.setattr(
    task, 'training', lambda *args: task_base.Training(None, {}, None, None, None)
  )
  monkeypatch.setattr(loop, 'Checkpoints', started)
  for run in ('k=2/seed=0', 'k=8/seed=0'):  # a sweep's runs, in one process
    with pytest.raises(_StartedError):
      task.train_model(config, tmp_path / run)
  assert capsys.readouterr().err.count('warning: config.optim.warmup_steps=') == 1


def _finished_sweep(root):
  """A finished one-run sweep of char_tiny:shaw's k=2 under `root` (its eval_results.json)."""
  run = root / 'max_relative_position=2' / 'seed=0'
  run.mkdir(parents=True)
  segments = [1.0 + 0.01 * (i % 5) for i in range(40)]
  results = {'bpc': 2.0, 'step': 10, 'segment_nats': segments, 'segment_tokens': [8] * 40}
  (run / 'eval_results.json').write_text(json.dumps(results))


def _sweep_args(root, *more):
  return (
    '--config=configs/char_tiny.py:shaw',
    '--config.train.steps=10',
    f'--workdir={root}',
    '--values=2',
    *more,
  )


def _writing_under(monkeypatch, root: Path, opened) -> None:
  """Every open for writing of a file under `root` whose name holds 'sweep' (the sweep's own
  files, not the runs') returns `opened(file, the real open's stream)`, through builtins.open
  and io.open (pathlib's)."""
  real_open = builtins.open

  def open_for(file, mode='r', *args, **kwargs):
    writing = isinstance(file, str | os.PathLike) and any(flag in mode for flag in 'wax+')
    if writing and root in Path(file).parents and 'sweep' in Path(file).name:
      return opened(file, lambda: real_open(file, mode, *args, **kwargs))
    return real_open(file, mode, *args, **kwargs)

  monkeypatch.setattr(builtins, 'open', open_for)
  monkeypatch.setattr(io, 'open', open_for)


def test_a_read_only_sweep_root_is_the_exit_74_line(tmp_path, monkeypatch, capsys):
  """Before, the sweep's lock and its tables raised OSError tracebacks on a read-only
  filesystem (Errno 30: .relpos.lock, sweep.csv)."""
  root = tmp_path / 'sweep'
  _finished_sweep(root)

  def read_only(file, real_open):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(file))

  _writing_under(monkeypatch, root, read_only)
  code = run_sweep_main(monkeypatch, *_sweep_args(root, '--collect_only'))
  assert code == 74
  assert capsys.readouterr().err.strip().splitlines()[-1] == (
    f"error: cannot write {root / 'sweep.csv'} (the sweep's --workdir={root}): Read-only file "
    f'system (the filesystem is read-only); the finished runs under {root} are intact; make it '
    'writable, then rerun (--collect_only writes its tables into the root it reads the runs '
    'from)'
  )

  real_os_open = os.open

  def read_only_os_open(path, flags, *args):
    if Path(path).name != workdir_lock.LOCK_FILE:  # the root's write probe passes
      return real_os_open(path, flags, *args)
    raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

  monkeypatch.setattr(workdir_lock.os, 'open', read_only_os_open)
  assert run_sweep_main(monkeypatch, *_sweep_args(root)) == 74
  line = capsys.readouterr().err.strip().splitlines()[-1]
  assert line.startswith(f"error: cannot write {root / '.relpos.lock'} (the sweep's --workdir=")


@pytest.mark.parametrize('collect_only', [True, False])
def test_a_sweep_root_that_takes_no_files_names_the_sweeps_first_write(
  tmp_path, monkeypatch, capsys, collect_only
):
  """A read-only root failed the write probe with train.py's words: 'cannot write to
  --workdir=<root> before training ... rerun the same command to resume', also for
  --collect_only, which trains nothing and only writes its tables there (and which another
  --workdir would not help: the runs are in this one). Now the sweep's line names the file it
  writes first (its lock, or its table), with --collect_only's own remedy."""
  root = tmp_path / 'sweep'
  _finished_sweep(root)

  def read_only(directory):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(directory))

  monkeypatch.setattr(workdir_setup, 'check_takes_files', read_only)
  more = ('--collect_only',) if collect_only else ()
  assert run_sweep_main(monkeypatch, *_sweep_args(root, *more)) == 74
  first = root / ('sweep.csv' if collect_only else '.relpos.lock')
  todo = (
    'make it writable, then rerun (--collect_only writes its tables into the root it reads the '
    'runs from)'
    if collect_only
    else 'make it writable or give another --workdir, then rerun the same command to resume'
  )
  assert capsys.readouterr().err.strip().splitlines()[-1] == (
    f"error: cannot write {first} (the sweep's --workdir={root}): Read-only file system (the "
    f'filesystem is read-only); the finished runs under {root} are intact; {todo}'
  )


class _FullAtClose:
  """A file whose data never reaches the disk: its close (a buffered file's flush) raises
  ENOSPC naming no file, as a full disk does."""

  def __init__(self, stream):
    self._stream = stream

  def __getattr__(self, name):
    return getattr(self._stream, name)

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()

  def close(self):
    self._stream.close()
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize('name', ['sweep.csv', 'sweep.md', 'sweep.png'])
def test_a_full_disk_met_at_a_sweep_files_close_names_that_file(
  tmp_path, monkeypatch, capsys, name
):
  """--collect_only on a full disk named the sweep's root: the error came at the file's close,
  which names no file."""
  root = tmp_path / 'sweep'
  _finished_sweep(root)

  def full_at_close(file, real_open):
    stream = real_open()
    return _FullAtClose(stream) if Path(file).name.lstrip('.').startswith(name) else stream

  _writing_under(monkeypatch, root, full_at_close)
  assert run_sweep_main(monkeypatch, *_sweep_args(root, '--collect_only')) == 74
  assert capsys.readouterr().err.strip().splitlines()[-1] == (
    f"error: cannot write {root / name} (the sweep's --workdir={root}): No space left on device "
    f'(the disk is full); the finished runs under {root} are intact; free space on its disk, '
    'then rerun'
  )


def test_a_full_disk_writing_the_sweeps_lock_is_the_exit_74_line(tmp_path, monkeypatch, capsys):
  """Before: OSError [Errno 28] from workdir_lock's pwrite, a traceback."""

  def full_disk(*args):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  root = tmp_path / 'sweep'
  _finished_sweep(root)
  monkeypatch.setattr(workdir_lock.os, 'pwrite', full_disk)
  assert run_sweep_main(monkeypatch, *_sweep_args(root)) == 74
  assert capsys.readouterr().err.strip().splitlines()[-1] == (
    f"error: cannot write {root / '.relpos.lock'} (the sweep's --workdir={root}): No space left "
    f'on device (the disk is full); the finished runs under {root} are intact; free space on '
    'its disk, then rerun the same command to resume'
  )


def _a_file(runs: Path) -> tuple[Path, int, str]:
  root = runs / 'sweep'
  root.write_text('notes')
  return root, 74, f'--workdir={root} is a file, not a directory; nothing was written'


def _a_dangling_link(runs: Path) -> tuple[Path, int, str]:
  root = runs / 'sweep'
  root.symlink_to(runs / 'unmounted')
  return (
    root,
    1,
    (
      f'--workdir={root}: it is a symbolic link to {runs / "unmounted"}, which does not exist: '
      'mount it or point the link elsewhere'
    ),
  )


def _under_a_file(runs: Path) -> tuple[Path, int, str]:
  (runs / 'sweep').write_text('notes')
  root = runs / 'sweep' / 'k'
  return root, 74, f'cannot write to --workdir={root} before training: Not a directory'


@pytest.mark.parametrize('collect_only', [False, True])
@pytest.mark.parametrize('place', [_a_file, _a_dangling_link, _under_a_file])
def test_a_sweep_root_that_cannot_be_a_directory_is_one_line(
  tmp_path, monkeypatch, capsys, place, collect_only
):
  """Before, FileExistsError or NotADirectoryError tracebacks from the root's mkdir; now the
  lines train.py gives its workdir: a file in its place or above it exit 74
  (`workdir_setup.prepare_workdir`), a dangling link named with its target
  (`run_config.check_path`), and nothing is made."""
  runs = tmp_path / 'runs'
  runs.mkdir()
  root, status, expected = place(runs)
  more = ('--collect_only',) if collect_only else ()
  code = run_sweep_main(monkeypatch, *_sweep_args(root, *more))
  err = capsys.readouterr().err
  assert 'Traceback' not in err
  # Exit 74 prints its line; exit 1 is sys.exit(line), which Python prints (status 1).
  line = err.strip().splitlines()[-1] if status == 74 else code
  assert code == status if status == 74 else isinstance(code, str)
  assert line.startswith(f'error: {expected}')
  assert [p.name for p in runs.iterdir()] == ['sweep']  # nothing else made


def test_config_files_that_do_not_load_are_one_line(commands, tmp_path):
  """Before: two absl warning lines and 'IllegalFlagValueError: flag --config=None' for a
  get_config() returning None; 'TypeError: get_config() takes 0 positional arguments' for a
  preset of a file without presets; "NameError: name 'null' is not defined" for a run's
  config.json; '--config: the config did not load' for a dict returned."""
  returns_none = tmp_path / 'returns_none.py'
  returns_none.write_text('def get_config():\n  pass\n')
  recorded = tmp_path / 'config.json'
  recorded.write_text('{\n  "seed": 0,\n  "data": {"max_bytes": null}\n}\n')
  no_presets = REPO / 'configs' / 'enwik8_base.py'
  returns_dict = tmp_path / 'returns_dict.py'
  returns_dict.write_text("def get_config():\n  return {'task': 'translate'}\n")
  returns_list = tmp_path / 'returns_list.py'
  returns_list.write_text('def get_config():\n  return [1, 2]\n')
  cases = [
    (returns_none, f'{returns_none}: get_config() returned None, not an ml_collections.ConfigDict'),
    # They were '--config: the config did not load' and AttributeError: 'list' object has no ...
    (returns_dict, f'{returns_dict}: get_config() returned a dict, not an ml_collections.'),
    (returns_list, f'{returns_list}: get_config() returned a list, not an ml_collections.'),
    (f'{no_presets}:shaw', f'{no_presets} has no presets (its get_config() takes no argument)'),
    (recorded, f'{recorded} is no config file: --config takes a config .py file'),
  ]
  for config, message in cases:
    argv = [REPO / 'train.py', f'--config={config}', f'--workdir={tmp_path / "run"}']
    line = one_error_line(commands.run(argv, timeout=120))
    assert line.startswith(f'error: --config={config}: {message}'), line
  assert not (tmp_path / 'run').exists()


def _parse(monkeypatch, *args) -> tuple[object, object]:
  """(the exit code, the parsed config) of the command line `train.py args` as the launchers
  parse it (command_line.parse_flags): the code is the `error: ...` line of a refused one, else
  None."""
  import sys

  from ml_collections import config_flags

  parsed = {}
  argv = ['train.py', *args]
  monkeypatch.setattr(sys, 'argv', argv)  # ml_collections takes the overrides from there

  def define():
    parsed['flag'] = config_flags.DEFINE_config_file('config', None, '')

  def main(argv):
    parsed['config'] = parsed['flag'].value

  return call_absl_main(define, main, argv, command_line.parse_flags), parsed.get('config')


def _parsed_config(monkeypatch, *overrides, config=CHAR_TINY):
  """char_tiny's config (or that of the --config value `config`) as the launchers parse it
  with `overrides` (command_line.parse_flags)."""
  code, config = _parse(monkeypatch, f'--config={config}', *overrides)
  assert code is None
  return config


def _parse_error(monkeypatch, *args) -> str:
  """The `error: ...` line that parsing `train.py args` exits with."""
  code, _ = _parse(monkeypatch, *args)
  assert isinstance(code, str), code
  return code


def test_a_repeated_config_is_refused_naming_both(monkeypatch, tmp_path):
  """A launch script's --config and the user's own after it: absl used the last, the lines
  that name the file the first, so a second file that raised was its bare exception
  ("error: 'missing'"), and an override beside two valid files absl's 'flag is defined
  twice'."""
  raises = tmp_path / 'raises.py'
  raises.write_text("def get_config():\n  return {}['missing']\n")
  expected = f'error: --config is given more than once ({CHAR_TINY}, {raises}): give one'
  assert _parse_error(monkeypatch, f'--config={CHAR_TINY}', '--config', str(raises)) == expected
  assert _parse_error(
    monkeypatch, f'--config={CHAR_TINY}:shaw', '--config.train.steps=5', f'--config={CHAR_TINY}'
  ) == (f'error: --config is given more than once ({CHAR_TINY}:shaw, {CHAR_TINY}): give one')


def test_an_optional_field_can_be_set_back_to_none(monkeypatch):
  """Before: `--config.data.max_bytes=None` was 'invalid literal for int()' wherever the file
  set the field to a number, and the text 'None' for an optional text field."""
  config = _parsed_config(monkeypatch, '--config.data.max_bytes=100')
  assert config.data.max_bytes == 100
  for overrides in (
    ['--config.data.max_bytes=100', '--config.data.max_bytes=None'],
    ['--config.data.max_bytes=100', '--config.data.max_bytes', 'None'],
  ):
    assert _parsed_config(monkeypatch, *overrides).data.max_bytes is None
  # The last override wins, as ever.
  overrides = ['--config.data.max_bytes=None', '--config.data.max_bytes=7']
  assert _parsed_config(monkeypatch, *overrides).data.max_bytes == 7


def test_a_home_alone_or_leading_a_path_is_expanded_and_nothing_else():
  """`--workdir=~` is the home directory, as `~/x` is under it; `~x` (another user's home, or a
  name) and a `~` inside a path are left as typed."""
  home = os.path.expanduser('~')
  assert command_line.home_expanded('~') == home
  assert command_line.home_expanded('~/runs/x') == os.path.join(home, 'runs/x')
  for kept in ('~root/runs', '~runs', 'runs/~/x', 'x~', ''):
    assert command_line.home_expanded(kept) == kept


def test_a_home_in_the_config_file_and_its_path_fields_is_expanded(monkeypatch, tmp_path):
  """The shell expands `~` only at the start of a word: `--config=~/x.py` was 'does not
  exist', and `--config.data.path=~/a.txt` (or a config file's own `~/...`) was looked for
  under a directory named `~`. --config's file and every field declared a path
  (`fields.paths`) are expanded as the launchers, show_config and the sweep parse them."""
  from relpos.config import fields
  from relpos.config.char_lm_defaults import CharLMConfig
  from relpos.config.translation_defaults import TranslationConfig

  assert fields.paths(CharLMConfig) == ['data.path']
  assert fields.paths(TranslationConfig) == [
    'data.tfds_data_dir',
    'data.train_src',
    'data.train_tgt',
    'data.eval_src',
    'data.eval_tgt',
  ]
  monkeypatch.setenv('HOME', str(tmp_path))
  (tmp_path / 'char.py').write_text(CHAR_TINY.read_text())
  config = _parsed_config(monkeypatch, '--config.data.path=~/a.txt', config='~/char.py:shaw')
  assert (config.data.path, config.model.position) == (str(tmp_path / 'a.txt'), 'shaw')
  (tmp_path / 'translate.py').write_text(
    'from relpos.config.translation_defaults import translate_config\n\n\n'
    'def get_config():\n'
    '  config = translate_config()\n'
    "  config.data.update(kind='text', train_src='~/train.en', source_lang='~/en')\n"
    '  return config\n'
  )
  config = _parsed_config(monkeypatch, '--config.data.eval_tgt=~/eval.de', config='~/translate.py')
  assert (config.data.train_src, config.data.eval_tgt) == (
    str(tmp_path / 'train.en'),
    str(tmp_path / 'eval.de'),
  )
  # Not a path field, and not set: left as they are.
  assert (config.data.source_lang, config.data.tfds_data_dir) == ('~/en', None)
  expanded = command_line.config_arg(['sweep', '--config', '~/translate.py'])
  assert expanded == str(tmp_path / 'translate.py')


@pytest.mark.parametrize(
  ('names', 'message'),
  [
    (['wikitext'], "unknown corpus 'wikitext': this prepares tatoeba or enwik8"),
    ([], 'name the corpus to prepare (tatoeba or enwik8)'),
    (['tatoeba', 'enwik8'], 'name one corpus to prepare (tatoeba or enwik8), not tatoeba enwik8'),
  ],
)
def test_prepare_names_an_unknown_corpus(names, message):
  """Before, `prepare wikitext` said 'name the corpus to prepare', though one was named."""
  from relpos.data import prepare  # noqa: PLC0415 (defines the command's absl flags)

  with pytest.raises(SystemExit) as stopped:
    prepare.main(['prepare', *names])
  assert str(stopped.value).startswith(f'error: {message}')


def test_train_py_and_the_sweep_take_the_same_oserrors_for_write_faults(tmp_path):
  """train.py (`loop.train`) and the sweep (`sweep.root_write_fault`) each had their own rule of
  which OSErrors are the exit-74 line of a write into their directory, and they differed: a
  full disk met writing outside it, and a read-only filesystem whose error names a file
  outside it or none, were train.py's fault line and, for the sweep, reported as they were (an
  OSError traceback). One rule now (`relpos.faults.is_write_fault`, an evaluation's too); the one
  difference left is deliberate: an error of a file under the sweep's root that is not an
  unwritable one (a missing file) may be a read of its runs' files, so the sweep reports it as
  it is."""
  from relpos.faults import error_path, is_write_fault
  from relpos.studies import sweep

  root = tmp_path / 'root'
  root.mkdir()
  inside, outside = root / 'sweep.csv', tmp_path / 'elsewhere' / 'file'
  cases = {  # (errno, file named): (train.py's fault, the sweep's fault)
    (errno.ENOSPC, inside): (True, True),
    (errno.ENOSPC, outside): (True, True),
    (errno.EDQUOT, None): (True, True),
    (errno.EROFS, None): (True, True),
    (errno.EROFS, outside): (True, True),
    (errno.EACCES, inside): (True, True),
    (errno.EPERM, outside): (False, False),
    (errno.ENOENT, inside): (True, False),
    (errno.ENOTDIR, outside): (False, False),
  }
  for (number, path), expected in cases.items():
    error = OSError(number, os.strerror(number), *([str(path)] if path else []))
    train_fault = is_write_fault(error, root, error_path(error))  # what loop.train asks
    sweep_fault = sweep.root_write_fault(error, root, resume=True) is not None
    assert (train_fault, sweep_fault) == expected, (errno.errorcode[number], path)


def test_a_config_file_setting_a_field_of_another_type_names_the_field_and_line(
  monkeypatch, tmp_path
):
  """Before: 'raised TypeError: 20.0 is of original type <class 'float'> and cannot be casted
  to type <class 'int'>', naming no field and no line (ml_collections raises its cast error
  again from the file's line, so the innermost error's traceback held only its frames)."""
  wrong = tmp_path / 'wrong_type.py'
  for setting, field, given in [
    ('c.train.steps = 20.0', 'config.train.steps', '20.0 (float)'),
    ("c.train.update(steps='20')", 'config.train.steps', '20 (str)'),
    ('t = c.train; t.steps = 2.0', "field 'steps'", '2.0 (float)'),  # no dotted name to read
  ]:
    wrong.write_text(
      'from pathlib import Path\n'
      'from relpos.config import load_config_file\n\n\n'
      'def get_config():\n'
      f"  c = load_config_file(Path('{CHAR_TINY}'), 'shaw')\n"
      f'  {setting}\n'
      '  return c\n'
    )
    assert _parse_error(monkeypatch, f'--config={wrong}') == (
      f'error: --config={wrong}: {wrong} line 7: {field} takes an int, not {given}'
    )


def test_switching_config_task_by_a_flag_is_refused_naming_it(monkeypatch):
  """`--config.task=translate` on a character LM's file was 'config.data.tfds_name is missing
  from the config', naming neither the flag nor the file; the file's own task passes."""
  translate_tiny = REPO / 'configs' / 'translate_tiny.py'
  assert _parse_error(monkeypatch, f'--config={CHAR_TINY}', '--config.task=translate') == (
    f'error: --config.task=translate: config.task cannot be switched by a flag (each task has '
    f"its own fields): --config={CHAR_TINY} builds a 'char_lm' config; give a config file of "
    "task 'translate', such as configs/translate_tiny.py"
  )
  line = _parse_error(monkeypatch, f'--config={translate_tiny}', '--config.task', 'char_lm')
  assert line.endswith("give a config file of task 'char_lm', such as configs/char_tiny.py")
  assert _parsed_config(monkeypatch, '--config.task=char_lm').task == 'char_lm'


def test_a_config_file_imports_a_module_beside_it(monkeypatch, tmp_path):
  """A config file loaded from its path could not import a helper beside it ('raised
  ModuleNotFoundError at line 1: No module named ...'), as a script can: its directory is
  importable while it loads, at the end of sys.path, and taken off again afterwards."""
  import sys

  from relpos.config import load_config_file

  (tmp_path / 'shared_helper_15c.py').write_text(
    'from pathlib import Path\n'
    'from relpos.config import load_config_file\n\n\n'
    'def base(preset):\n'
    f"  return load_config_file(Path('{CHAR_TINY}'), preset)\n"
  )
  (tmp_path / 'mine.py').write_text(
    "from shared_helper_15c import base\n\n\ndef get_config(preset='xl'):\n  return base(preset)\n"
  )
  path_before = list(sys.path)
  config = _parsed_config(monkeypatch, config=f'{tmp_path / "mine.py"}:rope')
  assert config.model.position == 'rope'
  assert sys.path == path_before
  del sys.modules['shared_helper_15c']  # imported again from the file below
  assert load_config_file(tmp_path / 'mine.py', 'shaw').model.position == 'shaw'
  assert sys.path == path_before
  sys.modules.pop('shared_helper_15c', None)
