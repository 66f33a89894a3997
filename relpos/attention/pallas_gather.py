"""A gather of a value held in registers, for Pallas kernels: `take_columns`.

    out[i, j] = x[i, index[i, j]]     x [Q, C], index int32 [Q, K] in [0, C), out [Q, K]

Transformer-XL's kernels need it for the relative shift of each tile (`pallas_xl`): the
position logits of a tile are one matmul over a window of distances, [block_q, window], and
pair (i, j) reads column i - j + block_k - 1 of it. Pallas (jax 0.10.2 and 0.11) lowers no
gather of a value to Triton, so relpos adds one: the primitive `take_columns_p` lowers

- inside a Triton kernel (GPU) to Triton's own register gather, `tt.gather` along axis 1,
  which Triton implements with warp shuffles or through shared memory;
- everywhere else, and so in interpret mode on the CPU, to `jnp.take_along_axis`.

An index outside [0, C) has no defined result on a GPU (tt.gather does not check it), so
callers clip and mask. Mosaic (TPU) has no rule for it: a kernel using it does not lower for
a TPU.

The Triton rule goes through Pallas's private rule table
(`jax._src.pallas.triton.lowering.register_lowering`), the same one Pallas's own Triton
primitives register with; it exists unchanged in jax 0.10.2 and 0.11. Before this, the kernels
read the column by a one-hot reduction over a [Q, K, C] array in registers, which spilled
19-52 KB per thread at 32 x 32 tiles (compiled for sm_90a, `benchmarks/triton_compile.py`).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import core
from jax._src.lib.triton import dialect as triton_dialect
from jax._src.pallas.triton import lowering as triton_lowering
from jax.extend.core import Primitive
from jax.interpreters import mlir

take_columns_p = Primitive('relpos_take_columns')


def _take_along_columns(x_QC, index_QK):
  return jnp.take_along_axis(x_QC, index_QK, axis=1)


def _abstract_eval(x_QC, index_QK):
  return core.ShapedArray(index_QK.shape, x_QC.dtype)


take_columns_p.def_impl(_take_along_columns)
take_columns_p.def_abstract_eval(_abstract_eval)
mlir.register_lowering(take_columns_p, mlir.lower_fun(_take_along_columns, multiple_results=False))


@triton_lowering.register_lowering(take_columns_p)
def _triton_gather(ctx, x_QC, index_QK):
  del ctx
  return triton_dialect.gather(x_QC, index_QK, 1)


def take_columns(x_QC, index_QK):
  """`out[i, j] = x[i, index[i, j]]` [Q, K] for x [Q, C] and index [Q, K] in [0, C)."""
  index_QK = jnp.asarray(index_QK, jnp.int32)
  if jnp.ndim(x_QC) != 2 or index_QK.ndim != 2 or index_QK.shape[0] != jnp.shape(x_QC)[0]:
    raise TypeError(
      f'take_columns needs x [Q, C] and an index [Q, K]; got {jnp.shape(x_QC)} and {index_QK.shape}'
    )
  return take_columns_p.bind(x_QC, index_QK)
