"""Shared fixtures. relpos comes from the editable install (README); pytest puts this folder on
the import path for `helpers` and `reference`."""

import atexit
import contextlib
import os
import sys

import jax
import pytest

# XLA:CPU's fusion emitters off for the whole run: in this process (XLA reads XLA_FLAGS when its
# CPU client starts, after this; collection creates no arrays before it) and, through the
# environment, in every process a test starts. With them on (XLA's default) a tiny model's
# train step takes about twice as long to compile (test_data_parallel's two steps: 5.9 s of CPU
# against 3.1 s), and compiling is most of the suite's time: the whole suite took 352 s instead
# of 560 on 2 cores. Like `fewer_xla_optimizations_everywhere` below, this changes how XLA
# generates code, not what it computes: results differ by float rounding at most, and every
# comparison is of one setting against itself or to a tolerance above it. The flag is jaxlib
# 0.10's (the CPU pin, requirements.txt); 0.11 has none of that name and XLA aborts at a flag
# it does not know, so with another jaxlib (the GPU pin) the suite runs without it. A process
# started with an XLA_FLAGS of its own goes without it too.
FAST_COMPILE_FLAGS = {'0.10.': '--xla_cpu_use_fusion_emitters=false'}


def _fast_compile_flag() -> str | None:
  """This jaxlib's flag of FAST_COMPILE_FLAGS, or None (also where its version is unknown)."""
  from importlib.metadata import PackageNotFoundError, version

  try:
    jaxlib = version('jaxlib')
  except PackageNotFoundError:
    return None
  return next((flag for line, flag in FAST_COMPILE_FLAGS.items() if jaxlib.startswith(line)), None)


if (_flag := _fast_compile_flag()) and _flag not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = f'{os.environ.get("XLA_FLAGS", "")} {_flag}'.strip()

# Threefry (dropout's random bits, the initialisers) lowered as jax 0.10.2's rolled loop for the
# whole run, in this process and, through the environment, in every process a test starts:
# relpos.threefry_lowering's switch, read when relpos.models is first imported (after this). The
# straight-line lowering relpos applies by default is the faster one with XLA's optimisations
# on; with them mostly off, as here, it compiles slower: test_char_lm_training's train step
# compiled in 3.2 s against 2.1 s, and that module with test_translate_training and
# test_counter_hash took 101 s against 89 s on 2 cores (2026-11-29). Like the flags above, it
# changes how XLA generates code, not what it computes: both lowerings draw the same bits, and
# test_threefry_lowering tests the straight-line one and that a program gets it by default. An
# RELPOS_THREEFRY set before the run is kept.
os.environ.setdefault('RELPOS_THREEFRY', 'rolled')


@pytest.fixture(scope='session', autouse=True)
def fewer_xla_optimizations_everywhere():
  """XLA's optimisations mostly off for the whole run (jax_disable_most_optimizations), in this
  process and, through the environment, in every process a test starts (train.py, the sweeps,
  the benchmarks). The suite trains and evaluates tiny models whose time is mostly compiling:
  this cuts a compile by 30-40% (char_lm's 8-step run of test_char_lm_training: 18 s of CPU
  instead of 31, the same bits-per-char to 1e-9) and changes results by float rounding only
  (the comparisons are of one setting against itself, or to tolerances above it). A test
  marked `xla_optimizations` (compile and memory reports) runs with them on."""
  old = jax.config.read('jax_disable_most_optimizations')
  old_environ = os.environ.get('JAX_DISABLE_MOST_OPTIMIZATIONS')
  jax.config.update('jax_disable_most_optimizations', True)
  os.environ['JAX_DISABLE_MOST_OPTIMIZATIONS'] = '1'
  try:
    yield
  finally:
    jax.config.update('jax_disable_most_optimizations', old)
    if old_environ is None:
      os.environ.pop('JAX_DISABLE_MOST_OPTIMIZATIONS', None)
    else:
      os.environ['JAX_DISABLE_MOST_OPTIMIZATIONS'] = old_environ


@pytest.fixture(autouse=True)
def _signal_handlers_are_per_test():
  """Each test starts with Ctrl-C as a foreground program has it, and SIGINT's and SIGTERM's
  handlers as they were are back after it. A shell starts a background job (`cmd &`, a CI
  runner's detached step) with SIGINT ignored, and relpos leaves an ignored signal ignored
  (nohup's contract: `relpos.signals`), so every test of Ctrl-C failed there ('DID NOT
  RAISE', six tests in a suite run as `(... pytest &)`). A launcher run in-process ends with
  `relpos.signals.finish_quietly`, which changes both handlers for the rest of the process,
  and `signals.holding_signals`' held signals are reset too."""
  import signal

  from relpos import signals

  handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
  if handlers[signal.SIGINT] is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  for signum, handler in handlers.items():
    signal.signal(signum, handler)
  signals._held = None  # none held outside its block


@pytest.fixture(autouse=True)
def _warnings_said_once_are_per_test():
  """A `warn(..., once=True)` prints once per process; each test is a command of its own."""
  from relpos import messages

  messages._SAID_ONCE.clear()


@pytest.fixture(autouse=True)
def _xla_optimizations_where_marked(request, monkeypatch):
  """Optimisations back on for a test marked `xla_optimizations` (and its processes)."""
  if request.node.get_closest_marker('xla_optimizations') is None:
    yield
    return
  monkeypatch.delenv('JAX_DISABLE_MOST_OPTIMIZATIONS', raising=False)
  jax.config.update('jax_disable_most_optimizations', False)
  try:
    yield
  finally:
    jax.config.update('jax_disable_most_optimizations', True)


@pytest.fixture(scope='module')
def attention_test_config():
  """JAX settings for the attention tests, opted into per module with
  `pytestmark = pytest.mark.usefixtures("attention_test_config")` and restored afterwards.

  float32 matmuls at full precision, so the comparisons with float64 references at ~1e-6
  also hold on GPUs/TPUs whose default float32 matmul is TF32/bf16-pass (no-op on CPU). (XLA's
  optimisations are mostly off for them as for every test: `fewer_xla_optimizations_everywhere`.)
  """
  with jax.default_matmul_precision('highest'):
    yield


@contextlib.contextmanager
def _persistent_cache(directory, min_compile_time_secs: float):
  """JAX's persistent compilation cache in `directory` inside the block, storing compiles that
  take at least `min_compile_time_secs`; the previous cache settings come back afterwards."""
  from jax.experimental.compilation_cache import compilation_cache as cache

  old_directory = jax.config.jax_compilation_cache_dir
  old_min_time = jax.config.jax_persistent_cache_min_compile_time_secs
  cache.reset_cache()
  jax.config.update('jax_persistent_cache_min_compile_time_secs', min_compile_time_secs)
  cache.set_cache_dir(str(directory))
  try:
    yield
  finally:
    cache.reset_cache()
    jax.config.update('jax_compilation_cache_dir', old_directory)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', old_min_time)


def _run_folder(tmp_path_factory):
  """The folder of this whole run, shared by pytest-xdist's workers."""
  root = tmp_path_factory.getbasetemp()
  if 'PYTEST_XDIST_WORKER' in os.environ:
    root = root.parent  # popen-gw0, popen-gw1, ... sit side by side under the run's folder
  return root


@pytest.fixture(scope='session', autouse=True)
def shared_compilation_cache(tmp_path_factory):
  """One persistent compilation cache for the whole run, shared by pytest-xdist's workers:
  many tests build the same tiny models, and a later test loads the executable an earlier one
  compiled instead of compiling it again. Only compiles over 0.5 s are stored."""
  with _persistent_cache(_run_folder(tmp_path_factory) / 'jax-cache', 0.5):
    yield


@pytest.fixture(scope='session', autouse=True)
def commands_cache_in_the_run(tmp_path_factory):
  """The processes tests start (train.py, eval.py, the benchmarks and sweeps: relpos.runtime)
  use the run's cache of `shared_compilation_cache`, not relpos's default ~/.cache/relpos/jax
  (or the autotuner's file in it). There they wrote into the user's home (56 MB after some
  days of runs here) and loaded what earlier runs of the suite had compiled, which CI's fresh
  home lacks (the wall time did not tell: 514 s with an empty home, 516 s with the full one,
  2026-11-29). A test of the cache's own rules sets RELPOS_COMPILATION_CACHE itself."""
  old = os.environ.get('RELPOS_COMPILATION_CACHE')
  os.environ['RELPOS_COMPILATION_CACHE'] = str(_run_folder(tmp_path_factory) / 'jax-cache')
  yield
  if old is None:
    os.environ.pop('RELPOS_COMPILATION_CACHE', None)
  else:
    os.environ['RELPOS_COMPILATION_CACHE'] = old


@pytest.fixture
def compilation_cache(tmp_path):
  """JAX's persistent compilation cache in a fresh directory for one test, as
  `python -m relpos.studies.sweep` has it (relpos.runtime): a sweep's later runs load the compiled
  steps of its first. The run's shared cache comes back afterwards."""
  with _persistent_cache(tmp_path / 'jax-cache', 0.0):
    yield


def _on_hopper() -> bool:
  """A Hopper GPU (compute capability 9.x): what the Mosaic GPU kernels compile for (wgmma, TMA)."""
  if jax.default_backend() != 'gpu':
    return False
  return str(getattr(jax.devices()[0], 'compute_capability', '')).startswith('9')


@pytest.fixture(
  params=[
    'interpret',
    pytest.param(
      'native', marks=pytest.mark.skipif(not _on_hopper(), reason='a Mosaic GPU kernel natively')
    ),
  ]
)
def mosaic_interpret(request, fresh_interpreter):
  """The `interpret=` a Mosaic kernel test passes: each such test runs twice, in Mosaic GPU's
  interpreter (True; everywhere) and compiled ('native', False; on a Hopper GPU only, where
  `pytest -k native -m 'slow or not slow'` runs every case; benchmarks/gpu_run.sh's
  mosaic_native part)."""
  return request.param == 'interpret'


@pytest.fixture
def fresh_interpreter():
  """Mosaic GPU's interpreter (the Mosaic kernels' tests) with its global state reset before
  and after: a kernel that raised leaves it inconsistent."""
  from jax._src.pallas.mosaic_gpu.interpret.interpret_pallas_call import (
    reset_gpu_interpret_mode_state,
  )

  reset_gpu_interpret_mode_state()
  yield
  reset_gpu_interpret_mode_state()


@pytest.fixture(scope='session')
def commands():
  """`commands.run([...])`: subprocess.run for `python train.py ...`-style command lines, each
  a real process forked from one server that has imported relpos once (forked_commands); it
  inherits the run's environment, XLA's optimisations mostly off among it."""
  from forked_commands import Commands

  server = Commands()
  yield server
  server.close()


@pytest.fixture
def run_compilation_cache(tmp_path_factory):
  """As `compilation_cache` (every compile stored, as `python -m relpos.studies.sweep` has it),
  but in one directory for the whole run, shared by pytest-xdist's workers: tests that train
  the same tiny model (the sweeps of test_sweep) load what the first of them compiled."""
  with _persistent_cache(_run_folder(tmp_path_factory) / 'jax-cache-every-compile', 0.0):
    yield


# Modules whose tests train and evaluate whole runs (10-25 s each): started first, so that the
# two workers do not end the run waiting on one of them while the other is idle.
LONG_MODULES = (
  'test_translate_training.py',
  'test_char_lm_training.py',
  'test_preemption.py',
  'test_faults.py',
  'test_data_parallel.py',
)


def pytest_collection_finish(session):
  """Python's garbage collector tuned for the tests' heap: what collection imported and built
  (JAX, flax, relpos, the test items) is frozen out of its scans (`gc.freeze`), and a young
  collection waits for 20,000 new objects instead of 700. Tracing and lowering make millions
  of short-lived objects, and each full collection walked the whole heap of a worker (about
  0.4 s each): in 4 modules run on 2 cores (test_transformer_xl, test_pallas,
  test_char_lm_training, test_autotune; 2026-11-29) the workers spent 16.5 s collecting
  garbage, against 3.5 s tuned, and the run took 131 s against 118 s. Objects are freed as
  before (by reference count, and cycles by the collector a little later)."""
  import gc

  gc.collect()
  gc.freeze()
  gc.set_threshold(20_000, 10, 10)


def pytest_collection_modifyitems(items):
  """The tests of LONG_MODULES first, each module's in its own order (a stable sort)."""
  items.sort(key=lambda item: item.path.name not in LONG_MODULES)


def _end_the_worker_without_teardown():
  """At a pytest-xdist worker's exit, after every other exit handler: `os._exit(0)`, skipping
  the interpreter's teardown of the worker (every module's objects, JAX's client and the
  executables it compiled), which no test sees and the controller waits for. Measured on 2
  cores (2026-11-29): test_flops.py alone ended 5 s after its last test without this, 0.5 s
  with it; the whole suite 14 s after its last test, 6 s with it. Only a worker whose pytest
  session finished (`pytest_unconfigure`) skips it; one ending any other way ends as Python
  ends it, and the controller reports failures and crashed workers as before."""
  if _worker_finished:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


_worker_finished = False
if 'PYTEST_XDIST_WORKER' in os.environ:
  # Registered first, so it runs last (atexit runs handlers in reverse): JAX's, logging's and
  # execnet's own exit handlers run before it.
  atexit.register(_end_the_worker_without_teardown)


def pytest_unconfigure(config):
  """The session finished: a worker may end without the interpreter's teardown."""
  global _worker_finished
  _worker_finished = True
