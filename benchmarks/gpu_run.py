"""The parts of benchmarks/gpu_run.sh that need more than one command: each prints `RESULT: ...`
lines (gpu_run.sh copies them into its markdown log) and exits non-zero when its check fails.

    python benchmarks/gpu_run.py resume --config=C --work=DIR --kill_after=130 [-- OVERRIDES]
    python benchmarks/gpu_run.py losses REFERENCE/metrics.jsonl RESUMED/metrics.jsonl
    python benchmarks/gpu_run.py oom --config=C [-- OVERRIDES]
    python benchmarks/gpu_run.py long_context --config=C --seconds=150 [-- OVERRIDES]
    python benchmarks/gpu_run.py pack_cache --cache=DIR --out=FILE.tar [--max_mib=15]

- `resume`: train.py from scratch into DIR/run, killed with SIGKILL once it logs step
  --kill_after, then run again on that workdir (it resumes from the latest checkpoint, before
  the kill) to the end. The steps between that checkpoint and the kill are trained twice, and
  their losses, logged before the kill and again after the resume, must match step for step
  (`split_runs`, `compare_losses`): what an uninterrupted run would have logged is what the
  first run did log. eval.py then scores the workdir (its last line, bpc=...). One run at a
  time, so that the part shares the GPU with the other parts run beside it and with nothing
  of its own.
- `losses`: compares the 'train/loss' of two metrics.jsonl files at every step of the first;
  where the second holds a step twice (logged before the kill and again after the resume), the
  later line counts. --tolerance (default 0: bit-identical).
- `oom`: runs train.py (an oversized batch in OVERRIDES) and records its exit status and its
  message (the last stderr line starting 'error', else the last line); passes when it exits
  non-zero, the message matches --expect (default: names memory), in at most --max_lines
  lines of stderr (relpos's allocator line and a hint line fit in the default 3).
- `long_context`: the largest segment that trains: for each position and implementation, one
  train step of the config at batch = device count and tgt_len = mem_len = n, n doubling from
  --start (or the implementation's --starts entry) until a failure (out of memory) or the time
  share runs out; a table row per n.
- `pack_cache`: the run's compilation cache folder (JAX's executables, XLA's GEMM autotuning
  results, relpos's `'auto'` decisions) as one tar of at most --max_mib MiB for the device tool
  to bring back (16 MiB a file), so that the next session on the same kind of GPU starts from
  it (gpu_prepare.sh carries it): a build took 45 to 60 s on an H200, most of a session's
  minutes. The small files that save the most go first (the decisions, XLA's autotuning),
  then executables, smallest first, while they fit.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

_STEP_LINE = re.compile(r'^step (\d+)/')
_RESUMED_LINE = re.compile(r'resumed from .*/(\d+)\s*$', re.M)


def _last_line(text: str) -> str:
  lines = [line for line in text.splitlines() if line.strip()]
  return lines[-1].strip() if lines else '(no output)'


def split_runs(path) -> list[dict]:
  """{step: train/loss} of each run that wrote to a metrics.jsonl, in order: a resumed run
  appends from its checkpoint's step, so a new run begins where a logged loss's step is not
  after the one before it."""
  runs, last = [], None
  for line in Path(path).read_text().splitlines():
    record = json.loads(line) if line.strip() else {}
    if 'train/loss' not in record:
      continue
    step = int(record['step'])
    if last is None or step <= last:
      runs.append({})
    runs[-1][step], last = float(record['train/loss']), step
  return runs


def read_losses(path) -> dict:
  """{step: train/loss} of a metrics.jsonl; a step logged twice keeps its later value."""
  return {step: loss for run in split_runs(path) for step, loss in run.items()}


def compare_losses(
  want: dict, got: dict, tolerance=0.0, after=0, names=('reference', 'resumed')
) -> tuple[bool, list[str]]:
  """(passed, report lines): `got` ({step: loss}) against `want` at every step of `want` after
  `after`; `names` head the two columns."""
  if not want:
    return False, [f'RESULT: FAIL no {names[0]} losses to compare']
  missing = sorted(set(want) - set(got))
  if missing:
    return False, [f'RESULT: FAIL the {names[1]} losses lack steps {missing[:5]}']
  diffs = {step: abs(got[step] - want[step]) for step in want}
  worst = max(diffs, key=diffs.get)
  checked = [step for step in sorted(want) if step > after]
  lines = [f'| step | {names[0]} loss | {names[1]} loss |', '|---|---|---|']
  lines += [f'| {s} | {want[s]:.8f} | {got[s]:.8f} |' for s in checked]
  passed = diffs[worst] <= tolerance and bool(checked)
  verdict = 'identical' if diffs[worst] == 0 else f'max |diff| {diffs[worst]:.3g} at step {worst}'
  lines.append(
    f'RESULT: {"PASS" if passed else "FAIL"} losses after the resume at step {after}: '
    f'{len(checked)} logged steps, {verdict} (tolerance {tolerance:g})'
  )
  return passed, lines


def _wait_for_step(log: Path, process, step: int, deadline: float) -> int:
  """The first logged step >= `step` (0 if the process ended or time ran out first)."""
  while time.time() < deadline:
    text = log.read_text() if log.exists() else ''
    done = [int(m.group(1)) for m in map(_STEP_LINE.match, text.splitlines()) if m]
    if done and done[-1] >= step:
      return done[-1]
    if process.poll() is not None:
      return 0
    time.sleep(0.2)
  return 0


def resume(args, overrides) -> int:
  work = Path(args.work)
  logs = Path(args.logs or work)
  work.mkdir(parents=True, exist_ok=True)
  logs.mkdir(parents=True, exist_ok=True)
  deadline = time.time() + args.seconds
  train = [sys.executable, 'train.py', f'--config={args.config}', *overrides]

  def start(name, workdir):
    handle = open(logs / f'resume_{name}.log', 'a')  # noqa: SIM115 (the process writes it)
    return subprocess.Popen(
      [*train, f'--workdir={workdir}'], stdout=handle, stderr=subprocess.STDOUT
    ), logs / f'resume_{name}.log'

  run = work / 'run'
  victim, victim_log = start('interrupted', run)
  killed_at = _wait_for_step(victim_log, victim, args.kill_after, deadline)
  if not killed_at:
    victim.kill()
    print(f'RESULT: FAIL the run to interrupt never logged step {args.kill_after}')
    print(_last_line(victim_log.read_text()))
    return 1
  os.kill(victim.pid, signal.SIGKILL)
  victim.wait()
  print(f'killed (SIGKILL) the run after it logged step {killed_at}', flush=True)
  resumed, resumed_log = start('resumed', run)
  try:
    status = resumed.wait(timeout=max(1, deadline - time.time()))
  except subprocess.TimeoutExpired:
    resumed.kill()
    print(f'RESULT: FAIL out of time ({args.seconds:.0f} s) before the resumed run finished')
    print(_last_line(resumed_log.read_text()))
    return 1
  resumed_text = resumed_log.read_text()
  if status:
    print(f'RESULT: FAIL the resumed train.py exited {status}')
    print(_last_line(resumed_text))
    return 1
  found = _RESUMED_LINE.findall(resumed_text)
  if not found:
    print('RESULT: FAIL the second run did not say "resumed from ..."')
    return 1
  after = int(found[-1])
  runs = split_runs(run / 'metrics.jsonl')
  twice = {step: loss for step, loss in runs[0].items() if step > after} if runs else {}
  passed, lines = compare_losses(
    twice,
    runs[-1] if len(runs) > 1 else {},
    tolerance=args.tolerance,
    after=after,
    names=('before the kill', 'after the resume'),
  )
  print('\n'.join(lines), flush=True)
  final_metric = _last_line(resumed_text)
  print(f"RESULT: the resumed run's final evaluation: {final_metric}", flush=True)
  steps = [line for line in resumed_text.splitlines() if _STEP_LINE.match(line)]
  if steps:  # throughput, MFU (where the GPU's peak is known) and ETA of train.py itself
    print(f"RESULT: the resumed run's last progress line: {steps[-1].strip()}", flush=True)
  if time.time() > deadline - 5:
    print('RESULT: FAIL no time left for eval.py')
    return 1
  evaluation = subprocess.run(
    [sys.executable, 'eval.py', f'--config={args.config}', *overrides, f'--workdir={run}'],
    capture_output=True,
    text=True,
    timeout=max(1, deadline - time.time()),
  )
  (logs / 'resume_eval.log').write_text(evaluation.stdout + evaluation.stderr)
  metric = _last_line(evaluation.stdout)
  same = 'the same' if metric == final_metric else 'differs'
  print(
    f'RESULT: eval.py on the workdir (exit {evaluation.returncode}): {metric} ({same} as the '
    "resumed run's own)"
  )
  return 0 if passed and evaluation.returncode == 0 else 1


def oom(args, overrides) -> int:
  command = [sys.executable, 'train.py', f'--config={args.config}', *overrides]
  command.append(f'--workdir={args.work}')
  started = time.time()
  result = subprocess.run(command, capture_output=True, text=True, timeout=args.seconds)
  print(result.stdout[-4000:], result.stderr[-8000:], sep='\n')
  stderr_lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
  # relpos's one-line errors start with 'error:' (a hint line may follow); else the last line.
  errors = [line for line in stderr_lines if line.lower().startswith('error')]
  message = errors[-1] if errors else _last_line(result.stderr or result.stdout)
  expected = bool(re.search(args.expect, message, re.I))
  traceback = 'Traceback (most recent call last)' in result.stderr
  passed = result.returncode != 0 and expected and len(stderr_lines) <= args.max_lines
  print(
    f'RESULT: {"PASS" if passed else "FAIL"} exit {result.returncode} after '
    f'{time.time() - started:.0f} s, {len(stderr_lines)} stderr lines'
    f'{", a traceback" if traceback else ""}; message: {message[:400]}'
  )
  return 0 if passed else 1


def _temp_gib(compiled) -> str:
  """XLA's temporary memory of a compiled step in GiB ('' where the backend gives none)."""
  try:
    return f'{compiled.memory_analysis().temp_size_in_bytes / 2**30:.3f}'
  except Exception:  # no memory analysis on this backend
    return ''


def parse_starts(text: str) -> dict[str, int]:
  """`--starts`: 'implementation:n,...' (e.g. 'xla:4096,pallas:65536'), the n each
  implementation's doubling begins at instead of --start."""
  starts = {}
  for item in filter(None, text.split(',')):
    name, _, n = item.partition(':')
    if not n.isdigit():
      raise SystemExit(f'gpu_run: --starts takes implementation:n pairs, got {item!r}')
    starts[name.strip()] = int(n)
  return starts


def split_overrides(argv):
  """(the tool's own arguments, the `--config.FIELD=VALUE` overrides after a `--`)."""
  if '--' not in argv:
    return argv, []
  return argv[: argv.index('--')], argv[argv.index('--') + 1 :]


def char_config(path: str, overrides):
  """The character-LM config file at `path` with `--config.FIELD=VALUE` overrides applied, as
  ml_collections' config flag (train.py's) reads them; once per process (it defines the flag)."""
  from absl import flags
  from ml_collections import config_flags

  # sys_argv: the config flag finds its --config.FIELD overrides in the arguments given here,
  # not in sys.argv (its default), so that a caller's own arguments are what count.
  argv = [sys.argv[0], f'--config={path}', *overrides]
  config_flag = config_flags.DEFINE_config_file(
    'config', None, 'A character-LM config.', sys_argv=argv
  )
  flags.FLAGS(argv)
  return config_flag.value


def long_context(args, overrides) -> int:
  import jax
  import jax.numpy as jnp
  import ml_collections
  import numpy as np

  from relpos.training.char_lm_task import build, train_step_fn
  from relpos.training.mesh import data_mesh

  config = char_config(args.config, overrides)
  mesh = data_mesh()
  combos = [(p, i) for p in args.positions.split(',') for i in args.implementations.split(',')]
  starts = parse_starts(args.starts)
  end = time.time() + args.seconds
  model = config.model
  print(
    f'{jax.devices()[0].device_kind}; {model.num_layers} layers, d_model {model.d_model}, '
    f'{model.dtype}'
  )
  print('| position | implementation | n = tgt_len = mem_len | ms / step | temp GiB | result |')
  print('|---|---|---|---|---|---|', flush=True)
  largest, stops = {}, {}
  for index, (position, implementation) in enumerate(combos):
    share_end = time.time() + (end - time.time()) / (len(combos) - index)
    n, last_seconds, compiled = starts.get(implementation, args.start), 0.0, None
    while True:
      if n > args.max:
        stops[position, implementation] = f'{n} not tried (--max={args.max})'
        break
      if last_seconds and time.time() + 3 * last_seconds > share_end:
        print(f'| {position} | {implementation} | {n} | | | not tried: time share spent |')
        stops[position, implementation] = f'{n} not tried (time)'
        break
      variant = ml_collections.ConfigDict(config.to_dict())
      variant.model.update(position=position, attention_implementation=implementation)
      variant.train.update(batch_size=mesh.size, tgt_len=n, mem_len=n)
      started = time.time()
      try:
        _, graphdef, state = build(variant, 256, mesh)
        step = train_step_fn(variant, graphdef, mesh)
        tokens = np.random.default_rng(0).integers(0, 256, (mesh.size, n + 1))
        batch = (jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:]))
        compiled = step.lower(state, batch).compile()
        memory = _temp_gib(compiled)
        state, sums = compiled(state, batch)
        jax.block_until_ready(sums)
        timed = time.time()
        for _ in range(2):
          state, sums = compiled(state, batch)
        loss = float(jax.block_until_ready(sums)['loss'])
        ms = (time.time() - timed) / 2 * 1e3
        row = f'{ms:.1f} | {memory} | ok, loss sum {loss:.4g}'
        print(f'| {position} | {implementation} | {n} | {row} |')
        largest[(position, implementation)] = n
      except Exception as error:  # out of memory, most often: the row says which
        message = str(error).strip().splitlines()[0][:200] if str(error).strip() else ''
        print(f'| {position} | {implementation} | {n} | | | {type(error).__name__}: {message} |')
        stops[position, implementation] = f'{n} failed ({type(error).__name__})'
        break
      finally:
        state = sums = compiled = None
        jax.clear_caches()
      sys.stdout.flush()
      last_seconds = time.time() - started
      n *= 2
  for (position, implementation), stop in stops.items():
    n = largest.get((position, implementation))
    print(f'RESULT: {position} {implementation}: trains at n = {n}; {stop}')
  return 0 if largest else 1


def pack_cache(args, overrides) -> int:
  del overrides
  cache, out = Path(args.cache), Path(args.out)
  files = sorted(p for p in cache.rglob('*') if p.is_file()) if cache.is_dir() else []

  def rank(path):  # the decisions and XLA's autotuning first, then the smaller executables
    small = path.suffix == '.json' or 'autotune' in str(path.relative_to(cache))
    return (not small, path.stat().st_size)

  chosen, total = [], 0
  for path in sorted(files, key=rank):
    size = path.stat().st_size
    if total + size <= args.max_mib * 2**20:
      chosen.append(path)
      total += size
  out.parent.mkdir(parents=True, exist_ok=True)
  partial = out.with_name(out.name + '.partial')
  with tarfile.open(partial, 'w') as tar:
    for path in chosen:
      tar.add(path, arcname=str(path.relative_to(cache)))
  partial.replace(out)
  print(
    f'compilation cache: {len(chosen)} of {len(files)} files ({total / 2**20:.1f} MiB) in '
    f'{out.name}'
  )
  return 0


def main(argv) -> int:
  argv, overrides = split_overrides(argv)
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  commands = parser.add_subparsers(dest='command', required=True)
  losses = commands.add_parser('losses')
  losses.add_argument('reference')
  losses.add_argument('resumed')
  losses.add_argument('--tolerance', type=float, default=0.0)
  losses.add_argument('--after', type=int, default=0)
  pack = commands.add_parser('pack_cache')
  pack.add_argument('--cache', required=True)
  pack.add_argument('--out', required=True)
  pack.add_argument('--max_mib', type=float, default=15)
  for name in ('resume', 'oom', 'long_context'):
    command = commands.add_parser(name)
    command.add_argument('--config', required=True)
    command.add_argument('--work', default='gpu_run_work')
    command.add_argument('--logs', default=None)
    command.add_argument('--seconds', type=float, default=200)
    command.add_argument('--kill_after', type=int, default=130)
    command.add_argument('--tolerance', type=float, default=0.0)
    command.add_argument('--max_lines', type=int, default=3)
    command.add_argument('--expect', default='memory|RESOURCE_EXHAUSTED')
    command.add_argument('--positions', default='xl,shaw')
    command.add_argument('--implementations', default='pallas,xla')
    command.add_argument('--start', type=int, default=4096)
    command.add_argument('--starts', default='')
    command.add_argument('--max', type=int, default=131072)
  args = parser.parse_args(argv)
  if args.command == 'losses':
    passed, lines = compare_losses(
      read_losses(args.reference), read_losses(args.resumed), args.tolerance, args.after
    )
    print('\n'.join(lines))
    return 0 if passed else 1
  commands = {'resume': resume, 'oom': oom, 'long_context': long_context, 'pack_cache': pack_cache}
  return commands[args.command](args, overrides)


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
