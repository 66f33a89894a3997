"""Where a jitted step's time goes: a few calls traced with `jax.profiler`, each device op's
time summed by what the op is (matmuls, the attention kernels, layout copies, reductions,
elementwise fusions, collectives, host-device copies) and by the pass it belongs to (forward,
backward, the rest: loss, optimizer update), beside the time the device sat idle.

The step benchmarks call it with `--profile_steps=N` (benchmarks/char_lm_step.py,
benchmarks/translate_step.py), after their timings, once per variant:

    python benchmarks/char_lm_step.py --config=configs/enwik8_base.py --variants=xl,xl_xla \
      --config.model.dtype=bfloat16 --profile_steps=3

How an op is classified: the trace names each device op by its HLO instruction (the event's
`hlo_op` stat, or the `hlo_op=` of its annotation; else the event keeps its own name, a CUDA
kernel's, and is classified by that name: `category_of_name`); the compiled module's text
(`compiled.as_text()`) says what that instruction is: its opcode, a fusion's kind and the ops of
its fused computation (a fusion with xors and logical right shifts, threefry's or
relpos.counter_hash's, draws random bits: dropout's masks, and whatever the fusion computes
beside them), a custom call's target (`__gpu$xla.gpu.triton` and Mosaic GPU for Pallas kernels,
cuDNN's fused attention, cuBLAS GEMMs), and its `op_name` metadata, where JAX writes
`transpose(jvp(...))` for the backward pass and `jvp(...)` for the forward pass of a
differentiated function.

Which trace events count: on a GPU the kernels on the device plane's stream lines (`Stream
#...`); on a TPU its `XLA Ops` line; on a CPU the XLA thunks on the host's `tf_XLA...` thread
lines. Ops on different streams or CPU threads may overlap, so the table gives each category's
summed op time per step and, separately, the device's busy time (the union of the op
intervals) against the step's wall time; the rest is idle: launch gaps, waiting on the host,
the input pipeline. The traces stay in `--profile_dir` when it is given (TensorBoard's or
xprof's profile plugin, or Perfetto, read them).
"""

import collections
import dataclasses
import os
import re
import tempfile
import time
from pathlib import Path

import hlo_cost
import jax
from absl import flags

PROFILE_STEPS = flags.DEFINE_integer(
  'profile_steps',
  0,
  'After the timings, trace this many steps of each variant and print where '
  'the time goes (benchmarks/step_profile.py); 0: no profile.',
  lower_bound=0,
)
PROFILE_DIR = flags.DEFINE_string(
  'profile_dir', None, 'Keep the --profile_steps traces here, one folder per variant.'
)


def profile_dir_problem(steps: int, directory: str | None) -> str | None:
  """What is wrong with --profile_dir for --profile_steps=`steps`, or None: it is checked
  with the flags, not when the first trace is written after all the timings. A folder given
  without --profile_steps would stay empty; one that cannot be made (a file in its path, a
  parent this user may not write to) would fail in jax.profiler after the table."""
  if directory is None:
    return None
  if not steps:
    return f'--profile_dir={directory} keeps traces of --profile_steps: give --profile_steps=N'
  path = Path(directory).absolute()
  existing = next(p for p in (path, *path.parents) if p.exists())
  if not existing.is_dir():
    return f'--profile_dir={directory}: {existing} is not a folder'
  if not os.access(existing, os.W_OK | os.X_OK):
    return f'--profile_dir={directory}: {existing} is not writable'
  return None


def _check_profile_dir(values: dict) -> bool:
  if problem := profile_dir_problem(values['profile_steps'], values['profile_dir']):
    raise flags.ValidationError(problem)
  return True


flags.register_multi_flags_validator(['profile_steps', 'profile_dir'], _check_profile_dir)
# A category per op, first match wins (`category`); the order of the printed table.
CATEGORIES = (
  'attention kernels (Pallas, cuDNN)',
  'matmuls',
  'random bits (dropout)',
  'gather, scatter',
  'layout copies, transposes',
  'reductions',
  'elementwise fusions',
  'collectives',
  'host-device copies',
  'other',
)
PASSES = ('forward', 'backward', 'rest (loss, update)')
_COLLECTIVES = ('all-reduce', 'all-gather', 'reduce-scatter', 'collective-permute', 'all-to-all')
_KERNEL_TARGETS = ('triton', 'mosaic', 'cudnn$fmha', 'tpu_custom_call')
_MATMUL_TARGETS = ('gemm', 'cublas', 'matmul')
# What threefry2x32's rounds (add, a rotation's two shifts and or, xor) and murmur3's finaliser
# (xor-shifts and multiplies: relpos.counter_hash) share: a fusion holding both hashes counters
# into random bits, dropout's masks in a training step (their floor: docs/gpu.md, "Dropout's
# random bits in the floor").
_RANDOM_BITS_OPCODES = frozenset({'xor', 'shift-right-logical'})


@dataclasses.dataclass(frozen=True)
class Instruction:
  """One HLO instruction of the compiled module: its opcode, a fusion's kind and called
  computation, a custom call's target, the JAX op name it came from."""

  opcode: str
  kind: str = ''
  calls: str = ''
  target: str = ''
  op_name: str = ''


def _attribute(text: str, key: str) -> str:
  match = re.search(rf'\b{key}=(?:"(?P<quoted>[^"]*)"|%?(?P<bare>[\w.\-$]+))', text)
  return (match['quoted'] if match['quoted'] is not None else match['bare']) if match else ''


def parse_hlo(text: str) -> tuple[dict[str, Instruction], dict[str, list[str]]]:
  """({instruction name: Instruction}, {computation name: its instructions' opcodes}) of a
  compiled HLO module's text (read by hlo_cost.parse)."""
  module = hlo_cost.parse(text)
  instructions, computations = {}, {}
  for computation, body in module.computations.items():
    computations[computation] = [instruction.opcode for instruction in body]
    for instruction in body:
      attributes = instruction.attributes
      instructions[instruction.name] = Instruction(
        opcode=instruction.opcode,
        kind=_attribute(attributes, 'kind'),
        calls=_attribute(attributes, 'calls'),
        target=_attribute(attributes, 'custom_call_target'),
        op_name=_attribute(attributes, 'op_name'),
      )
  return instructions, computations


def category(instruction: Instruction | None, computations: dict[str, list[str]]) -> str:
  """Which of CATEGORIES an op is (None: an event the module does not name, 'other')."""
  if instruction is None:
    return 'other'
  opcode, target = instruction.opcode, instruction.target.lower()
  inner = set(computations.get(instruction.calls, ()))
  if opcode == 'custom-call' and any(t in target for t in _KERNEL_TARGETS):
    return 'attention kernels (Pallas, cuDNN)'
  if (
    opcode in ('dot', 'convolution')
    or (opcode == 'custom-call' and any(t in target for t in _MATMUL_TARGETS))
    or inner & {'dot', 'convolution'}
  ):
    return 'matmuls'
  if opcode == 'fusion' and _RANDOM_BITS_OPCODES <= inner:
    return 'random bits (dropout)'
  if opcode in ('gather', 'scatter') or inner & {'gather', 'scatter'}:
    return 'gather, scatter'
  if opcode.removesuffix('-start').removesuffix('-done') in _COLLECTIVES:
    return 'collectives'
  if opcode in ('copy', 'transpose', 'copy-start', 'copy-done') or (
    inner and set(inner) - {'parameter', 'bitcast'} <= {'copy', 'transpose', 'reshape'}
  ):
    return 'layout copies, transposes'
  if opcode in ('reduce', 'reduce-window') or inner & {'reduce', 'reduce-window'}:
    return 'reductions'
  if opcode == 'fusion':
    return 'elementwise fusions'
  return 'other'


def pass_of(instruction: Instruction | None) -> str:
  """Which of PASSES an op's JAX op name puts it in."""
  op_name = instruction.op_name if instruction else ''
  if 'transpose(' in op_name:
    return 'backward'
  if 'jvp(' in op_name:
    return 'forward'
  return 'rest (loss, update)'


@dataclasses.dataclass(frozen=True)
class Event:
  """One op's run in the trace: its HLO instruction (or the event's own name), start, length,
  and the event's own name where it differs from the op (the CUDA kernel a custom call
  launched: a Pallas kernel's name, which its instruction name does not say)."""

  op: str
  start_ns: float
  duration_ns: float
  kernel: str = ''


_HLO_OP_IN_TEXT = re.compile(r'hlo_op=([^,#\s]+)')


def _op_of(name: str, stats: dict) -> str:
  """The HLO instruction a device event ran: its `hlo_op` stat, else one named in a string
  stat (XLA:GPU annotates kernel launches as 'NAME#hlo_op=...,hlo_module=...#'), else the
  event's own name (a CUDA kernel's, or a copy's)."""
  if stats.get('hlo_op'):
    return str(stats['hlo_op'])
  for value in stats.values():
    if isinstance(value, str) and (match := _HLO_OP_IN_TEXT.search(value)):
      return match[1]
  return name


# Where an event names no instruction of the module (a CUDA kernel's own name), its category by
# name, first match wins.
_NAMED = (
  ('memcpy', 'host-device copies'),
  ('memset', 'other'),
  ('gemm', 'matmuls'),
  ('cublas', 'matmuls'),
  ('cutlass', 'matmuls'),
  ('xmma', 'matmuls'),
  ('nvjet', 'matmuls'),
  ('shaw_', 'attention kernels (Pallas, cuDNN)'),
  ('xl_', 'attention kernels (Pallas, cuDNN)'),
  ('mha', 'attention kernels (Pallas, cuDNN)'),
  ('fmha', 'attention kernels (Pallas, cuDNN)'),
  ('nccl', 'collectives'),
  ('transpose', 'layout copies, transposes'),
  ('copy', 'layout copies, transposes'),
  ('reduce', 'reductions'),
  ('fusion', 'elementwise fusions'),
)


def category_of_name(name: str) -> str:
  """The category of an event that names no instruction of the module, by its name."""
  lowered = name.lower()
  return next((cat for key, cat in _NAMED if key in lowered), 'other')


def device_events(trace_dir: str | Path) -> tuple[list[Event], list[str]]:
  """(the ops' events, the names of the trace lines they came from) of the newest trace under
  `trace_dir`; lines as the module docstring says, per platform."""
  from jax.profiler import ProfileData

  paths = sorted(Path(trace_dir).rglob('*.xplane.pb'), key=lambda p: p.stat().st_mtime)
  if not paths:
    raise FileNotFoundError(f'no *.xplane.pb under {trace_dir}: did the trace run?')
  data = ProfileData.from_file(str(paths[-1]))
  events, lines = [], []
  for plane in data.planes:
    chosen = []
    if plane.name.startswith('/device:'):
      plane_lines = list(plane.lines)
      streams = [line for line in plane_lines if line.name.startswith('Stream')]
      ops = [line for line in plane_lines if line.name == 'XLA Ops']
      chosen = streams or ops
    elif plane.name == '/host:CPU' and not any(p.name.startswith('/device:') for p in data.planes):
      chosen = [line for line in plane.lines if line.name.startswith('tf_XLA')]
    for line in chosen:
      found = 0
      for event in line.events:
        if event.duration_ns <= 0:
          continue
        stats = dict(event.stats)
        if not plane.name.startswith('/device:') and 'hlo_op' not in stats:
          continue  # a CPU thread's bookkeeping, not an XLA op
        op = _op_of(event.name, stats)
        kernel = event.name if event.name != op else ''
        events.append(Event(op, float(event.start_ns), float(event.duration_ns), kernel))
        found += 1
      if found:
        lines.append(f'{plane.name} {line.name}')
  return events, _grouped(lines)


def _grouped(lines: list[str]) -> list[str]:
  """'PLANE: LINE, LINE' per plane, CPU thread lines counted rather than named."""
  planes = collections.defaultdict(list)
  for line in lines:
    plane, name = line.split(' ', 1)
    planes[plane].append(name)
  return [
    f'{plane}: {len(names)} XLA threads' if plane == '/host:CPU' else f'{plane}: {", ".join(names)}'
    for plane, names in planes.items()
  ]


def busy_ns(events: list[Event]) -> float:
  """The length of the union of the events' intervals."""
  total, end = 0.0, float('-inf')
  for event in sorted(events, key=lambda e: e.start_ns):
    stop = event.start_ns + event.duration_ns
    if stop > end:
      total += stop - max(event.start_ns, end)
      end = stop
  return total


@dataclasses.dataclass
class Profile:
  """What `profile` measured, per step: seconds by category, by pass, by op, busy and wall."""

  steps: int
  wall_s: float
  busy_s: float
  by_category: dict[str, float]
  by_pass: dict[str, float]
  by_op: list[tuple[str, str, float]]  # (op, category, seconds per step), longest first
  lines: list[str]
  kernels: dict[str, str] = dataclasses.field(default_factory=dict)  # op -> its kernel's name

  def table(self, *, top: int = 8) -> str:
    """Markdown: the categories and passes with ms per step and % of the step's wall time,
    the busy/idle line, and the `top` longest ops."""
    per_step = self.wall_s * 1e3

    def row(name, seconds):
      return f'| {name} | {seconds * 1e3:.2f} | {100 * seconds * 1e3 / per_step:.1f} |'

    out = [
      f'profile of {self.steps} step{"s" if self.steps != 1 else ""}: wall {per_step:.2f} '
      f'ms/step; device busy '
      f'{self.busy_s * 1e3:.2f} ms/step ({100 * self.busy_s / self.wall_s:.1f}%), idle '
      f'{(self.wall_s - self.busy_s) * 1e3:.2f} ms/step (launch gaps, host, input)',
      '',
      '| op category | ms / step | % of step |',
      '|---|---|---|',
      *(row(name, s) for name, s in self.by_category.items() if s > 0),
      '',
      '| pass | ms / step | % of step |',
      '|---|---|---|',
      *(row(name, s) for name, s in self.by_pass.items() if s > 0),
      '',
      f'| longest ops (of {len(self.by_op)}) | category | ms / step | % of step |',
      '|---|---|---|---|',
      *(
        f'| {op}{f" ({self.kernels[op][:80]})" if self.kernels.get(op) else ""} | {cat} '
        f'| {s * 1e3:.3f} | {100 * s * 1e3 / per_step:.1f} |'
        for op, cat, s in self.by_op[:top]
      ),
      '',
      f'counted trace lines: {", ".join(self.lines)}',
    ]
    return '\n'.join(out)


def summarize(
  events: list[Event], hlo_text: str, *, steps: int, wall_s: float, lines=()
) -> Profile:
  """A Profile of traced `events` of `steps` steps taking `wall_s` seconds in all, classified
  with the compiled module's `hlo_text`."""
  instructions, computations = parse_hlo(hlo_text)
  by_op, kernels = collections.Counter(), {}
  for event in events:
    by_op[event.op] += event.duration_ns * 1e-9 / steps
    if event.kernel:
      kernels.setdefault(event.op, event.kernel)
  by_category = dict.fromkeys(CATEGORIES, 0.0)
  by_pass = dict.fromkeys(PASSES, 0.0)
  rows = []
  for op, seconds in by_op.most_common():
    instruction = instructions.get(op)
    cat = category(instruction, computations) if instruction else category_of_name(op)
    by_category[cat] += seconds
    by_pass[pass_of(instruction)] += seconds
    rows.append((op, cat, seconds))
  return Profile(
    steps=steps,
    wall_s=wall_s / steps,
    busy_s=busy_ns(events) * 1e-9 / steps,
    by_category=by_category,
    by_pass=by_pass,
    by_op=rows,
    lines=list(lines),
    kernels=kernels,
  )


def compiled_text(jitted, *args):
  """A zero-argument function giving the compiled module's text of `jitted` on arguments shaped
  like `args` (their shapes, dtypes and mesh shardings are taken now, so donating or deleting
  the arrays later does not matter; an array on one device leaves its placement to `jitted`,
  as a call does; the compile comes from JAX's caches where it can)."""

  def abstract(x):
    sharding = getattr(x, 'sharding', None)
    keep = isinstance(sharding, jax.sharding.NamedSharding)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding if keep else None)

  shapes = jax.tree.map(abstract, args)
  return lambda: jitted.lower(*shapes).compile().as_text()


def print_profiles(calls: dict, texts: dict, *, steps: int, trace_dir=None) -> None:
  """Profiles each of `calls` ({name: zero-argument step}) for `steps` calls and prints its
  tables under a `### profile: name` heading; `texts` has each name's `compiled_text`
  function(s) (several modules: a translation pass over batches of several shapes, where an
  instruction name two modules share takes the first module's classification); each trace is
  kept under `trace_dir`/name when given."""
  for name, call in calls.items():
    functions = texts[name] if isinstance(texts[name], (list, tuple)) else [texts[name]]
    modules = {function: function() for function in dict.fromkeys(functions)}  # each once
    text = '\n'.join(dict.fromkeys(modules.values()))
    where = None if trace_dir is None else Path(trace_dir) / re.sub(r'[^\w.=-]+', '_', name)
    print(f'\n### profile: {name}\n')
    summary = profile(call, text, steps=steps, trace_dir=where)
    print(summary.table())
    run = [modules[function] for function in functions]  # as often as the call runs each
    if line := floor_line(run, name, summary.wall_s, jax.devices()[0].device_kind):
      print(line)


def floor_line(hlo_texts, name: str, step_seconds: float, device_kind: str) -> str | None:
  """The call's floor on this device beside its measured time: hlo_cost.roofline of each
  compiled module it runs (`hlo_texts`: one module's text, or a list with a text per module
  run, a translation pass's per batch), summed; None where hlo_cost has no figures for the
  device. A variant named 'mosaic' counts its lax.cond's kernel branch (mosaic_dispatch)."""
  device = hlo_cost.device_for(device_kind)
  texts = [hlo_texts] if isinstance(hlo_texts, str) else list(hlo_texts)
  if device is None or not texts:
    return None
  branches = 'cheapest' if 'mosaic' in name else 'dearest'
  rooflines = {
    text: hlo_cost.roofline(hlo_cost.parse(text), device, branches=branches)
    for text in dict.fromkeys(texts)
  }
  floor = sum(rooflines[text].seconds for text in texts)
  # The ALU-bound launches: dropout's random bits, beside the profile's category of them.
  bits = sum(rooflines[text].kinds['ALU-bound'][3] for text in texts)
  modules = '' if len(texts) == 1 else f' over its {len(texts)} module runs'
  of_which = f' (ALU-bound, random bits: {bits * 1e3:.2f} ms)' if bits else ''
  return (
    f'floor on the {device.name} (benchmarks/hlo_cost.py: each kernel at the longest of its '
    'matmuls at the data-sheet peak, its bytes at the bandwidth and its elementwise operations '
    "at the SMs' issue rate; custom calls' arithmetic "
    f'not counted){modules}: {floor * 1e3:.2f} ms a step{of_which}; this step took '
    f'{step_seconds * 1e3:.2f} ms, {step_seconds / floor:.2f}x its floor'
  )


def profile(call, hlo_text: str, *, steps: int, trace_dir: str | Path | None = None) -> Profile:
  """Runs `call()` (one step, already compiled and warmed up; it returns an array to wait on)
  `steps` times under `jax.profiler.trace` and summarizes the trace against `hlo_text`, the
  step's compiled module. The trace goes to `trace_dir` (kept) or a temporary folder."""
  with tempfile.TemporaryDirectory() as scratch:
    directory = Path(trace_dir or scratch)
    jax.block_until_ready(call())
    with jax.profiler.trace(str(directory)):
      start = time.perf_counter()
      for _ in range(steps):
        out = call()
      jax.block_until_ready(out)
      wall = time.perf_counter() - start
    events, lines = device_events(directory)
  return summarize(events, hlo_text, steps=steps, wall_s=wall, lines=lines)
