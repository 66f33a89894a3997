"""The process defaults relpos applies itself, before JAX starts: the allocator, the number of
CPU devices, an XLA flag on a GPU, the persistent compilation cache and what Ctrl-C does.

Every program of relpos that runs JAX (train.py, eval.py, `python -m relpos.<tool>`, the
benchmarks; tests/test_runtime.py lists the few that run none) calls `apply_defaults()` first,
so a user gets the fast settings without touching their shell, and the benchmarks measure what
a user runs. Besides Ctrl-C's handler and a hook for JAX's cache warnings it reads and sets
environment variables only, never imports JAX, and does nothing that a variable the user set
already decides.

- **Allocator** (Linux, JAX on the CPU). XLA:CPU allocates its buffers with malloc at every
  step and frees them after. glibc's malloc maps each large one fresh from the kernel, or hands
  freed heap memory back, so the next step page-faults on memory it just had. relpos sets
  three glibc tunables: `glibc.malloc.hugetlb=1` (transparent huge pages where malloc does map
  memory: a fault per 2 MiB instead of per 4 KiB), `glibc.malloc.mmap_max=0` (no buffer gets
  a mapping of its own: all come from the heap) and `glibc.malloc.trim_threshold` = 1 TiB
  (freed heap memory is kept for the next step, never returned). A step then reuses the memory
  of the last one; the price is that the process keeps its peak memory. glibc reads the
  variable once, at start-up, so the program re-executes itself once with the tunables added
  and logs one line saying so. `RELPOS_ALLOCATOR=default` keeps glibc's own settings, and a
  tunable the user's GLIBC_TUNABLES already names is left as the user set it.
  docs/performance-cpu.md gives
  the measured effect (faults, kernel time, step time, memory) on and off.
- **CPU devices** (JAX on the CPU, two or more cores). XLA:CPU runs one device's step
  largely one operation at a time: its matmuls use every core, but the many elementwise
  fusions, reductions and small matmuls of these models run on one thread, so the other cores
  wait. Split into several host devices (`--xla_force_host_platform_device_count`), the data
  mesh (`relpos.training.mesh`) gives each device its rows of the batch and the devices run
  their shares at the same time. The default is 2 devices when this process may use at least
  2 cores; `RELPOS_CPU_DEVICES=N` sets N (1: one device), and an XLA_FLAGS that already forces
  a device count is left alone. The flag goes first in XLA_FLAGS: XLA stops reading at a word
  that is not a `--flag` (a warning names such words), so a flag appended after one is lost.
  The global batch is the same for any count (it must split into equal shares: a config error
  says so), so the count changes float rounding, not the model being trained.
  docs/performance-cpu.md gives
  the measured effect.
- **Dot merging off** (JAX on an NVIDIA or AMD GPU). XLA:GPU merges two matmuls that share
  an operand into one (its DotMerger pass): the key and value projections of one input, and
  XL's R projections of every layer. A fused attention kernel (Pallas, Mosaic, cuDNN: a custom
  call) cannot read its keys or values out of the merged result, whose rows interleave them, so
  XLA copies each out: 36 copies a step in the bf16 enwik8_base XL step. relpos sets
  `--xla_gpu_dot_merger_threshold_mb=0` (no merging; first in XLA_FLAGS, as the device count
  above), unless XLA_FLAGS already names that flag or `RELPOS_GPU_FLAGS=off`. Compiled for an
  H100 (docs/gpu.md, the floor under a step), it lowers the floor of every step measured, with
  the fused kernels and with XLA's attention (`GPU_FLAGS`). XLA stops at start on a flag it
  does not know: should a later jaxlib drop this one, the line relpos prints just before names
  the way out, `RELPOS_GPU_FLAGS=off`.
- **Compilation cache.** JAX's persistent compilation cache, so that a second run of a config
  (a rerun, a resume, the next seed of a sweep, eval.py after train.py) loads its compiled
  steps instead of compiling them again. It lives in `RELPOS_COMPILATION_CACHE` (default
  `$XDG_CACHE_HOME/relpos/jax`, `~/.cache/relpos/jax` where XDG_CACHE_HOME is not set:
  `cache_root`); `RELPOS_COMPILATION_CACHE=off` turns it off. A
  `JAX_COMPILATION_CACHE_DIR` of the user's own wins. The cache holds compiled code: share it
  only with people you trust (JAX's own warning). A cache JAX cannot read or write (entries
  cut short, a read-only directory, a full disk, a file in its place) costs compiles, not
  results: JAX compiles what it cannot load and warns of each entry in two raw lines, again in
  every run. Each program says it once, as one `warning:` line naming the directory, what is
  wrong with it and the remedy that fits (`say_cache_faults_once`, `cache_fault_line`).
- **Autotuning cache.** What `implementation='auto'` measured (`relpos.attention.autotune`)
  is kept in `relpos-autotune.json` inside that cache directory (JAX reads only its own
  `*-cache` files there), or in `RELPOS_AUTOTUNE_CACHE` (a file; `off`: decisions are kept
  in memory only), or, with no local compilation cache, `autotune.json` in `cache_root`
  (`autotune_cache_path`).
- **Ctrl-C and SIGTERM** end the program at once with one line and exit status 130 or 143
  (`relpos.signals.stop_at_ctrl_c_or_sigterm`), from its first moment: no KeyboardInterrupt
  traceback through JAX's imports, none that Python swallows in a callback, and no silent end
  on SIGTERM. `relpos.signals` holds the rest of what a signal does (training saves first, an
  evaluation says what is kept).
"""

import errno
import os
import re
import shlex
import sys
import warnings
from pathlib import Path

from relpos import signals

# glibc malloc tunables relpos adds on a Linux CPU (module docstring; docs/performance-cpu.md
# measures them).
ALLOCATOR_TUNABLES = {
  'glibc.malloc.hugetlb': '1',
  'glibc.malloc.mmap_max': '0',
  'glibc.malloc.trim_threshold': str(2**40),
}
AUTOTUNE_CACHE_NAME = 'relpos-autotune.json'  # inside the compilation cache directory
_REEXECUTED = 'RELPOS_REEXECUTED'  # set in the re-executed process: never loop
DEVICES_FLAG = '--xla_force_host_platform_device_count'
# XLA flags relpos adds on a GPU (module docstring), each unless XLA_FLAGS names it.
GPU_FLAGS = ('--xla_gpu_dot_merger_threshold_mb=0',)
_GPU_PLUGINS = ('jax_cuda12_plugin', 'jax_cuda13_plugin', 'jax_rocm60_plugin')

# Compiles shorter than this are not worth a disk entry (JAX's default is 1 s; a char_tiny
# step compiles in about 2 s, each decoding shape of beam search in under 1 s).
_MIN_COMPILE_SECONDS = '0.3'


def _platform(environ) -> str:
  """Where JAX will run, told without starting it: the first of JAX_PLATFORMS ('cuda', 'gpu'
  and 'rocm' read as 'gpu'), else 'gpu' where a CUDA or ROCm plugin is installed, 'tpu' where
  libtpu is, and 'cpu' where none is."""
  platforms = environ.get('JAX_PLATFORMS', '')
  if platforms:
    first = platforms.split(',')[0].strip()
    return 'gpu' if first in ('cuda', 'gpu', 'rocm') else first
  import importlib.util

  if any(importlib.util.find_spec(name) for name in _GPU_PLUGINS):
    return 'gpu'
  return 'tpu' if importlib.util.find_spec('libtpu') else 'cpu'


def gpu_flags_environment(environ, on_gpu: bool | None = None) -> dict:
  """{'XLA_FLAGS': ...} with GPU_FLAGS first, those the flags do not already name, or {} when
  there are none to add, RELPOS_GPU_FLAGS=off, or JAX is not on a GPU (`on_gpu`: given, as
  by a tool that compiles for a GPU it does not have; None: `_platform`)."""
  flags = environ.get('XLA_FLAGS', '')
  missing = [flag for flag in GPU_FLAGS if flag.split('=', 1)[0] not in flags]
  if on_gpu is None:
    on_gpu = _platform(environ) == 'gpu'
  if not missing or environ.get('RELPOS_GPU_FLAGS') == 'off' or not on_gpu:
    return {}
  # First: XLA stops reading XLA_FLAGS at a word that does not start with '--'.
  return {'XLA_FLAGS': ' '.join([*missing, flags]).strip()}


def allocator_environment(environ) -> dict | None:
  """The environment to re-execute with for the fast allocator, or None when this process
  already has it, is told not to, or is not a Linux CPU run. Tunables the user's
  GLIBC_TUNABLES names keep the user's values; the others of ALLOCATOR_TUNABLES are added."""
  tunables = environ.get('GLIBC_TUNABLES', '')
  named = {item.split('=', 1)[0] for item in tunables.split(':')}
  missing = [f'{name}={value}' for name, value in ALLOCATOR_TUNABLES.items() if name not in named]
  if (
    not sys.platform.startswith('linux')
    or environ.get('RELPOS_ALLOCATOR', 'relpos') == 'default'
    or _REEXECUTED in environ
    or not missing
    or _platform(environ) != 'cpu'
  ):
    return None
  return {
    **environ,
    'GLIBC_TUNABLES': ':'.join(filter(None, [tunables, *missing])),
    _REEXECUTED: '1',
  }


def default_cpu_devices() -> int:
  """2 when this process may run on at least 2 cores, else 1."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
  return 2 if (cores or 1) >= 2 else 1


def devices_environment(environ) -> dict:
  """{'XLA_FLAGS': ...} forcing RELPOS_CPU_DEVICES (default `default_cpu_devices()`) host
  devices, or {} when that is 1, the flags already force a count, or JAX is not on the CPU.

  Raises:
    ValueError: RELPOS_CPU_DEVICES is not a positive integer.
  """
  flags = environ.get('XLA_FLAGS', '')
  if DEVICES_FLAG in flags or _platform(environ) != 'cpu':
    return {}
  wanted = environ.get('RELPOS_CPU_DEVICES', '')
  if wanted and not (wanted.isdigit() and int(wanted) > 0):
    raise ValueError(f'RELPOS_CPU_DEVICES={wanted!r} must be a positive integer')
  count = int(wanted) if wanted else default_cpu_devices()
  if count == 1:
    return {}
  # First: XLA stops reading XLA_FLAGS at a word that does not start with '--'.
  return {'XLA_FLAGS': f'{DEVICES_FLAG}={count} {flags}'.strip()}


def ignored_xla_flags(flags: str) -> list[str]:
  """The words of XLA_FLAGS from the first one not starting with '--' on: XLA reads none of
  them (it takes the flags before that word and silently drops the rest). The first word is
  not checked: XLA reads a first word without '--' as a file of flags, and fails loudly."""
  words = flags.split()
  for index, word in enumerate(words[1:], start=1):
    if not word.startswith('--'):
      return words[index:]
  return []


def cache_root(environ) -> Path:
  """relpos's directory of caches: `$XDG_CACHE_HOME/relpos` where XDG_CACHE_HOME is an absolute
  path (the XDG Base Directory rule, which ignores a relative one), else `~/.cache/relpos`. On
  clusters whose home directories have a small quota, users point XDG_CACHE_HOME at scratch;
  the compilation cache went under ~/.cache all the same."""
  xdg = environ.get('XDG_CACHE_HOME', '')
  return (Path(xdg) if os.path.isabs(xdg) else Path.home() / '.cache') / 'relpos'


def default_cache_dir(environ) -> Path:
  """The compilation cache's directory when RELPOS_COMPILATION_CACHE is not set."""
  return cache_root(environ) / 'jax'


def cache_environment(environ) -> dict:
  """The JAX_* variables that turn the persistent compilation cache on (none when the user set
  JAX_COMPILATION_CACHE_DIR or RELPOS_COMPILATION_CACHE=off)."""
  where = environ.get('RELPOS_COMPILATION_CACHE', str(default_cache_dir(environ)))
  if 'JAX_COMPILATION_CACHE_DIR' in environ or where == 'off':
    return {}
  return {
    'JAX_COMPILATION_CACHE_DIR': where,
    'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': environ.get(
      'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', _MIN_COMPILE_SECONDS
    ),
  }


def autotune_cache_path(environ, compilation_cache_dir: str | None) -> Path | None:
  """The autotuner's cache file (module docstring), None for none: RELPOS_AUTOTUNE_CACHE
  ('off': None), else AUTOTUNE_CACHE_NAME in the local `compilation_cache_dir` (JAX's
  jax_compilation_cache_dir; a URL such as gs://... is not local), else autotune.json in
  `cache_root`."""
  chosen = environ.get('RELPOS_AUTOTUNE_CACHE', '')
  if chosen:
    return None if chosen == 'off' else Path(chosen).expanduser()
  if compilation_cache_dir and '://' not in compilation_cache_dir:
    return Path(compilation_cache_dir).expanduser() / AUTOTUNE_CACHE_NAME
  return cache_root(environ) / 'autotune.json'


# JAX's UserWarning of an entry of its persistent compilation cache it could not read or
# write (jax/_src/compiler.py): the verb, then '<exception type>: <its text>'.
_CACHE_FAULT = re.compile(
  r"Error (reading|writing) persistent compilation cache entry for '[^']*': (.*)", re.DOTALL
)


def cache_fault_line(message: str, directory: str, environ) -> str | None:
  """The one warning line for JAX's warning `message` about its compilation cache in
  `directory`, None for any other warning. JAX says only whether it was reading or writing an
  entry and the exception; the line names what that means and the remedy that fits it
  (`_cache_fault`): a file where the directory goes, a directory that cannot be created or
  written, a full disk, damaged entries. The variable named is relpos's when relpos chose the
  directory (`cache_environment`), else the user's own JAX variable."""
  fault = _CACHE_FAULT.match(message)
  if fault is None:
    return None
  if directory == environ.get('RELPOS_COMPILATION_CACHE', str(default_cache_dir(environ))):
    variable, off = 'RELPOS_COMPILATION_CACHE', 'RELPOS_COMPILATION_CACHE=off'
  else:
    variable, off = 'JAX_COMPILATION_CACHE_DIR', 'unset JAX_COMPILATION_CACHE_DIR'
  cause = fault[2].strip().splitlines()[0] if fault[2].strip() else 'no cause given'
  what, todo = _cache_fault(fault[1], cause, Path(directory), variable)
  return (
    f'the compilation cache {directory} {what} ({cause}); JAX compiles instead, so the run '
    f'goes on, slower to start; {todo}, or turn it off ({off})'
  )


def _cache_fault(verb: str, cause: str, directory: Path, variable: str) -> tuple[str, str]:
  """(what is wrong with the cache `directory`, the remedy) for JAX's `verb` ('reading' or
  'writing') an entry and its `cause`. JAX makes the directory at its first read, so a read
  that failed where no directory is could not create it."""
  known = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.ENOTDIR, errno.EEXIST)
  number = next((n for n in known if os.strerror(n) in cause), None)
  if directory.exists() and not directory.is_dir():
    return 'is a file, not a directory', f'set {variable} to a directory'
  if not directory.is_dir():
    if number in (errno.ENOTDIR, errno.EEXIST):
      return 'cannot be created: a file is in the way on its path', f'set {variable} to a directory'
    return 'cannot be created', f'make its parent writable or set {variable} to another directory'
  if number in (errno.ENOSPC, errno.EDQUOT):
    return 'cannot be written: its disk is full', (
      f'free space on its disk or set {variable} to a directory on another disk; '
      f'{_damaged_entries(directory)}'
    )
  if number in (errno.EROFS, errno.EACCES):
    done = {'reading': 'read', 'writing': 'written'}[verb]
    return f'cannot be {done}', f'make it writable or set {variable} to another directory'
  if verb == 'writing':
    return 'cannot be written', f'set {variable} to another directory'
  return 'has an entry JAX cannot read', _damaged_entries(directory)


def _damaged_entries(directory: Path) -> str:
  """How to remove the damaged entries of the cache `directory`. JAX writes an entry in place
  (`<key>-cache`; the key is not in its warning), so a write cut short (a full disk, a killed
  process) leaves it empty, and every later run that looks it up warns of it again: those are
  named, one by its path, else the find command that removes them; a damaged entry that is not
  empty cannot be told from the others, so then the remedy is clearing the directory."""
  try:
    empty = sorted(p for p in directory.glob('*-cache') if p.stat().st_size == 0)
  except OSError:
    empty = []
  if len(empty) == 1:
    return f'remove the entry a cut-short write left empty: rm {shlex.quote(str(empty[0]))}'
  if empty:
    return (
      f'remove the {len(empty)} entries cut-short writes left empty: find '
      f"{shlex.quote(str(directory))} -name '*-cache' -size 0 -delete"
    )
  return f'remove {shlex.quote(str(directory))} to clear the cache'


def say_cache_faults_once() -> None:
  """Shows JAX's warnings about its persistent compilation cache as one `warning:` line for
  the whole program (`cache_fault_line`, through `warnings.showwarning`, the hook Python
  provides for showing warnings), instead of two raw lines for each entry, in every run;
  every other warning is shown as before."""
  shown_before, said = warnings.showwarning, []

  def showwarning(message, category, filename, lineno, file=None, line=None):
    jax = sys.modules.get('jax')
    directory = (jax and jax.config.jax_compilation_cache_dir) or os.environ.get(
      'JAX_COMPILATION_CACHE_DIR', str(default_cache_dir(os.environ))
    )
    text = cache_fault_line(str(message), directory, os.environ)
    if text is None:
      shown_before(message, category, filename, lineno, file, line)
    elif not said:
      said.append(text)
      from relpos.messages import warn  # noqa: PLC0415 (runtime imports nothing at start)

      warn(text)

  warnings.showwarning = showwarning


def apply_defaults() -> None:
  """Sets the device and compilation cache variables, then re-executes this program with the
  fast allocator if it lacks it (the process keeps its pid), with one log line naming what it
  applied, and makes Ctrl-C and SIGTERM one line (`signals.stop_at_ctrl_c_or_sigterm`, first:
  start-up is when Ctrl-C is most often pressed). Call it before importing JAX; a bad RELPOS_*
  value ends the program with one line. JAX's warnings about its compilation cache are one
  line (`say_cache_faults_once`)."""
  signals.stop_at_ctrl_c_or_sigterm()
  say_cache_faults_once()
  try:
    devices = devices_environment(os.environ)
  except ValueError as error:
    sys.exit(f'error: {error}')
  os.environ.update(devices)
  gpu_flags = gpu_flags_environment(os.environ)
  os.environ.update(gpu_flags)
  os.environ.update(cache_environment(os.environ))
  environ = allocator_environment(os.environ)
  applied = [f'XLA_FLAGS={devices["XLA_FLAGS"]}'] if devices else []
  if environ is not None:
    applied.append(f'GLIBC_TUNABLES={environ["GLIBC_TUNABLES"]} (restarting)')
  ignored = ignored_xla_flags(os.environ.get('XLA_FLAGS', ''))
  if ignored and environ is None:  # said once, not again after the restart
    print(
      f'relpos: warning: XLA reads no flag of XLA_FLAGS from {ignored[0]!r} on (not a --flag): '
      f'{" ".join(ignored)}',
      file=sys.stderr,
      flush=True,
    )
  if gpu_flags:
    print(
      f'relpos: GPU defaults XLA_FLAGS={gpu_flags["XLA_FLAGS"]}; RELPOS_GPU_FLAGS=off turns '
      'them off',
      file=sys.stderr,
      flush=True,
    )
  if applied:
    print(
      f'relpos: CPU defaults {", ".join(applied)}; RELPOS_CPU_DEVICES=1 and '
      'RELPOS_ALLOCATOR=default turn them off',
      file=sys.stderr,
      flush=True,
    )
  if environ is not None:
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environ)
