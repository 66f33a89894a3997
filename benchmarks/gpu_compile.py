"""Compiling for an NVIDIA H100 without one: what the compiler says before a GPU is lent.

    python benchmarks/gpu_compile.py kernels
    python benchmarks/gpu_compile.py step --config=configs/enwik8_base.py [-- OVERRIDES]
    python benchmarks/gpu_compile.py step --config=configs/wmt_base.py:shaw --positions=shaw
    python benchmarks/gpu_compile.py long_context --config=configs/enwik8_base.py [-- OVERRIDES]

JAX compiles for a GPU it does not have when the CUDA plugin is installed: a compile-only H100
(`jax.experimental.topologies.get_topology_desc(platform='cuda', target_config=...)`, described
by `h100_target.txtpb` beside this file: data-sheet figures) takes a jitted function through
XLA's GPU pipeline, ptxas included, on a CPU. Nothing runs, so there are no timings, but three
things a GPU session would otherwise spend minutes finding out are answered here:

- `kernels`: the Mosaic GPU kernels (relpos.attention.mosaic_shaw, mosaic_xl) compiled to SASS
  for sm_90a, forward and backward, at issue 39's shapes (n = 2048, batch 16, 8 heads of 64)
  and enwik8_base's (512 queries over 1,024 keys, batch 22): each kernel's registers per thread
  and spilled bytes, from ptxas's own report (`MOSAIC_GPU_DUMP_PTXAS=1`). A kernel that does
  not compile fails here, not on the GPU.
- `step`: a training step compiled per implementation (the char LM's at its config's shape;
  translation's at max_tokens in sentences of --length pieces): XLA's memory analysis
  (arguments, temporaries), the compiled module's census (kernels launched per step: fusions
  and custom calls, of which matmuls and layout copies, and the custom-call targets), and its
  floor on an H100 and an H200 (hlo_cost.py: every launch at the longest of its matmuls at the
  peak, its bytes at the bandwidth and its elementwise operations at the SMs' issue rate), with
  the MFU that floor allows and the JAX operations that take most of it.
- `long_context`: the same step at batch 1, tgt_len = mem_len = n doubling from --start (or
  the --sizes given) up to the first that does not fit: its memory (arguments + outputs +
  temporaries) against 95% of the device's memory, which predicts the longest segment that
  trains on one H100, per position and implementation (what gpu_run.sh's long_context part
  measures).

Needs the GPU's software: Python >= 3.12 with `jax[cuda13]==0.11.2` (README, Development); on
a machine without it the tool says so in one line. XLA's GEMMs are not autotuned without a
device (untuned Triton tiles), and `cost_analysis()` is None: compile-time facts only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import hlo_cost
from gpu_run import char_config, split_overrides

TARGET = Path(__file__).with_name('h100_target.txtpb')
# An H100 80GB HBM3's memory as nvidia-smi reports it (81,559 MiB: the 80 GiB of HBM3 less what
# the driver keeps), as in h100_target.txtpb.
H100_BYTES = 81559 * 2**20
VOCAB_SIZE = 256  # the char LM's byte vocabulary, as the steps are built here
_PTXAS_ENTRY = re.compile(r"Compiling entry function '(\w+?)(?:_mosaic_gpu_kernel)?' for '(\w+)'")
_PTXAS_SPILLS = re.compile(r'(\d+) bytes spill stores, (\d+) bytes spill loads')
_PTXAS_USED = re.compile(r'Used (\d+) registers')


def parse_ptxas(text: str) -> dict[str, dict]:
  """{kernel: {'arch', 'registers', 'spill_stores', 'spill_loads'}} from ptxas's verbose report
  (one 'Compiling entry function' block per kernel; a kernel compiled twice keeps its last)."""
  kernels, name = {}, None
  for line in text.splitlines():
    if match := _PTXAS_ENTRY.search(line):
      name = match.group(1)
      kernels[name] = {'arch': match.group(2)}
    elif name and (match := _PTXAS_SPILLS.search(line)) and 'warning' not in line:
      kernels[name].update(spill_stores=int(match.group(1)), spill_loads=int(match.group(2)))
    elif name and (match := _PTXAS_USED.search(line)):
      kernels[name]['registers'] = int(match.group(1))
  return kernels


@contextlib.contextmanager
def captured_output():
  """Yields a list that holds, after the block, what the process wrote to its file descriptors
  1 and 2 inside it (ptxas's report comes from C++, past sys.stdout)."""
  sys.stdout.flush()
  sys.stderr.flush()
  saved = [os.dup(1), os.dup(2)]
  text = []
  with tempfile.TemporaryFile(mode='w+b') as sink:
    os.dup2(sink.fileno(), 1)
    os.dup2(sink.fileno(), 2)
    try:
      yield text
    finally:
      sys.stdout.flush()
      sys.stderr.flush()
      os.dup2(saved[0], 1)
      os.dup2(saved[1], 2)
      for fd in saved:
        os.close(fd)
      sink.seek(0)
      text.append(sink.read().decode(errors='replace'))


def h100():
  """A compile-only H100 device, or SystemExit with one line saying what is missing."""
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')  # the plugin loads; no CUDA client is made
  from relpos import runtime

  # The XLA flags relpos sets on a GPU (runtime.GPU_FLAGS), so the module is what a GPU runs.
  os.environ.update(runtime.gpu_flags_environment(os.environ, on_gpu=True))
  import jax
  from jax.experimental import topologies

  try:
    topology = topologies.get_topology_desc(
      platform='cuda', topology_name='h100', target_config=TARGET.read_text(), topology='1x1x1'
    )
  except Exception as error:  # no CUDA plugin, most often
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
    raise SystemExit(
      f'gpu_compile: cannot compile for an H100 here ({first}); it needs jax[cuda13]==0.11.2 '
      f'on Python >= 3.12 (this is jax {jax.__version__}): README, Development'
    ) from None
  return topology.devices[0]


def _abstract(device, shapes_dtypes):
  import jax
  from jax.sharding import SingleDeviceSharding

  sharding = SingleDeviceSharding(device)
  return [jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for shape, dtype in shapes_dtypes]


KERNEL_SHAPES = {
  # name: (batch, q_len, kv_len, heads): head_dim 64, bf16, causal
  'n2048': (16, 2048, 2048, 8),
  'enwik8_base': (22, 512, 1024, 8),
}


def kernels(args) -> int:
  os.environ['MOSAIC_GPU_DUMP_PTXAS'] = '1'
  device = h100()
  import jax
  import jax.numpy as jnp

  from relpos.attention.mosaic_shaw import shaw_attention_mosaic
  from relpos.attention.mosaic_xl import xl_attention_mosaic

  bf16 = jnp.bfloat16
  print('| kernel | shape | registers | spilled bytes (stores / loads) | compile s (fwd+bwd) |')
  print('|---|---|---|---|---|')
  failed = 0
  for shape_name, (batch, q_len, kv_len, heads) in KERNEL_SHAPES.items():
    for scheme in ('shaw', 'shaw_ws', 'xl'):
      qkv = [((batch, q_len, heads, 64), bf16)] + [((batch, kv_len, heads, 64), bf16)] * 2
      if scheme == 'xl':
        tables = [((kv_len, heads, 64), bf16), ((heads, 64), bf16), ((heads, 64), bf16)]

        def attend(*xs):
          return xl_attention_mosaic(*xs, interpret=False)
      else:
        tables = [((2 * args.max_distance + 1, 64), bf16)] * 2

        def attend(*xs, ws=scheme == 'shaw_ws'):
          return shaw_attention_mosaic(*xs, warp_specialized=ws, interpret=False)

      operands = _abstract(device, qkv + tables)
      grad = jax.grad(
        lambda *xs, f=attend: f(*xs).astype(jnp.float32).sum(), argnums=range(len(operands))
      )
      started = time.perf_counter()
      try:
        with captured_output() as output:
          jax.jit(grad).lower(*operands).compile()
      except Exception as error:
        failed += 1
        message = (str(error).strip().splitlines() or [''])[0][:200]
        print(f'| {scheme} | {shape_name} | | | failed: {type(error).__name__}: {message} |')
        continue
      seconds = time.perf_counter() - started
      report = parse_ptxas(output[0])
      if not report:
        failed += 1
        print(f'| {scheme} | {shape_name} | | | no ptxas report |')
      for name, info in sorted(report.items()):
        spills = f'{info.get("spill_stores", 0)} / {info.get("spill_loads", 0)}'
        print(
          f'| {name} ({scheme}) | {shape_name} | {info.get("registers", "")} | {spills} | '
          f'{seconds:.1f} |',
          flush=True,
        )
  return 1 if failed else 0


def _step(config, device, shape):
  """(compiled step, its seconds to compile) for `config` on the compile-only device, at `shape`
  (the char LM: (batch, tgt_len); translation: (rows, src_len, tgt_len)): the state is built
  on the CPU (real shapes), then described to the device."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec

  from relpos.training import char_lm_task, translation_task
  from relpos.training.mesh import DATA_AXIS, data_mesh

  cpu_mesh, gpu_mesh = data_mesh(jax.devices('cpu')[:1]), data_mesh([device])
  rows = NamedSharding(gpu_mesh, PartitionSpec(DATA_AXIS))
  if config.task == 'translate':
    graphdef, state = translation_task.build(config, config.data.vocab_size, cpu_mesh)
    step_fn = translation_task.train_step_fn
    batch_rows, src_len, tgt_len = shape
    batch = {
      name: jax.ShapeDtypeStruct((batch_rows, length), jnp.int32, sharding=rows)
      for name, length in (('src', src_len), ('tgt_in', tgt_len), ('tgt_out', tgt_len))
    }
  else:
    _, graphdef, state = char_lm_task.build(config, VOCAB_SIZE, cpu_mesh)
    step_fn = char_lm_task.train_step_fn
    batch = (jax.ShapeDtypeStruct(shape, jnp.int32, sharding=rows),) * 2

  def describe(x):
    spec = x.sharding.spec if isinstance(x.sharding, NamedSharding) else PartitionSpec()
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(gpu_mesh, spec))

  state = jax.tree.map(describe, state)
  started = time.perf_counter()
  # The device as the default one: Pallas's Triton lowering reads the target GPU from it, and
  # relpos's Mosaic dispatch compiles its kernels (instead of interpreting them) for it.
  with jax.default_device(device):
    compiled = step_fn(config, graphdef, gpu_mesh).lower(state, batch).compile()
  return compiled, time.perf_counter() - started


def step_shape(config, length: int):
  """The batch shape `step` compiles: the char LM's (batch_size, tgt_len); translation's
  (max_tokens // length rows, length, length), sentences of `length` pieces on both sides."""
  if config.task == 'translate':
    return (max(1, config.data.max_tokens // length), length, length)
  return (config.train.batch_size, config.train.tgt_len)


def _variant(config, **model):
  import ml_collections

  variant = ml_collections.ConfigDict(config.to_dict())
  variant.model.update(**model)
  return variant


STEP_HEADER = (
  '| position | implementation | arguments GiB | temporaries GiB | kernels | matmuls | '
  'layout copies | their GB moved | custom calls | compile s |'
)


def step_row(position, implementation, memory, counts, seconds) -> str:
  """One row of `step`'s table (STEP_HEADER): XLA's memory analysis and `census` counts."""
  calls = ', '.join(f'{k} {v}' for k, v in sorted(counts['custom_calls'].items())) or 'none'
  return (
    f'| {position} | {implementation} | {memory.argument_size_in_bytes / 2**30:.3f} | '
    f'{memory.temp_size_in_bytes / 2**30:.3f} | {counts["kernels"]} | {counts["matmuls"]} | '
    f'{counts["copies"]} | {counts["copy_bytes"] / 1e9:.1f} | {calls} | {seconds:.0f} |'
  )


FLOOR_HEADER = (
  '| position | implementation | launches | matmul TFLOP | GB moved: matmuls / memory-bound / '
  "ALU-bound / layout copies / custom calls | floor ms H100 / H200 | kernels' attention at peak, "
  'ms | MFU ceiling H100 / H200 |'
)
# FlashAttention's count of a fused kernel's work: the forward's matmuls, and a backward of 2.5
# times them (the recomputed logits, dV, dP, dQ and dK against the forward's two).
KERNEL_PASSES = 3.5


def kernel_attention_flops(config, shape) -> float:
  """The matmul FLOPs a step's fused relative-attention kernels do at batch `shape`
  (step_shape): per self-attention call, q·k and p·v (and XL's position logits) over the pairs
  a query may see (the kernels skip masked tiles; Shaw's per-query table products, a few
  percent, are left out), times KERNEL_PASSES. Custom calls carry no FLOPs in hlo_cost's
  floor; this is their part. Encoder-decoder attention has no position work: its matmuls are
  XLA's, in the floor."""
  from relpos import flops

  model = config.model
  head_dim = flops.model_head_dim(model)
  rectangles = 3 if model.position == 'xl' else 2
  if config.task == 'translate':
    rows, src_len, tgt_len = shape
    calls = [(model.encoder_layers, src_len, src_len, False)]
    calls.append((model.decoder_layers, tgt_len, tgt_len, True))
  else:
    rows, tgt_len = shape
    calls = [(model.num_layers, tgt_len, tgt_len + config.train.mem_len, True)]
  total = 0.0
  for layers, q_len, kv_len, causal in calls:
    pairs = flops.visible_pairs(q_len, kv_len, causal=causal)
    total += layers * rectangles * flops.matmul(pairs, head_dim, 1, rows * model.num_heads)
  return KERNEL_PASSES * total


def model_flops(config, shape):
  """relpos.flops's forward count of the model at batch `shape` (step_shape)."""
  from relpos import flops

  if config.task == 'translate':
    rows, src_len, tgt_len = shape
    return flops.translation_flops(
      config.model,
      rows=rows,
      src_len=src_len,
      tgt_len=tgt_len,
      vocab_size=config.data.vocab_size,
    )
  batch, tgt_len = shape
  return flops.char_lm_flops(
    config.model,
    batch=batch,
    tgt_len=tgt_len,
    mem_len=config.train.mem_len,
    vocab_size=VOCAB_SIZE,
  )


def floor_row(position, implementation, floors, kernel_flops, train_flops) -> str:
  """One row of FLOOR_HEADER from {'H100': Roofline, 'H200': Roofline} (hlo_cost.DEVICES);
  `kernel_flops` counts where the module launches custom calls other than GEMMs."""
  h100_floor, h200_floor = floors['H100'], floors['H200']
  kinds = h200_floor.kinds
  moved = ' / '.join(f'{kinds[name][2] / 1e9:.1f}' for name in hlo_cost.KINDS)
  has_kernels = kinds['custom call'][0] > 0

  def kernels_seconds(floor):  # the kernels' attention FLOPs at that device's peak
    return kernel_flops / floor.device.bf16_flops if has_kernels else 0.0

  ceilings = [
    train_flops / (floor.seconds + kernels_seconds(floor)) / floor.device.bf16_flops
    for floor in (h100_floor, h200_floor)
  ]
  return (
    f'| {position} | {implementation} | {h200_floor.launches} | {kinds["matmul"][1] / 1e12:.2f} | '
    f'{moved} | {h100_floor.seconds * 1e3:.1f} / {h200_floor.seconds * 1e3:.1f} | '
    f'{f"{kernels_seconds(h200_floor) * 1e3:.1f}" if has_kernels else "none"} | '
    f'{ceilings[0]:.0%} / {ceilings[1]:.0%} |'
  )


def top_operations(roofline, count: int) -> list[str]:
  """The `count` JAX operations (metadata op_name, per launch kind) with the most floor time,
  summed over their launches: markdown list lines."""
  totals = {}
  for seconds, launch_kind, _, op_name, times in roofline.top:
    key = (launch_kind, op_name or '(no op_name)')
    launches, total = totals.get(key, (0, 0.0))
    totals[key] = (launches + times, total + seconds)
  ranked = sorted(totals.items(), key=lambda item: -item[1][1])[:count]
  return [
    f'- {total * 1e3:.2f} ms, {launches} launches, {launch_kind}: `{op_name}`'
    for (launch_kind, op_name), (launches, total) in ranked
  ]


def step(args, overrides) -> int:
  device = h100()
  config = char_config(args.config, overrides)
  shape = step_shape(config, args.length)
  model = config.model
  if config.task == 'translate':
    layers = f'{model.encoder_layers} + {model.decoder_layers} layers'
    batch = f'{shape[0]} pairs of {shape[1]} source and {shape[2]} target pieces'
  else:
    layers = f'{model.num_layers} layers'
    batch = f'batch {shape[0]}, tgt_len {shape[1]}, mem_len {config.train.mem_len}'
  print(
    f'{config.task}: {layers}, d_model {model.d_model}, {model.dtype}; {batch}; compiled for '
    f'{device.device_kind} (nothing runs)'
  )
  print(STEP_HEADER)
  print('|---' * STEP_HEADER.count(' | ') + '|---|')
  failed, floors = 0, []
  for position in args.positions.split(','):
    for implementation in args.implementations.split(','):
      variant = _variant(config, position=position, attention_implementation=implementation)
      try:
        compiled, seconds = _step(variant, device, shape)
      except Exception as error:
        failed += 1
        message = (str(error).strip().splitlines() or [''])[0][:200]
        print(
          f'| {position} | {implementation} | | | | | | | {type(error).__name__}: {message} | |'
        )
        continue
      module = hlo_cost.parse(compiled.as_text())
      memory = compiled.memory_analysis()
      print(
        step_row(position, implementation, memory, hlo_cost.census(module), seconds), flush=True
      )
      # 'mosaic' is a lax.cond between the kernel and the 'xla' form (mosaic_dispatch): the
      # kernel's branch, the cheaper, is what runs once the char LM's memory is full.
      branches = 'cheapest' if implementation == 'mosaic' else 'dearest'
      rooflines = {
        name: hlo_cost.roofline(module, d, branches=branches)
        for name, d in hlo_cost.DEVICES.items()
      }
      train_flops = model_flops(variant, shape).train_step()
      floors.append(
        (
          position,
          implementation,
          floor_row(
            position,
            implementation,
            rooflines,
            kernel_attention_flops(variant, shape),
            train_flops,
          ),
          top_operations(rooflines['H200'], args.top),
        )
      )
  if floors:
    print(
      '\nThe floor (benchmarks/hlo_cost.py): each launch at the longest of its matmuls at the '
      'bf16/TF32 peak, its bytes at the memory bandwidth and its elementwise operations at the '
      "SMs' issue rate (ALU-bound: dropout's random bits), summed; the MFU ceiling is the "
      "model's FLOPs (relpos.flops) over that floor, plus the fused kernels' attention FLOPs at "
      "the peak where the step calls them; 'mosaic' rows count the kernel's branch of their "
      "lax.cond, the others a conditional's dearest branch.\n"
    )
    print(FLOOR_HEADER)
    print('|---' * FLOOR_HEADER.count(' | ') + '|---|')
    for _, _, row, _ in floors:
      print(row)
    for position, implementation, _, top in floors:
      print(f'\nWhere the H200 floor goes, {position} {implementation}:')
      print('\n'.join(top))
  return 1 if failed else 0


def long_context(args, overrides) -> int:
  device = h100()
  config = char_config(args.config, overrides)
  limit = H100_BYTES * args.memory_fraction
  print(
    f'{config.model.num_layers} layers, d_model {config.model.d_model}, {config.model.dtype}, '
    f'batch 1; fits: arguments + outputs + temporaries <= {args.memory_fraction} x 81,559 MiB'
  )
  print(
    '| position | implementation | n = tgt_len = mem_len | arguments GiB | temporaries GiB | '
    'total GiB | fits |'
  )
  print('|---|---|---|---|---|---|---|')
  results = []
  sizes = [int(n) for n in args.sizes.split(',')] if args.sizes else []
  if not sizes:
    sizes = [args.start]
    while 2 * sizes[-1] <= args.max:
      sizes.append(2 * sizes[-1])
  for position in args.positions.split(','):
    for implementation in args.implementations.split(','):
      largest = None
      for n in sizes:
        variant = _variant(config, position=position, attention_implementation=implementation)
        variant.train.update(batch_size=1, tgt_len=n, mem_len=n)
        try:
          compiled, _ = _step(variant, device, step_shape(variant, args.length))
        except Exception as error:
          message = (str(error).strip().splitlines() or [''])[0][:160]
          print(
            f'| {position} | {implementation} | {n} | | | | {type(error).__name__}: {message} |'
          )
          break
        memory = compiled.memory_analysis()
        total = (
          memory.argument_size_in_bytes
          + memory.output_size_in_bytes
          + memory.temp_size_in_bytes
          - memory.alias_size_in_bytes
        )
        fits = total <= limit
        print(
          f'| {position} | {implementation} | {n} | {memory.argument_size_in_bytes / 2**30:.2f} '
          f'| {memory.temp_size_in_bytes / 2**30:.2f} | {total / 2**30:.2f} | '
          f'{"yes" if fits else "no"} |',
          flush=True,
        )
        if not fits:
          break
        largest = n
      results.append(f'RESULT: {position} {implementation}: predicted to train at n = {largest}')
  print('\n'.join(results))
  return 0


def main(argv) -> int:
  argv, overrides = split_overrides(argv)
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  commands = parser.add_subparsers(dest='command', required=True)
  kernel_command = commands.add_parser('kernels')
  kernel_command.add_argument('--max_distance', type=int, default=16)
  for name in ('step', 'long_context'):
    command = commands.add_parser(name)
    command.add_argument('--config', required=True)
    command.add_argument('--positions', default='xl,shaw')
    command.add_argument(
      '--implementations', default='xla,pallas,mosaic' if name == 'step' else 'mosaic,pallas,xla'
    )
    command.add_argument('--start', type=int, default=4096)
    command.add_argument('--max', type=int, default=131072)
    command.add_argument('--memory_fraction', type=float, default=0.95)
    command.add_argument(
      '--sizes', default='', help='long_context: the n to try, comma-separated (default: doubling)'
    )
    command.add_argument(
      '--top', type=int, default=8, help='step: the JAX operations listed with the most floor'
    )
    command.add_argument(
      '--length', type=int, default=32, help='step, translation: pieces per sentence, each side'
    )
  args = parser.parse_args(argv)
  if args.command == 'kernels':
    return kernels(args)
  return {'step': step, 'long_context': long_context}[args.command](args, overrides)


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
