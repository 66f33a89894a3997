"""What the Pallas Mosaic GPU kernels for Shaw et al. and Transformer-XL attention share.

`relpos.attention.mosaic_shaw` and `relpos.attention.mosaic_xl` are causal flash-attention
kernels for Hopper (wgmma, TMA), built alike. This module holds the parts both use, one of
each, as `pallas_common` does for the Triton kernels: the compiler parameters every kernel
names (`COMPILER_PARAMS`: Lane semantics, pinned across jax 0.10 and 0.11), a kernel's name in
its Mosaic GPU module (`named`), the register-layout helpers that differ between the compiler
and the interpreter (`register_ops`, `smem_load`), the scoped-accumulator matmuls
(`matmuls`), the base-2 softmax's constant (`LOG2E`), and the shared-memory budget the kernels'
`_smem_bytes` are checked against (`SMEM_BYTES`, with `SMEM_RESERVE` for barriers and
alignment).
"""

from __future__ import annotations

import inspect
import math

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

LOG2E = math.log2(math.e)
SMEM_BYTES = 227 * 1024  # an H100's shared memory per block
# What Mosaic GPU allocates beyond a kernel's buffers, for barriers and alignment (it counted 2088
# bytes more than the buffers, jax 0.10.2): every `_smem_bytes` adds it.
SMEM_RESERVE = 4096
# The kernels are written in Pallas Mosaic GPU's Lane semantics (per-thread layouts chosen with
# `plgpu.load(layout=)`, `plgpu.layout_cast`, `broadcasted_iota(layout=)`): jax 0.10's default.
# jax 0.11 made Warpgroup semantics (layouts inferred by a constraint solver) the default, under
# which the XL kernel's odd-strided read of the skew buffer is refused ("Failed to infer a
# possible set of layouts"). So every kernel names its semantics instead of taking the default.
COMPILER_PARAMS = plgpu.CompilerParams(
  approx_math=True, lowering_semantics=plgpu.LoweringSemantics.Lane
)
# `plgpu.load`'s index argument: required in jax 0.10, deprecated in 0.11 (index the ref instead).
_LOAD_TAKES_INDEX = (
  inspect.signature(plgpu.load).parameters['idx'].default is inspect.Parameter.empty
)


def named(body, name: str):
  """`body`, renamed `name`: a kernel's name in its Mosaic GPU module, hence in ptxas's report and
  a profiler's kernel list (benchmarks/gpu_compile.py tells the kernels apart by it)."""
  body.__name__ = body.__qualname__ = name
  return body


def smem_load(ref, register_layout, *, optimized: bool = True):
  """`plgpu.load` of a whole shared-memory ref into `register_layout`, on jax 0.10 and 0.11."""
  index = ((),) if _LOAD_TAKES_INDEX else ()
  return plgpu.load(ref, *index, layout=register_layout, optimized=optimized)


def register_ops(interpret: bool):
  """(layout, load) for a kernel body: `layout(x, L)` places a value in register layout L and
  `load(ref, L)` reads a shared-memory ref into it, for the compiler; the interpreter has
  neither `plgpu.layout_cast` nor `plgpu.load`, so there they are the identity and a plain
  read (the one difference between the interpreted and the lowered program)."""

  def layout(x, register_layout):
    return x if interpret else plgpu.layout_cast(x, register_layout)

  def load(ref, register_layout):
    return ref[...] if interpret else smem_load(ref, register_layout)

  return layout, load


def matmuls(*pairs):
  """acc = a @ b for each (a, b, shape) of shared-memory operands, one scoped accumulator each
  (a fresh accumulator per call: the interpreter has no pl.run_state)."""

  def body(*accs):
    for acc, (a, b, _) in zip(accs, pairs, strict=True):
      plgpu.wgmma(acc, a, b)
    return tuple(acc[...] for acc in accs)

  out = pl.run_scoped(body, *(plgpu.ACC(shape, jnp.float32) for _, _, shape in pairs))
  return out if len(pairs) > 1 else out[0]
