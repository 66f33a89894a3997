"""relpos.runtime: the allocator re-execution and the compilation cache variables; and
relpos.signals, what SIGTERM and Ctrl-C do in a program."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from relpos import runtime, signals
from relpos.data import tokenizer

ROOT = Path(__file__).resolve().parent.parent


RELPOS_TUNABLES = (
  'glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776'
)


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='the allocator is Linux-only')
def test_allocator_is_added_once_on_a_linux_cpu():
  environ = runtime.allocator_environment({'JAX_PLATFORMS': 'cpu', 'GLIBC_TUNABLES': 'a.b=1'})
  assert environ['GLIBC_TUNABLES'] == f'a.b=1:{RELPOS_TUNABLES}'
  # The re-executed process has it (and the marker): nothing more to do.
  assert runtime.allocator_environment(environ) is None
  assert runtime.allocator_environment({'JAX_PLATFORMS': 'cpu'})['GLIBC_TUNABLES'] == (
    RELPOS_TUNABLES
  )


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='the allocator is Linux-only')
def test_a_tunable_the_user_set_keeps_the_users_value():
  mine = {'JAX_PLATFORMS': 'cpu', 'GLIBC_TUNABLES': 'glibc.malloc.hugetlb=0'}
  assert runtime.allocator_environment(mine)['GLIBC_TUNABLES'] == (
    'glibc.malloc.hugetlb=0:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776'
  )
  every = 'glibc.malloc.trim_threshold=0:glibc.malloc.mmap_max=9:glibc.malloc.hugetlb=0'
  assert runtime.allocator_environment({'JAX_PLATFORMS': 'cpu', 'GLIBC_TUNABLES': every}) is None


@pytest.mark.parametrize(
  'environ',
  [
    {'JAX_PLATFORMS': 'cpu', 'RELPOS_ALLOCATOR': 'default'},  # the user's opt-out
    {'JAX_PLATFORMS': 'cuda'},  # an accelerator run
    {'JAX_PLATFORMS': 'cpu', 'RELPOS_REEXECUTED': '1'},  # never a second time
  ],
)
def test_allocator_is_left_alone(environ):
  assert runtime.allocator_environment(environ) is None


def test_compilation_cache_defaults_and_opt_outs(tmp_path):
  home_cache = Path.home() / '.cache' / 'relpos' / 'jax'
  assert runtime.cache_environment({})['JAX_COMPILATION_CACHE_DIR'] == str(home_cache)
  # XDG_CACHE_HOME is followed (it was ignored: a small home quota filled all the same); a
  # relative one is ignored, as the XDG rule says; RELPOS_COMPILATION_CACHE still wins.
  xdg = {'XDG_CACHE_HOME': str(tmp_path / 'xdg')}
  assert runtime.cache_environment(xdg)['JAX_COMPILATION_CACHE_DIR'] == str(
    tmp_path / 'xdg' / 'relpos' / 'jax'
  )
  relative = runtime.cache_environment({'XDG_CACHE_HOME': 'xdg'})
  assert relative['JAX_COMPILATION_CACHE_DIR'] == str(home_cache)
  mine = runtime.cache_environment({**xdg, 'RELPOS_COMPILATION_CACHE': str(tmp_path / 'c')})
  assert mine['JAX_COMPILATION_CACHE_DIR'] == str(tmp_path / 'c')
  assert runtime.autotune_cache_path(xdg, None) == tmp_path / 'xdg' / 'relpos' / 'autotune.json'
  mine = runtime.cache_environment({'RELPOS_COMPILATION_CACHE': str(tmp_path)})
  assert mine['JAX_COMPILATION_CACHE_DIR'] == str(tmp_path)
  assert runtime.cache_environment({'RELPOS_COMPILATION_CACHE': 'off'}) == {}
  assert runtime.cache_environment({'JAX_COMPILATION_CACHE_DIR': '/elsewhere'}) == {}


def _run_program(script, environ, *args) -> subprocess.CompletedProcess:
  """`python script *args` in the repository root with `environ`, its output captured; a
  non-zero exit fails the test."""
  return subprocess.run(
    [sys.executable, str(script), *args],
    env=environ,
    capture_output=True,
    text=True,
    timeout=120,
    cwd=ROOT,
    check=True,
  )


def test_a_launcher_restarts_itself_with_the_allocator_and_fills_the_cache(tmp_path):
  """A real process: apply_defaults re-executes it (same argv, one log line), with the CPU
  devices asked for, and the jitted function lands in the cache directory."""
  script = tmp_path / 'program.py'
  script.write_text(
    'import os, sys\n'
    'from relpos import runtime\n'
    'runtime.apply_defaults()\n'
    'import jax, jax.numpy as jnp\n'
    'jax.jit(lambda x: jnp.sin(x) @ x)(jnp.ones((64, 64))).block_until_ready()\n'
    'print(os.environ.get("GLIBC_TUNABLES"), sys.argv[1:], jax.device_count())\n'
  )
  environ = {
    key: value
    for key, value in os.environ.items()
    if key not in ('GLIBC_TUNABLES', 'RELPOS_ALLOCATOR', 'RELPOS_REEXECUTED', 'XLA_FLAGS')
  }
  cache = tmp_path / 'cache'
  environ.update(
    JAX_PLATFORMS='cpu',
    RELPOS_COMPILATION_CACHE=str(cache),
    RELPOS_CPU_DEVICES='3',
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
  )
  done = _run_program(script, environ, 'an-argument')
  if sys.platform.startswith('linux'):
    assert done.stdout.strip() == f"{RELPOS_TUNABLES} ['an-argument'] 3"
    assert done.stderr.count('relpos: CPU defaults') == 1 and '(restarting)' in done.stderr
  assert any(cache.iterdir())


def test_a_damaged_compilation_cache_is_one_warning_line(tmp_path):
  """Cache entries cut short (as a full disk or a killed write leaves them): JAX warned in two
  raw lines for each entry it could not read, in every run. Now one `warning:` line naming
  the directory and the way out; the program runs on and its other warnings still show."""
  script = tmp_path / 'program.py'
  script.write_text(
    'import warnings\n'
    'from relpos import runtime\n'
    'runtime.apply_defaults()\n'
    'import jax, jax.numpy as jnp\n'
    'x = jnp.ones((64, 64))\n'
    'print(float(jax.jit(lambda x: jnp.sin(x) @ x)(x).sum()), float(jax.jit(jnp.cos)(x).sum()))\n'
    'warnings.warn("another warning")\n'
  )
  cache = tmp_path / 'cache'
  environ = os.environ | {
    'JAX_PLATFORMS': 'cpu',
    'RELPOS_COMPILATION_CACHE': str(cache),
    'RELPOS_CPU_DEVICES': '1',
    'RELPOS_ALLOCATOR': 'default',
    'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',
  }

  def run():
    return _run_program(script, environ)

  first = run()
  entries = list(cache.glob('*-cache'))
  assert len(entries) >= 2, list(cache.iterdir())
  for entry in entries:
    entry.write_bytes(entry.read_bytes()[:100])
  second = run()
  assert second.stdout == first.stdout
  lines = [line for line in second.stderr.splitlines() if 'cache' in line]
  assert lines == [
    f'warning: the compilation cache {cache} has an entry JAX cannot read (error: Error -5 '
    'while decompressing data: incomplete or truncated stream); JAX compiles instead, so the '
    f'run goes on, slower to start; remove {cache} to clear the cache, or turn it off '
    '(RELPOS_COMPILATION_CACHE=off)'
  ], second.stderr
  assert 'UserWarning: another warning' in second.stderr


def test_a_read_only_compilation_cache_of_the_users_own_names_its_own_variable(tmp_path):
  """A cache directory that refuses writing wants another directory, not clearing; the
  variable named is the user's JAX_COMPILATION_CACHE_DIR where relpos did not choose it."""
  mine = str(tmp_path)
  line = runtime.cache_fault_line(
    "Error writing persistent compilation cache entry for 'jit_step': OSError: [Errno 30] "
    f"Read-only file system: '{mine}'",
    mine,
    {'JAX_COMPILATION_CACHE_DIR': mine},
  )
  assert line == (
    f'the compilation cache {mine} cannot be written (OSError: [Errno 30] Read-only file '
    f"system: '{mine}'); JAX compiles instead, so the run goes on, slower to start; make it "
    'writable or set JAX_COMPILATION_CACHE_DIR to another directory, or turn it off (unset '
    'JAX_COMPILATION_CACHE_DIR)'
  )
  assert runtime.cache_fault_line('another warning', mine, {}) is None


def _cache_fault(verb: str, cause: str, directory) -> str:
  """relpos's line for JAX's warning of `cause` while `verb` ('reading', 'writing') an entry
  of the cache `directory`, which RELPOS_COMPILATION_CACHE named."""
  message = f"Error {verb} persistent compilation cache entry for 'jit_step': {cause}"
  line = runtime.cache_fault_line(
    message, str(directory), {'RELPOS_COMPILATION_CACHE': str(directory)}
  )
  assert line.startswith(f'the compilation cache {directory} ') and line.endswith(
    ', or turn it off (RELPOS_COMPILATION_CACHE=off)'
  ), line
  what, _, todo = line.removeprefix(f'the compilation cache {directory} ').partition(
    '; JAX compiles instead, so the run goes on, slower to start; '
  )
  return what.split(' (')[0], todo.removesuffix(', or turn it off (RELPOS_COMPILATION_CACHE=off)')


def test_each_compilation_cache_fault_names_its_cause_and_the_remedy_that_fits(tmp_path):
  """Before, every fault was 'cannot be read' or 'cannot be written' with 'remove <dir> to
  clear the cache' (or 'make it writable'): an ordinary file named as the cache was to be
  removed, a directory that could not be created (a read-only HOME) 'cannot be read', and a
  full disk was to be cleared, after which every run warned of the empty entries it left."""
  a_file = tmp_path / 'notes.txt'
  a_file.write_text('mine')
  assert _cache_fault(
    'reading', f"FileExistsError: [Errno 17] File exists: '{a_file}'", a_file
  ) == (
    'is a file, not a directory',
    'set RELPOS_COMPILATION_CACHE to a directory',
  )
  missing = tmp_path / 'home' / '.cache' / 'relpos' / 'jax'
  read_only = f"OSError: [Errno 30] Read-only file system: '{tmp_path / 'home' / '.cache'}'"
  assert _cache_fault('reading', read_only, missing) == (
    'cannot be created',
    'make its parent writable or set RELPOS_COMPILATION_CACHE to another directory',
  )
  under_a_file = a_file / 'jax'
  assert _cache_fault(
    'reading', f"NotADirectoryError: [Errno 20] Not a directory: '{under_a_file}'", under_a_file
  ) == (
    'cannot be created: a file is in the way on its path',
    'set RELPOS_COMPILATION_CACHE to a directory',
  )
  cache = tmp_path / 'cache'
  cache.mkdir()
  (cache / 'jit_step-abc-cache').write_bytes(b'')  # what the failed write left
  (cache / 'jit_other-def-cache').write_bytes(b'whole')
  assert _cache_fault('writing', 'OSError: [Errno 28] No space left on device', cache) == (
    'cannot be written: its disk is full',
    'free space on its disk or set RELPOS_COMPILATION_CACHE to a directory on another disk; '
    f'remove the entry a cut-short write left empty: rm {cache}/jit_step-abc-cache',
  )
  # The next run reads that empty entry: named, with the command that removes it alone.
  damaged = 'error: Error -5 while decompressing data: incomplete or truncated stream'
  assert _cache_fault('reading', damaged, cache) == (
    'has an entry JAX cannot read',
    f'remove the entry a cut-short write left empty: rm {cache}/jit_step-abc-cache',
  )
  (cache / 'jit_more-ghi-cache').write_bytes(b'')
  assert _cache_fault('reading', damaged, cache)[1] == (
    f"remove the 2 entries cut-short writes left empty: find {cache} -name '*-cache' -size 0 "
    '-delete'
  )


def test_cpu_devices_default_to_two_and_respect_the_user():
  assert runtime.devices_environment({'JAX_PLATFORMS': 'cpu', 'RELPOS_CPU_DEVICES': '3'}) == {
    'XLA_FLAGS': '--xla_force_host_platform_device_count=3'
  }
  mine = {'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': '--xla_cpu_multi_thread_eigen=true'}
  expected = runtime.default_cpu_devices()
  flags = runtime.devices_environment(mine).get('XLA_FLAGS', mine['XLA_FLAGS'])
  assert flags.endswith('--xla_cpu_multi_thread_eigen=true')
  assert (f'device_count={expected}' in flags) == (expected > 1)
  forced = {'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': '--xla_force_host_platform_device_count=4'}
  assert runtime.devices_environment(forced) == {}
  assert runtime.devices_environment({'JAX_PLATFORMS': 'cpu', 'RELPOS_CPU_DEVICES': '1'}) == {}
  assert runtime.devices_environment({'JAX_PLATFORMS': 'cuda'}) == {}
  for wanted in ('two', '0'):
    with pytest.raises(ValueError, match='RELPOS_CPU_DEVICES'):
      runtime.devices_environment({'JAX_PLATFORMS': 'cpu', 'RELPOS_CPU_DEVICES': wanted})


def test_gpu_flags_go_first_on_a_gpu_and_respect_the_user():
  flag = '--xla_gpu_dot_merger_threshold_mb=0'
  assert runtime.gpu_flags_environment({'JAX_PLATFORMS': 'cuda'}) == {'XLA_FLAGS': flag}
  mine = {'JAX_PLATFORMS': 'cuda', 'XLA_FLAGS': '--xla_gpu_autotune_level=0 word'}
  assert runtime.gpu_flags_environment(mine) == {
    'XLA_FLAGS': f'{flag} --xla_gpu_autotune_level=0 word'
  }
  # The user's own value of the flag, the opt-out, and any other platform: nothing added.
  own = {'JAX_PLATFORMS': 'cuda', 'XLA_FLAGS': '--xla_gpu_dot_merger_threshold_mb=32'}
  assert runtime.gpu_flags_environment(own) == {}
  assert runtime.gpu_flags_environment({'JAX_PLATFORMS': 'cuda', 'RELPOS_GPU_FLAGS': 'off'}) == {}
  for platform in ('cpu', 'tpu'):
    assert runtime.gpu_flags_environment({'JAX_PLATFORMS': platform}) == {}
  # A tool that compiles for a GPU it does not have (gpu_compile.py) says so.
  assert runtime.gpu_flags_environment({'JAX_PLATFORMS': 'cpu'}, on_gpu=True) == {'XLA_FLAGS': flag}


def test_words_xla_does_not_read_are_found():
  assert runtime.ignored_xla_flags('--a=1 --b=2') == []
  assert runtime.ignored_xla_flags('--a=1 threads=2 --b=2') == ['threads=2', '--b=2']
  assert runtime.ignored_xla_flags('') == []


def test_the_device_count_holds_after_a_word_xla_does_not_read():
  """The peer harness's XLA_FLAGS has such a word; a device flag appended after it was lost."""
  env = {
    **os.environ,
    'XLA_FLAGS': '--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads=2',
    'JAX_PLATFORMS': 'cpu',
    'RELPOS_CPU_DEVICES': '2',
    'RELPOS_ALLOCATOR': 'default',
    'RELPOS_COMPILATION_CACHE': 'off',
  }
  program = (
    'from relpos import runtime; runtime.apply_defaults(); import jax; print(jax.device_count())'
  )
  done = subprocess.run(
    [sys.executable, '-c', program], env=env, capture_output=True, text=True, timeout=120
  )
  assert done.returncode == 0, done.stderr
  assert done.stdout.split() == ['2']
  assert "XLA reads no flag of XLA_FLAGS from 'intra_op_parallelism_threads=2' on" in done.stderr


# Programs that run no JAX computation of their own, so relpos's process defaults (a re-exec
# for the allocator, the device count, the cache) would only cost them a restart.
_WITHOUT_DEFAULTS = {
  'relpos/studies/plot.py': 'reads metrics.jsonl and draws with matplotlib',
  'relpos/studies/significance.py': 'statistics in NumPy over finished runs',
  'relpos/data/prepare.py': 'downloads and writes data files',
  'benchmarks/gpu_run.py': "gpu_run.sh's helper: parses and formats, runs nothing",
  'benchmarks/gpu_compile.py': 'compiles for an H100 it does not have, with its own environment',
}


def test_every_program_that_runs_jax_applies_the_defaults_first():
  """The module docstring's contract, "every program of relpos calls apply_defaults() first":
  each file with a __main__ block calls it there, or is listed above with why it need not.
  (relpos.tools.check_install did not, and so checked a process unlike a run's.)"""
  programs = [
    path
    for pattern in ('*.py', 'relpos/**/*.py', 'benchmarks/*.py')
    for path in ROOT.glob(pattern)
    if "if __name__ == '__main__':" in path.read_text()
  ]
  names = {str(path.relative_to(ROOT)) for path in programs}
  assert {'train.py', 'eval.py', 'relpos/tools/check_install.py'} <= names
  assert set(_WITHOUT_DEFAULTS) <= names, 'a listed program is gone: take it off the list'
  missing = [
    name
    for path, name in zip(programs, map(str, (p.relative_to(ROOT) for p in programs)), strict=True)
    if name not in _WITHOUT_DEFAULTS
    and 'runtime.apply_defaults()' not in path.read_text().split("if __name__ == '__main__':")[1]
  ]
  assert not missing, f'programs whose __main__ does not call runtime.apply_defaults(): {missing}'


def test_stop_at_signals_ends_at_once_with_its_line_and_hands_the_handlers_back(monkeypatch, capfd):
  """eval.py stopped by SIGTERM exited 143 with no line; under `stop_at_signals` SIGTERM and
  Ctrl-C end the program with `error: stopped by <signal><context>` and 128 + the signal's
  number, and the handlers before are back after."""

  class ExitError(Exception):
    pass

  def exit_now(status):
    raise ExitError(status)

  monkeypatch.setattr(os, '_exit', exit_now)
  before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
  for signum, named in ((signal.SIGTERM, 'SIGTERM'), (signal.SIGINT, 'Ctrl-C')):
    with pytest.raises(ExitError) as stopped, signals.stop_at_signals(' while scoring: rerun'):
      os.kill(os.getpid(), signum)
      signal.pthread_sigmask(signal.SIG_BLOCK, [])  # a bytecode boundary for the handler
    assert stopped.value.args == (128 + signum,)
    assert capfd.readouterr().err == f'\nerror: stopped by {named} while scoring: rerun\n'
  assert {s: signal.getsignal(s) for s in before} == before


def test_every_handler_of_ctrl_c_and_sigterm_is_installed_by_one_rule():
  """Four places installed Ctrl-C's and SIGTERM's handlers (training's `PreemptionSignal`,
  `stop_at_signals`, `stop_at_ctrl_c_or_sigterm`, `finish_quietly`), each with its own copy of
  the rule, and two tables named the signals. One rule now (`signals.take_signals`, and
  `signals.handling` for a block): in the main thread only, an ignored signal left ignored,
  the handlers before back after a block; the names come from one table."""

  def handler(signum, frame):
    del signum, frame

  signal.signal(signal.SIGTERM, signal.SIG_IGN)  # nohup's (the fixture restores it)
  before = signal.getsignal(signal.SIGINT)
  with signals.handling(handler):
    assert signal.getsignal(signal.SIGINT) is handler
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    with signals.PreemptionSignal() as preemption:
      assert signal.getsignal(signal.SIGINT) == preemption._handle
    assert signal.getsignal(signal.SIGINT) is handler
  assert signal.getsignal(signal.SIGINT) is before
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
  signals.finish_quietly()
  assert signal.getsignal(signal.SIGINT) is signals._finished
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
  threads = []
  thread = threading.Thread(
    target=lambda: threads.append(signals.take_signals({signal.SIGINT: handler}))
  )
  thread.start()
  thread.join()
  assert threads == [{}] and signal.getsignal(signal.SIGINT) is signals._finished
  assert str(signals.PreemptedError.saved(2, 'c', signal.SIGINT)).startswith('Ctrl-C (SIGINT) at')
  assert str(signals.PreemptedError.saved(2, 'c', signal.SIGTERM)).startswith('SIGTERM at')


def test_a_signal_while_signals_are_held_ends_the_program_after_the_block(
  monkeypatch, capfd, tmp_path
):
  """eval.py's translations and eval_results.json are written in one `holding_signals` block:
  a signal between the two writes ended the program there, the pair mismatched. Now the
  signal waits for the block's end, and its line is told then, from what is on disk."""

  class ExitError(Exception):
    pass

  def exit_now(status):
    raise ExitError(status)

  monkeypatch.setattr(os, '_exit', exit_now)
  written = tmp_path / 'written'
  with pytest.raises(ExitError) as stopped:
    with signals.stop_at_signals(lambda: f': {sorted(p.name for p in tmp_path.iterdir())}'):
      with signals.holding_signals():
        (tmp_path / 'first').write_text('')
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pthread_sigmask(signal.SIG_BLOCK, [])  # a bytecode boundary for the handler
        written.write_text('')
      raise AssertionError('not stopped as the block ended')
  assert stopped.value.args == (143,)
  assert capfd.readouterr().err == "\nerror: stopped by SIGTERM: ['first', 'written']\n"


_FINISHED = """
import atexit, os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)  # as at a terminal, not a background job
from relpos import signals
signals.stop_at_ctrl_c_or_sigterm()
{finish}
print('bpc=1.0', flush=True)
atexit.register(os.kill, os.getpid(), signal.SIGTERM)  # as the interpreter exits
os.kill(os.getpid(), signal.{signal})
signal.pthread_sigmask(signal.SIG_BLOCK, [])  # a bytecode boundary for the handler
print('printed on', flush=True)
"""


@pytest.mark.parametrize('signum', ['SIGTERM', 'SIGINT'])
def test_a_signal_after_the_result_is_printed_fails_nothing(signum):
  """SIGTERM to eval.py just after it wrote and printed its result ended it with `error:
  stopped by SIGTERM`, exit 143 (once, late in its exit, with no line at all). Once the result
  is written the launchers call `finish_quietly`: SIGTERM is ignored to the end of the exit,
  and Ctrl-C ends the program at once with status 0."""
  done = subprocess.run(
    [sys.executable, '-c', _FINISHED.format(finish='signals.finish_quietly()', signal=signum)],
    capture_output=True,
    text=True,
    timeout=60,
    cwd=ROOT,
  )
  assert (done.returncode, done.stderr) == (0, '')
  assert done.stdout == ('bpc=1.0\nprinted on\n' if signum == 'SIGTERM' else 'bpc=1.0\n')


def _signal_this_process():
  os.kill(os.getpid(), signal.SIGUSR1)


def _signal_the_calling_thread():
  signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)


@pytest.mark.parametrize('send', [_signal_this_process, _signal_the_calling_thread])
def test_a_signal_is_taken_while_sentencepiece_trains_a_vocabulary(send):
  """SentencePiece's training is one call into C++ (a minute and more for a 32000-piece
  vocabulary): Python ran a signal's handler only once it returned, so Ctrl-C or SIGTERM went
  unheard. It runs in a worker thread (`signals.call_taking_signals`; its C++ releases the
  GIL), and the handler runs as the signal comes, the training still going. Also when a thread
  other than the main one takes the signal (the kernel may hand a process's signal to any
  thread; here the timer's own): the main thread then only learns of it between its short
  joins. With one long join this case waited for the training to end, every time; it is the
  likely cause of the process-directed case's one failure in six full runs."""
  rng = np.random.default_rng(0)
  letters = np.array(list('abcdefghijklmnopqrstuvwxyz'))
  words = [''.join(rng.choice(letters, rng.integers(3, 10))) for _ in range(20_000)]
  picks = rng.integers(0, len(words), (20_000, 12))
  sentences = [' '.join(words[i] for i in row) for row in picks]  # about 1.5 s to train
  handled = []
  previous = signal.signal(signal.SIGUSR1, lambda signum, frame: handled.append(time.monotonic()))
  try:
    timer = threading.Timer(0.2, send)
    timer.start()
    tokenizer.train_model(sentences, 2000)
    finished = time.monotonic()
    timer.join()
  finally:
    signal.signal(signal.SIGUSR1, previous)
  assert len(handled) == 1 and finished - handled[0] > 0.5, (handled, finished)


@pytest.mark.parametrize('interactive', [False, True])
def test_ctrl_c_that_stops_at_once_leaves_an_interactive_session_running(
  interactive, monkeypatch, capfd
):
  """`stop_now` ends the process (`os._exit`) in a program, but in a notebook's kernel or at a
  Python prompt that would end the user's session: a second interrupt of a training cell, or
  the first during its start-up, killed the kernel. There Ctrl-C raises KeyboardInterrupt after
  the same line; SIGTERM still ends the process."""
  exits = []
  monkeypatch.setattr(signals.os, '_exit', exits.append)
  monkeypatch.setattr(signals, 'in_interactive_session', lambda: interactive)
  if interactive:
    with pytest.raises(KeyboardInterrupt):
      signals.stop_now(signal.SIGINT, ' at step 3')
  else:
    signals.stop_now(signal.SIGINT, ' at step 3')
  signals.stop_now(signal.SIGTERM, ' at step 4')
  assert exits == ([] if interactive else [130]) + [143]
  assert capfd.readouterr().err.splitlines()[1::2] == [
    'error: stopped by Ctrl-C at step 3',
    'error: stopped by SIGTERM at step 4',
  ]


def test_an_interactive_session_is_told_from_a_program():
  """A program (this test session, a `python -c` child) is not interactive; `python -i` and a
  running IPython are."""
  assert not signals.in_interactive_session()
  code = 'from relpos import signals; print(signals.in_interactive_session())'
  for flags, expected in (([], 'False'), (['-i'], 'True')):
    done = subprocess.run(
      [sys.executable, *flags, '-c', code],
      capture_output=True,
      text=True,
      timeout=60,
      cwd=ROOT,
      stdin=subprocess.DEVNULL,
    )
    assert done.stdout.splitlines()[0] == expected, done.stderr


@pytest.mark.parametrize('where', ['gc callback', 'weakref callback'])
def test_an_interactive_interrupt_swallowed_in_a_callback_is_delivered_again(
  where, monkeypatch, capfd
):
  """recheck15-3: in an interactive session a Ctrl-C during a run's start-up printed its line
  and raised KeyboardInterrupt, which Python swallowed where the handler had interrupted JAX's
  garbage-collection callback: the run trained on to its end (2 of 7 tries). A weakref's
  callback swallows it too (seen in this test's first form, which looked for gc callbacks
  alone). Now a swallowed interrupt is delivered again, its line printed once."""
  import gc
  import weakref

  monkeypatch.setattr(signals, 'in_interactive_session', lambda: True)
  previous = signal.signal(signal.SIGINT, lambda signum, frame: signals.stop_now(signum, ': test'))
  landed = []

  def handler_inside(*args):  # the handler, run where the signal landed: inside the callback
    if not landed and args[:1] != ('stop',):
      landed.append(True)
      signals.stop_now(signal.SIGINT, ': test')

  class Target:
    pass

  reference = None
  try:
    with pytest.raises(KeyboardInterrupt):
      if where == 'gc callback':
        gc.callbacks.append(handler_inside)
        gc.collect()
      else:
        target = Target()
        reference = weakref.ref(target, handler_inside)
        del target
      deadline = time.monotonic() + 5
      while time.monotonic() < deadline:  # the run going on
        time.sleep(0.01)
  finally:
    if handler_inside in gc.callbacks:
      gc.callbacks.remove(handler_inside)
    signal.signal(signal.SIGINT, previous)
  assert landed and capfd.readouterr().err.count('error: stopped by Ctrl-C: test') == 1
  assert reference is None or reference() is None  # kept alive for its callback to run
