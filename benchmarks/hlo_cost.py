"""What a compiled HLO module launches, and the least time each launch can take: a roofline read
from the optimized module's text, for a GPU that is not at hand.

A GPU runs a compiled XLA module as a sequence of kernels (fusions, custom calls, unfused
copies). None can take less than the longer of its arithmetic at the tensor cores' peak and its
memory traffic at the memory's bandwidth, so the sum of those over a step is a floor under the
step's time, and its breakdown says where a step must spend it (matmuls, memory-bound fusions,
layout copies) before anything is measured. A third term, a fusion's elementwise operations at
the SMs' issue rate, is an estimate rather than a bound (below): it puts dropout's random bits,
otherwise free beside their few bytes, into the floor. `benchmarks/gpu_compile.py step` prints
the floor for the char LM's step compiled for a compile-only H100.

How each launch is counted (`launch_cost`):

- Bytes: every operand read once and the result written once, except where the fused
  computation shows less: an operand used only through slices or dynamic slices is read as
  those slices, and a fusion whose root is a dynamic-update-slice writes in place (the buffer it
  updates is neither read nor rewritten: only the update is written).
- FLOPs: the matmuls only, 2·m·n·k each (`dot`s inside a fusion, cuBLAS GEMM custom calls),
  at the bf16 peak for 16-bit operands and the float32 (TF32) peak otherwise.
- Elementwise operations (since 2026-11-28): each elementwise instruction of a fused
  computation once per element of its result, a reduction once per element it reads, a
  transcendental (exp, log, tanh, rsqrt, divide, ...) `TRANSCENDENTAL_COST` times (Hopper's
  special-function units issue 16 a clock per SM against 128 for the rest), at the SMs' issue
  rate (`Device.elementwise_ops`). Most fusions are far below it, so their floor stays their
  bytes; the ones above it (`ALU-bound`) are dropout's random bits: threefry2x32 is about 130
  integer operations per random word, and a step of enwik8_base draws 0.4 G words. It is an
  estimate, not a bound: the compiler folds some operations together (a rotation's two shifts
  and an or are one funnel shift, chained logic ops one LOP3), while integer ops issue at half
  the rate on Hopper (64 INT32 lanes per SM).
- Custom calls other than GEMMs (Pallas/Triton and Mosaic kernels, cuDNN attention) count their
  operands' and results' bytes and no FLOPs: their floor is a lower bound that knows nothing of
  their arithmetic (kernel_cost.py models the kernels themselves).
- Asynchronous fusions: a `fusion-start` is costed as the fusion it wraps (its result, the
  tuple's second element), and its `fusion-done` launches nothing.
- Loops: a while loop's body counts its known trip count times (XLA's `known_trip_count`), once
  where none is recorded. A conditional counts its most expensive branch (or, asked, its
  cheapest).

What a floor leaves out, so a real step is slower: launch gaps (`launches` says how many), caches
(an operand that stays in L2 is read from memory here), kernels below their roofline (small
GEMMs, untuned tiles), and copies between host and device. A layout copy, counted here like any
fusion, is a cost XLA chose, not one the model needs.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator

from relpos.flops import PEAK_DTYPES, device_peak

# Bytes per element of HLO's element types; an unknown one counts 4.
ELEMENT_BYTES = {
  'pred': 1,
  's4': 0.5,
  'u4': 0.5,
  's8': 1,
  'u8': 1,
  'f8e4m3fn': 1,
  'f8e5m2': 1,
  's16': 2,
  'u16': 2,
  'f16': 2,
  'bf16': 2,
  's32': 4,
  'u32': 4,
  'f32': 4,
  's64': 8,
  'u64': 8,
  'f64': 8,
  'c64': 8,
  'c128': 16,
}
HALF_PRECISION = ('bf16', 'f16', 'f8e4m3fn', 'f8e5m2')
# Instructions that launch nothing: they name, view or bundle buffers.
FREE_OPCODES = frozenset(
  {
    'parameter',
    'get-tuple-element',
    'tuple',
    'bitcast',
    'constant',
    'after-all',
    'partition-id',
    'replica-id',
    'opt-barrier',
    'add-dependency',
    # The second half of an asynchronous fusion: it waits for the `fusion-start`, whose launch
    # carries the work (`launch_cost`).
    'fusion-done',
  }
)
KINDS = ('matmul', 'memory-bound', 'ALU-bound', 'layout copy', 'custom call')
# Elementwise opcodes, counted once per element of their result (module docstring); the
# transcendental ones TRANSCENDENTAL_COST times.
TRANSCENDENTAL_OPCODES = frozenset(
  {
    'exponential',
    'exponential-minus-one',
    'log',
    'log-plus-one',
    'logistic',
    'tanh',
    'rsqrt',
    'sqrt',
    'cbrt',
    'sine',
    'cosine',
    'tan',
    'atan2',
    'power',
    'divide',
    'remainder',
    'erf',
  }
)
ELEMENTWISE_OPCODES = TRANSCENDENTAL_OPCODES | frozenset(
  {
    'add',
    'subtract',
    'multiply',
    'negate',
    'abs',
    'sign',
    'maximum',
    'minimum',
    'clamp',
    'compare',
    'select',
    'convert',
    'and',
    'or',
    'xor',
    'not',
    'shift-left',
    'shift-right-logical',
    'shift-right-arithmetic',
    'popcnt',
    'count-leading-zeros',
    'floor',
    'ceil',
    'round-nearest-afz',
    'round-nearest-even',
    'is-finite',
  }
)
TRANSCENDENTAL_COST = 8

_HEADER = re.compile(r'^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$')
_INSTRUCTION = re.compile(r'^(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*)$')
_ARRAY = re.compile(r'(\w+)\[([\d,]*)\]')
_CALLS = re.compile(r'calls=%?([\w.\-]+)')
_LOOP_PARTS = re.compile(r'(?:body|condition)=%?([\w.\-]+)')
_BRANCHES = re.compile(r'branch_computations=\{([^}]*)\}')
_TRUE_FALSE = re.compile(r'(?:true_computation|false_computation)=%?([\w.\-]+)')
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_CONTRACTING = re.compile(r'lhs_contracting_dims=\{([\d,]*)\}')
_GEMM_CONTRACTING = re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_COPY_BODY = re.compile(r'calls=%?(?:fused|wrapped)_(?:copy|transpose)')


@dataclasses.dataclass(frozen=True)
class Instruction:
  """One HLO instruction: `name = shape opcode(operands), attributes`."""

  name: str
  shape: str
  opcode: str
  operands: tuple[str, ...]
  attributes: str
  operand_text: str = ''  # what the parentheses hold: a parameter's index, a constant's value

  @property
  def called(self) -> list[str]:
    """The computations a fusion or custom call applies (`calls=`)."""
    return _CALLS.findall(self.attributes)

  @property
  def op_name(self) -> str:
    """The JAX operation it came from (its metadata's op_name), or ''."""
    match = _OP_NAME.search(self.attributes)
    return match.group(1) if match else ''


@dataclasses.dataclass
class Module:
  """A compiled module's computations {name: [Instruction]}, its entry computation's name,
  every instruction's result shape by name (names are unique across the module) and each
  computation's ROOT instruction."""

  computations: dict[str, list[Instruction]]
  entry: str | None
  shapes: dict[str, str]
  roots: dict[str, str] = dataclasses.field(default_factory=dict)  # {computation: ROOT's name}


def parse(text: str) -> Module:
  """The computations of an HLO module's text (`compiled.as_text()`)."""
  computations, shapes, roots, entry, current = {}, {}, {}, None, None
  for line in text.splitlines():
    if line and not line[0].isspace() and (header := _HEADER.match(line)):
      current = header.group(1)
      computations[current] = []
      if line.startswith('ENTRY'):
        entry = current
      continue
    stripped = line.strip()
    if current is None or not (match := _INSTRUCTION.match(stripped)):
      continue
    name, shape, opcode, rest = match.groups()
    operand_text = rest.split(')', 1)[0]
    operands = tuple(re.findall(r'%([\w.\-]+)', operand_text))
    attributes = rest.split(')', 1)[1] if ')' in rest else ''
    instruction = Instruction(name, shape, opcode, operands, attributes, operand_text)
    computations[current].append(instruction)
    shapes[name] = shape
    if stripped.startswith('ROOT'):
      roots[current] = name
  return Module(computations, entry, shapes, roots)


def arrays(shape: str) -> list[tuple[str, tuple[int, ...]]]:
  """The (element type, dimensions) of every array in a shape's text (a tuple has several)."""
  return [
    (element, tuple(int(d) for d in dims.split(',') if d))
    for element, dims in _ARRAY.findall(shape)
  ]


def shape_bytes(shape: str) -> float:
  """Bytes of every array in a shape's text."""
  return sum(math.prod(dims) * ELEMENT_BYTES.get(element, 4) for element, dims in arrays(shape))


@dataclasses.dataclass(frozen=True)
class Launch:
  """A launching instruction, how many times a step runs it, and the conditional branches it
  sits in ((conditional name, branch index), ... outermost first; () outside any)."""

  instruction: Instruction
  times: int
  branch: tuple[tuple[str, int], ...] = ()


def branch_names(conditional: Instruction) -> list[str]:
  """A conditional's branch computations, in order (true then false for a predicate)."""
  names = _TRUE_FALSE.findall(conditional.attributes)
  for listed in _BRANCHES.findall(conditional.attributes):
    names += [b.strip().lstrip('%') for b in listed.split(',') if b.strip()]
  return names


def launches(module: Module) -> Iterator[Launch]:
  """Every launching instruction reachable from the entry: fusions, custom calls and unfused
  operations, through while loops (times their known trip count), calls and conditionals."""

  def walk(computation: str, times: int, branch: tuple) -> Iterator[Launch]:
    for instruction in module.computations.get(computation, ()):
      if instruction.opcode in FREE_OPCODES:
        continue
      if instruction.opcode == 'while':
        trip = _TRIP_COUNT.search(instruction.attributes)
        count = times * (int(trip.group(1)) if trip else 1)
        for part in _LOOP_PARTS.findall(instruction.attributes):
          yield from walk(part, count, branch)
      elif instruction.opcode == 'conditional':
        for index, name in enumerate(branch_names(instruction)):
          yield from walk(name, times, branch + ((instruction.name, index),))
      elif instruction.opcode == 'call':
        for name in instruction.called:
          yield from walk(name, times, branch)
      else:
        yield Launch(instruction, times, branch)

  if module.entry is not None:
    yield from walk(module.entry, 1, ())


def kind(instruction: Instruction, module: Module) -> str:
  """A GEMM, a layout copy or transpose, another custom call, or memory-bound: its KINDS entry
  before a device is known (`Cost.kind_on` tells 'ALU-bound' launches from memory-bound ones)."""
  instruction = _as_fusion(instruction)
  return _kind(instruction, _matmul_flops(instruction, module)[0])


def _kind(instruction: Instruction, matmul_flops: float) -> str:
  if matmul_flops:
    return 'matmul'
  if instruction.opcode in ('copy', 'transpose') or _COPY_BODY.search(instruction.attributes):
    return 'layout copy'
  if instruction.opcode == 'custom-call':
    return 'custom call'
  return 'memory-bound'


def _computation_instructions(module: Module, name: str, seen=None) -> Iterator[Instruction]:
  """The instructions of computation `name` and of the computations they call, each once."""
  seen = set() if seen is None else seen
  if name in seen:
    return
  seen.add(name)
  for instruction in module.computations.get(name, ()):
    yield instruction
    for called in instruction.called:
      yield from _computation_instructions(module, called, seen)


def _dot_flops(dot: Instruction, module: Module) -> tuple[float, str]:
  """(2·m·n·k FLOPs, the lhs element type) of one `dot`; (0, '') where its shapes are unread."""
  contracting = _CONTRACTING.search(dot.attributes)
  lhs = arrays(module.shapes.get(dot.operands[0], '')) if dot.operands else []
  result = arrays(dot.shape)
  if not contracting or not lhs or not result:
    return 0.0, ''
  dims = lhs[0][1]
  k = math.prod(dims[int(i)] for i in contracting.group(1).split(',') if i)
  return 2.0 * math.prod(result[0][1]) * k, lhs[0][0]


def _matmul_flops(instruction: Instruction, module: Module) -> tuple[float, str]:
  """(FLOPs, the lhs element type) of the matmuls a launch does; (0, '') for none."""
  if instruction.opcode == 'dot':
    return _dot_flops(instruction, module)
  if instruction.opcode == 'custom-call':
    target = _TARGET.search(instruction.attributes)
    contracting = _GEMM_CONTRACTING.search(instruction.attributes)
    if not target or 'gemm' not in target.group(1).lower() and 'matmul' not in target.group(1):
      return 0.0, ''
    lhs = arrays(module.shapes.get(instruction.operands[0], '')) if instruction.operands else []
    result = arrays(instruction.shape)
    if not contracting or not lhs or not result:
      return 0.0, ''
    indices = [int(i.strip().strip('"')) for i in contracting.group(1).split(',') if i.strip()]
    k = math.prod(lhs[0][1][i] for i in indices)
    return 2.0 * math.prod(result[0][1]) * k, lhs[0][0]
  flops, element = 0.0, ''
  for called in instruction.called:
    for inner in _computation_instructions(module, called):
      if inner.opcode == 'dot':
        dot_flops, dot_element = _dot_flops(inner, module)
        flops += dot_flops
        element = element or dot_element
  return flops, element


def _elements(shape: str) -> int:
  return sum(math.prod(dims) for _, dims in arrays(shape))


def _elementwise_ops(instruction: Instruction, module: Module) -> float:
  """The elementwise operations a launch does (module docstring): those of the computations a
  fusion calls, nested ones included; an unfused elementwise instruction's own."""
  if instruction.opcode == 'fusion':
    inner = (i for called in instruction.called for i in _computation_instructions(module, called))
  elif instruction.opcode in ELEMENTWISE_OPCODES or instruction.opcode == 'reduce':
    inner = iter((instruction,))
  else:
    return 0.0
  ops = 0.0
  for op in inner:
    if op.opcode in ELEMENTWISE_OPCODES:
      weight = TRANSCENDENTAL_COST if op.opcode in TRANSCENDENTAL_OPCODES else 1
      ops += weight * _elements(op.shape)
    elif op.opcode == 'reduce' and op.operands:
      ops += _elements(module.shapes.get(op.operands[0], ''))
  return ops


def _fusion_bytes(instruction: Instruction, module: Module) -> float:
  """Bytes a fusion reads and writes, refined by its fused computation (module docstring)."""
  operand_bytes = [shape_bytes(module.shapes.get(name, '')) for name in instruction.operands]
  written = shape_bytes(instruction.shape)
  called = instruction.called
  body = module.computations.get(called[0], []) if called else []
  if not body:
    return sum(operand_bytes) + written
  parameters = {
    inner.name: int(inner.operand_text)
    for inner in body
    if inner.opcode == 'parameter' and inner.operand_text.strip().isdigit()
  }
  users = {name: [] for name in parameters}
  for inner in body:
    for position, operand in enumerate(inner.operands):
      if operand in users:
        users[operand].append((inner, position))
  root = next((inner for inner in body if inner.name == module.roots.get(called[0])), body[-1])
  in_place = root.opcode == 'dynamic-update-slice' and root.operands[0] in parameters
  read = list(operand_bytes)
  for name, index in parameters.items():
    if index >= len(read):
      continue
    uses = users[name]
    if in_place and name == root.operands[0] and len(uses) == 1:
      read[index] = 0.0
    elif uses and all(
      user.opcode in ('slice', 'dynamic-slice') and position == 0 for user, position in uses
    ):
      read[index] = min(read[index], sum(shape_bytes(user.shape) for user, _ in uses))
  if in_place:
    written = shape_bytes(module.shapes.get(root.operands[1], ''))
  return sum(read) + written


@dataclasses.dataclass(frozen=True)
class Device:
  """What a floor needs of a device: dense tensor peaks (FLOP/s), memory bandwidth (B/s) and
  the rate of elementwise operations (per second; unbounded unless given)."""

  name: str
  bf16_flops: float
  float32_flops: float
  bandwidth: float
  elementwise_ops: float = math.inf


def _device(name: str, bandwidth: float, elementwise_ops: float) -> Device:
  """A Device with relpos.flops's data-sheet tensor peaks for `name`, its bandwidth and its
  elementwise rate."""
  bf16, float32 = (device_peak(name, dtype).tflops * 1e12 for dtype in PEAK_DTYPES)
  return Device(f'{name} SXM', bf16, float32, bandwidth, elementwise_ops)


# Data-sheet memory bandwidths: H100 SXM 3.35 TB/s of HBM3, H200 SXM 4.8 TB/s of HBM3e. Both
# have 132 SMs at a 1,980 MHz boost clock, each issuing one instruction a clock for each of its
# 4 schedulers' 32 lanes: 33.5 T elementwise operations/s (the data sheet's 67 TFLOP/s of FP32
# counts an FMA as two).
HOPPER_ISSUE_RATE = 132 * 128 * 1.98e9
DEVICES = {
  'H100': _device('H100', 3.35e12, HOPPER_ISSUE_RATE),
  'H200': _device('H200', 4.8e12, HOPPER_ISSUE_RATE),
}


def device_for(device_kind: str) -> Device | None:
  """DEVICES' entry for a JAX device_kind ('NVIDIA H100 80GB HBM3', 'NVIDIA H200'), or None
  (other devices, and the PCIe and NVL parts, whose bandwidths differ)."""
  words = device_kind.lower().replace('-', ' ').split()
  if 'pcie' in words or 'nvl' in words:
    return None
  return next((device for key, device in DEVICES.items() if key.lower() in words), None)


@dataclasses.dataclass(frozen=True)
class Cost:
  """One launch: its KINDS entry, matmul FLOPs (and their peak's dtype), bytes moved and
  elementwise operations."""

  kind: str
  flops: float
  half_precision: bool
  bytes: float
  elementwise: float = 0.0

  def seconds(self, device: Device) -> float:
    """Its floor: the longest of its matmuls at the peak, its bytes at the bandwidth and its
    elementwise operations at the device's rate."""
    peak = device.bf16_flops if self.half_precision else device.float32_flops
    return max(
      self.flops / peak, self.bytes / device.bandwidth, self.elementwise / device.elementwise_ops
    )

  def kind_on(self, device: Device) -> str:
    """Its KINDS entry on `device`: a memory-bound launch whose elementwise operations outlast
    its bytes there is 'ALU-bound'."""
    if self.kind == 'memory-bound' and (
      self.elementwise / device.elementwise_ops > self.bytes / device.bandwidth
    ):
      return 'ALU-bound'
    return self.kind


def tuple_elements(shape: str) -> list[str]:
  """The top-level elements of a tuple shape's text ('(A, (B, C), D)' -> ['A', '(B, C)',
  'D']); a shape that is not a tuple is its own one element."""
  text = shape.strip()
  if not text.startswith('('):
    return [text]
  elements, depth, start = [], 0, 1
  for index, char in enumerate(text[1:-1], start=1):
    if char in '([{':
      depth += 1
    elif char in ')]}':
      depth -= 1
    elif char == ',' and depth == 0:
      elements.append(text[start:index].strip())
      start = index + 1
  elements.append(text[start:-1].strip())
  return elements


def _as_fusion(instruction: Instruction) -> Instruction:
  """An asynchronous fusion's start (`fusion-start`, shape ((operands...), result, context))
  as the fusion it runs: XLA:GPU wraps some fusions so, e.g. a scanned layer's
  dynamic-update-slice into a stacked [layers, ...] buffer, which writes in place as the plain
  fusion does. Other instructions are returned as they are."""
  if instruction.opcode != 'fusion-start':
    return instruction
  elements = tuple_elements(instruction.shape)
  result = elements[1] if len(elements) > 1 else instruction.shape
  return dataclasses.replace(instruction, opcode='fusion', shape=result)


def launch_cost(instruction: Instruction, module: Module) -> Cost:
  """The FLOPs and bytes of one launch (module docstring)."""
  instruction = _as_fusion(instruction)
  flops, element = _matmul_flops(instruction, module)
  if instruction.opcode == 'fusion':
    moved = _fusion_bytes(instruction, module)
  else:
    operands = sum(shape_bytes(module.shapes.get(name, '')) for name in instruction.operands)
    moved = operands + shape_bytes(instruction.shape)
  return Cost(
    _kind(instruction, flops),
    flops,
    element in HALF_PRECISION,
    moved,
    _elementwise_ops(instruction, module) if not flops else 0.0,
  )


@dataclasses.dataclass
class Roofline:
  """A step's floor on one device: per KINDS entry {kind: [launches, FLOPs, bytes, seconds]},
  and the launches by floor, longest first: (seconds, kind, instruction name, op_name, times)."""

  device: Device
  kinds: dict[str, list[float]]
  top: list[tuple[float, str, str, str, int]]

  @property
  def seconds(self) -> float:
    return sum(row[3] for row in self.kinds.values())

  @property
  def launches(self) -> int:
    return int(sum(row[0] for row in self.kinds.values()))


def roofline(module: Module, device: Device, *, branches: str = 'dearest') -> Roofline:
  """The floor of one run of `module` on `device`: every launch's, times its trip count, and
  of each conditional one branch: its most expensive ('dearest', a floor whichever runs) or its
  cheapest ('cheapest': where the caller knows the cheap branch is the one that runs, e.g.
  relpos's Mosaic kernels once the char LM's memory is full, against the 'xla' form beside
  them)."""
  if branches not in ('dearest', 'cheapest'):
    raise ValueError(f"branches must be 'dearest' or 'cheapest', got {branches!r}")
  pick = max if branches == 'dearest' else min
  costed = []
  for launch in launches(module):
    cost = launch_cost(launch.instruction, module)
    costed.append((launch, cost, launch.times * cost.seconds(device)))
  # Per conditional (outermost), the branch whose launches sum to the most (or least); launches
  # inside the others are dropped. A branch that launches nothing costs nothing.
  totals: dict[str, dict[int, float]] = {}
  for launch, _, seconds in costed:
    if launch.branch:
      name, index = launch.branch[0]
      totals.setdefault(name, {}).setdefault(index, 0.0)
      totals[name][index] += seconds
  for computation in module.computations.values():  # a branch that launches nothing costs 0
    for instruction in computation:
      if instruction.name in totals:
        for index in range(len(branch_names(instruction))):
          totals[instruction.name].setdefault(index, 0.0)
  taken = {name: pick(costs, key=costs.get) for name, costs in totals.items()}
  kinds = {name: [0, 0.0, 0.0, 0.0] for name in KINDS}
  top = []
  for launch, cost, seconds in costed:
    if launch.branch and taken[launch.branch[0][0]] != launch.branch[0][1]:
      continue
    launch_kind = cost.kind_on(device)
    row = kinds[launch_kind]
    row[0] += launch.times
    row[1] += launch.times * cost.flops
    row[2] += launch.times * cost.bytes
    row[3] += seconds
    instruction = launch.instruction
    top.append((seconds, launch_kind, instruction.name, instruction.op_name, launch.times))
  top.sort(key=lambda item: -item[0])
  return Roofline(device, kinds, top)


def census(module: Module) -> dict:
  """Counts over the launching instructions, each counted once however often it runs (a scanned
  layer once; both branches of a conditional): 'kernels', 'matmuls' (GEMMs among them),
  'copies' (layout copies and transposes among them), 'copy_bytes' (what those read and write)
  and 'custom_calls' {target: count}."""
  counts = {'kernels': 0, 'matmuls': 0, 'copies': 0, 'copy_bytes': 0, 'custom_calls': {}}
  for launch in launches(module):
    instruction = launch.instruction
    counts['kernels'] += 1
    launch_kind = kind(instruction, module)
    if launch_kind == 'matmul':
      counts['matmuls'] += 1
    if launch_kind == 'layout copy':
      counts['copies'] += 1
      counts['copy_bytes'] += 2 * shape_bytes(instruction.shape)
    if instruction.opcode == 'custom-call':
      target = _TARGET.search(instruction.attributes)
      key = target.group(1) if target else '?'
      counts['custom_calls'][key] = counts['custom_calls'].get(key, 0) + 1
  return counts
