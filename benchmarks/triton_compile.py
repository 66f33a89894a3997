"""Registers, spills and shared memory of the Pallas kernels compiled for an NVIDIA GPU, without
one.

    python benchmarks/triton_compile.py --triton_python=/tmp/tritonvenv/bin/python
    python benchmarks/triton_compile.py --kernels=shaw --distances=16,64 --dtypes=bfloat16 \\
        --block_sizes=64x64,128x64 --triton_python=...

For each kernel (shaw, xl), k, dtype and tiling, lowers the forward pass and the gradient of
`relpos.attention`'s `implementation='pallas'` for platform 'cuda' (`jax.export`: Pallas's
Triton lowering runs on any machine), takes the Triton IR of every `pallas_call` out of the
StableHLO, and compiles it with pip's Triton for sm_90a (H100, H200) in the interpreter given
by `--triton_python` (a venv with `pip install triton`; jax does not ship Triton's compiler).
ptxas then reports each kernel's registers per thread and spilled bytes. A kernel that spills
kilobytes per thread runs slowly; none spilling does not make one fast, which only a GPU can
show (docs/gpu.md). Without `--triton_python` the IR is only written out (`--out`).
"""

import contextlib
import json
import subprocess
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
from absl import flags

from relpos import flag_types, runtime
from relpos.attention import shaw_attention, xl_attention

TRITON_CALL = '__gpu$xla.gpu.triton'

# Run by --triton_python: compiles each <name>.ttir (MLIR text) with the warps and stages in
# <name>.json for sm_90a and prints one JSON line per kernel.
_COMPILE = r"""
import glob, json, os, re, subprocess, sys
os.environ.setdefault('TRITON_DEFAULT_FP_FUSION', '1')
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
for path in sorted(glob.glob(os.path.join(sys.argv[1], '*.ttir'))):
  meta = json.load(open(path[: -len('.ttir')] + '.json'))
  options = dict(num_warps=meta['num_warps'], num_stages=meta['num_stages'])
  compiled = triton.compile(path, target=GPUTarget('cuda', 90, 32), options=options)
  ptx = path[: -len('.ttir')] + '.ptx'
  open(ptx, 'w').write(compiled.asm['ptx'])
  ptxas = get_ptxas(90).path
  report = subprocess.run([ptxas, '-arch=sm_90a', '-v', ptx, '-o', os.devnull],
                          capture_output=True, text=True).stderr
  registers = re.search(r'Used (\d+) registers', report)
  spills = re.search(r'(\d+) bytes spill stores, (\d+) bytes spill loads', report)
  print(json.dumps(dict(file=os.path.basename(path), shared=compiled.metadata.shared,
    registers=int(registers.group(1)) if registers else None,
    spill_stores=int(spills.group(1)) if spills else None,
    spill_loads=int(spills.group(2)) if spills else None)))
"""


def define_flags():
  """The command-line flags (defined only when run as a program, so tests can import this)."""
  flags.DEFINE_list('kernels', 'shaw,xl', 'shaw and/or xl.')
  flags.DEFINE_integer('length', 2048, 'Query and key length n.', lower_bound=1)
  flags.DEFINE_integer('head_dim', 64, 'Head dimension.', lower_bound=1)
  flag_types.define_int_list('distances', '16', 'Shaw clipping distances k.', minimum=0)
  flags.DEFINE_list('dtypes', 'bfloat16,float32', 'Input dtypes.')
  flags.DEFINE_list('block_sizes', 'default', "Tilings: 'default' or QxK, e.g. 64x64.")
  flags.DEFINE_string('triton_python', None, 'Python with Triton installed; None: IR only.')
  flags.DEFINE_string('out', None, 'Directory for the IR (default: a temporary one).')


def _attention(name, length, head_dim, k, dtype, block_sizes):
  """(function of the inputs, their avals): relpos's Pallas attention with mask and dropout."""
  batch, heads = 2, 4
  sds = jax.ShapeDtypeStruct
  qkv = [sds((batch, length, heads, head_dim), dtype)] * 3
  if name == 'shaw':
    kernel, extra = shaw_attention, [sds((2 * k + 1, head_dim), dtype)] * 2
  else:
    kernel = xl_attention
    extra = [sds((length, heads, head_dim), dtype)] + [sds((heads, head_dim), dtype)] * 2
  mask = sds((batch, 1, length, length), jnp.bool_)

  def attend(*args):
    *xs, mask = args
    return kernel(
      *xs,
      mask=mask,
      dropout_rate=0.1,
      dropout_rng=jax.random.key(0),
      implementation='pallas',
      block_sizes=block_sizes,
    )

  return attend, [*qkv, *extra, mask]


def cuda_target():
  """A context for lowering Pallas Triton kernels for 'cuda' on a machine without a GPU: jax
  0.11's Triton backend reads the target's compute capability from the device (jax 0.10's did
  not), so where none is attached an abstract H100 (sm_90, the GPUs relpos has run on) stands
  in. On a GPU, nothing changes."""
  if any(device.platform == 'gpu' for device in jax.devices()):
    return contextlib.nullcontext()
  h100 = jax.sharding.AbstractDevice(
    device_kind='NVIDIA H100 80GB HBM3', num_cores=None, platform='gpu'
  )
  return jax.sharding.use_abstract_mesh(
    jax.sharding.AbstractMesh((1,), ('device',), abstract_device=h100)
  )


def triton_kernels(fn, avals, *, with_grid: bool = False):
  """[(name, num_warps, num_stages, Triton IR as MLIR text)] of every pallas_call in `fn`
  lowered for 'cuda'; with_grid: [(name, grid (x, y, z), Triton IR)] instead."""
  from jax._src.interpreters import mlir
  from jax._src.lib.mlir import ir
  from jax._src.pallas.triton.lowering import _new_ir_context

  with cuda_target():
    exported = jax.export.export(
      jax.jit(fn),
      platforms=['cuda'],
      disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(TRITON_CALL)],
    )(*avals)
  calls = []
  with mlir.make_ir_context():
    module = ir.Module.parse(exported.mlir_module())

    def visit(operation):
      for region in operation.regions:
        for block in region.blocks:
          for child in block.operations:
            child = child.operation
            attributes = child.attributes
            if child.name == 'stablehlo.custom_call' and TRITON_CALL in str(
              attributes['call_target_name']
            ):
              config = attributes['mhlo.backend_config']
              calls.append(
                (
                  ir.StringAttr(config['name']).value,
                  ir.IntegerAttr(config['num_warps']).value,
                  ir.IntegerAttr(config['num_stages']).value,
                  ir.StringAttr(config['ir']).value_bytes,
                  tuple(ir.IntegerAttr(config[f'grid_{a}']).value for a in 'xyz'),
                )
              )
            visit(child)

    visit(module.operation)
  found = []
  for name, warps, stages, bytecode, grid in calls:  # Triton IR, as MLIR bytecode
    with _new_ir_context(), ir.Location.unknown():
      text = ir.Module.parse(bytecode).operation.get_asm(enable_debug_info=False)
    found.append((name, grid, text) if with_grid else (name, warps, stages, text))
  return found


def write_kernels(fn, avals, directory: Path, prefix: str):
  """Writes `<prefix>_<i>.ttir` and `.json` (name, warps, stages) per kernel of fn's forward
  pass and gradient (each kernel once); returns {file stem: (kernel name, warps)}."""

  def gradient(*args):
    def total(*xs):
      return jnp.sum(fn(*xs, args[-1]).astype(jnp.float32))

    return jax.grad(total, argnums=tuple(range(len(args) - 1)))(*args[:-1])

  stems = {}
  for name, warps, stages, text in triton_kernels(gradient, avals):
    stem = f'{prefix}_{len(stems)}'
    (directory / f'{stem}.ttir').write_text(text)
    meta = dict(name=name, num_warps=warps, num_stages=stages)
    (directory / f'{stem}.json').write_text(json.dumps(meta))
    stems[stem] = (name, warps)
  return stems


def compile_with_triton(triton_python: str, directory: Path) -> dict:
  """{file stem: ptxas figures} for every .ttir in `directory`, compiled by `triton_python`."""
  try:
    result = subprocess.run(
      [triton_python, '-c', _COMPILE, str(directory)], capture_output=True, text=True
    )
  except OSError as error:
    raise RuntimeError(f'cannot run it ({error})') from None
  if result.returncode != 0:
    raise RuntimeError(f'it could not compile the kernels:\n{result.stderr[-2000:]}')
  rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{')]
  return {row['file'][: -len('.ttir')]: row for row in rows}


def _cases(kernels, distances, dtypes, block_sizes):
  for name in kernels:
    for k in distances if name == 'shaw' else [None]:
      for dtype in dtypes:
        for blocks in block_sizes:
          yield name, k, dtype, blocks


def parse_block_sizes(texts):
  """--block_sizes: None for 'default', (Q, K) for 'QxK'; ValueError naming the flag else."""
  try:
    return [None if text == 'default' else tuple(int(x) for x in text.split('x')) for text in texts]
  except ValueError:
    raise ValueError(f"--block_sizes: {texts}: each must be 'default' or QxK, e.g. 64x64") from None


def main(argv):
  del argv
  flags_ = flags.FLAGS
  if unknown := sorted(set(flags_.kernels) - {'shaw', 'xl'}):
    raise ValueError(f'--kernels: unknown {unknown}; choose from shaw, xl')
  if unknown := sorted(set(flags_.dtypes) - {'bfloat16', 'float32', 'float16'}):
    raise ValueError(f'--dtypes: unknown {unknown}; choose from bfloat16, float32, float16')
  block_sizes = parse_block_sizes(flags_.block_sizes)
  directory = Path(flags_.out or tempfile.mkdtemp(prefix='triton_ir_'))
  directory.mkdir(parents=True, exist_ok=True)
  cases = {}
  for name, k, dtype, blocks in _cases(
    flags_.kernels, flags_.distances, flags_.dtypes, block_sizes
  ):
    fn, avals = _attention(name, flags_.length, flags_.head_dim, k, jnp.dtype(dtype), blocks)
    prefix = f'{name}_k{k}_{dtype}_{"x".join(map(str, blocks or ("default",)))}'
    for stem, (kernel, warps) in write_kernels(fn, avals, directory, prefix).items():
      tiles = 'default' if blocks is None else f'{blocks[0]} x {blocks[1]}'
      cases[stem] = (name, k, dtype, f'{tiles}, {warps} warps', kernel)
  print(f'Triton IR of {len(cases)} kernels in {directory}', flush=True)
  if flags_.triton_python is None:
    return
  try:
    figures = compile_with_triton(flags_.triton_python, directory)
  except RuntimeError as error:
    raise ValueError(f'--triton_python={flags_.triton_python}: {error}') from None
  print(
    f'\nn = {flags_.length}, head_dim {flags_.head_dim}, mask and dropout, sm_90a\n\n'
    '| kernel | k | dtype | tiles | pallas_call | registers | spill stores / loads (bytes) '
    '| shared KiB |\n|---|---|---|---|---|---|---|---|'
  )
  for stem, (name, k, dtype, tiles, kernel) in cases.items():
    row = figures[stem]
    print(
      f'| {name} | {"" if k is None else k} | {dtype} | {tiles} | {kernel} | '
      f'{row["registers"]} | {row["spill_stores"]} / {row["spill_loads"]} | '
      f'{row["shared"] / 1024:.0f} |'
    )


if __name__ == '__main__':
  runtime.apply_defaults()
  define_flags()
  from relpos.cli import run_main  # after apply_defaults: it imports jax, as train.py

  run_main(main)
