"""The names of Shaw's and XL's attention implementations and the rules of each, in one table.

`implementation` (`shaw_attention`, `xl_attention`, config.model.attention_implementation) is
'auto', 'xla', 'pallas' (or 'pallas@QxK', a tiling the tuner names), 'cudnn' or 'mosaic'. This
module says which kernels each serves (`SERVES`), at which dtypes and dropout (`serves`), on
which devices (`RUNS_ON`, `off_its_devices`, `check_runs_on`), and how an argument and a
tuner's choice resolve (`resolve_implementation`, `parse_choice`, `tiles_name`), where Shaw's
'xla' changes form (`DENSE_MAX_KV_LEN`; what 'auto'
measures is `relpos.attention.autotune`'s). It imports no Pallas and no JAX, so the config
declarations and the training layer read these names without loading any kernel module; the
kernels are `pallas_shaw`, `pallas_xl` (their shared parts in `pallas_common`), `mosaic_shaw`,
`mosaic_xl` and `xl.xl_attention_cudnn`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# The implementation names and the kernels each serves: 'cudnn' is cuDNN's flash attention with
# an additive bias, which XL's position term is and Shaw's a^V term is not (`relpos.attention.xl`);
# 'mosaic' is their causal kernels in Pallas Mosaic GPU (`relpos.attention.mosaic_shaw`,
# `mosaic_xl`), where they serve ('xla' elsewhere: `relpos.attention.mosaic_dispatch`).
SERVES = {
  'auto': ('shaw', 'xl'),
  'xla': ('shaw', 'xl'),
  'pallas': ('shaw', 'xl'),
  'cudnn': ('xl',),
  'mosaic': ('shaw', 'xl'),
}
IMPLEMENTATIONS = tuple(SERVES)
# The implementations of 16-bit kernels, cuDNN's flash attention and the Mosaic GPU kernels (wgmma
# operands): they take HALF_DTYPES inputs and no attention dropout. 'xla' and 'pallas' take any
# float dtype and dropout.
HALF_PRECISION = ('cudnn', 'mosaic')
HALF_DTYPES = ('bfloat16', 'float16')
# Shaw's 'xla' implementation is its dense form up to this many keys and the banded kernel above
# it, by default (`shaw.xla_form`; `shaw_attention(dense_max_kv_len=)`,
# config.model.shaw_dense_max_kv_len; docs/kernels.md, "Short sequences", has the measurements).
DENSE_MAX_KV_LEN = 64
# The platforms (JAX's device.platform) each implementation runs on, and why not the others.
RUNS_ON = {
  'auto': ('cpu', 'gpu', 'tpu'),
  'xla': ('cpu', 'gpu', 'tpu'),
  'pallas': ('cpu', 'gpu'),
  'cudnn': ('gpu',),
  'mosaic': ('cpu', 'gpu'),
}
_WHY = {
  'pallas': 'Triton kernels, interpreted on a CPU; they do not lower for a TPU',
  'cudnn': "cuDNN's flash attention, on NVIDIA GPUs",
  'mosaic': 'Mosaic GPU kernels for Hopper GPUs, interpreted on a CPU',
}


def serves(implementation: str, kernel: str, dtype: str, dropout_rate: float) -> bool:
  """Whether `implementation` serves a call of `kernel` ('shaw' or 'xl') with inputs of `dtype`
  (a name: 'bfloat16') and `dropout_rate`: the kernel is one of `SERVES[implementation]`, and
  for `HALF_PRECISION` the inputs are 16-bit (`HALF_DTYPES`) and there is no dropout."""
  if kernel not in SERVES[implementation]:
    return False
  if implementation not in HALF_PRECISION:
    return True
  return dtype in HALF_DTYPES and not dropout_rate


def off_its_devices(implementation: str, platform: str, *, where: str) -> str | None:
  """Why `implementation` does not run on devices of `platform` ('cpu', 'gpu', 'tpu'), as
  '<where>=<implementation> runs on <platforms> devices only (<why>)', or None where it does:
  the one rule of `RUNS_ON`, which `check_runs_on` refuses by and the tools that read a run's
  own config run 'auto' by (`relpos.training.task_base.runnable_here`)."""
  runs_on = RUNS_ON.get(implementation, (platform,))
  if platform in runs_on:
    return None
  return (
    f'{where}={implementation!r} runs on {" and ".join(runs_on)} devices only '
    f'({_WHY[implementation]})'
  )


def check_runs_on(implementation: str, platform: str, *, where: str = 'implementation') -> None:
  """ValueError of one line, naming `where`, if `implementation` does not run on devices of
  `platform` ('cpu', 'gpu', 'tpu'): e.g. 'cudnn' on a CPU, which JAX would refuse only when
  the step compiles, with a traceback."""
  if reason := off_its_devices(implementation, platform, where=where):
    raise ValueError(f"{reason}; this run's devices are {platform}: use 'auto' or 'xla'")


def tiles_name(block_sizes=None) -> str:
  """The name of the 'pallas' implementation at `block_sizes`: 'pallas' for its default tiles
  (None), 'pallas@QxK' for (Q, K) (as benchmarks/attention.py names tilings)."""
  if block_sizes is None:
    return 'pallas'
  block_q, block_k = (int(b) for b in block_sizes)
  return f'pallas@{block_q}x{block_k}'


def parse_choice(name: str) -> tuple[str, tuple[int, int] | None]:
  """(implementation, block_sizes) for 'xla', 'cudnn', 'mosaic', 'pallas' or 'pallas@QxK'
  (`tiles_name`'s); block_sizes None but for 'pallas@QxK' ('pallas': the default tiles).
  Raises ValueError for other names."""
  implementation, at, tiles = name.partition('@')
  unknown = f"not 'xla', 'cudnn', 'mosaic', 'pallas' or 'pallas@QxK': {name!r}"
  if implementation not in IMPLEMENTATIONS or implementation == 'auto':
    raise ValueError(unknown)
  if at and implementation != 'pallas':
    raise ValueError(unknown)
  if not at:
    return implementation, None
  try:
    block_q, block_k = (int(size) for size in tiles.split('x'))
  except ValueError:
    raise ValueError(unknown) from None
  if tiles_name((block_q, block_k)) != name or min(block_q, block_k) < 1:
    raise ValueError(unknown)
  return implementation, (block_q, block_k)


def resolve_implementation(
  implementation: str, block_sizes=None, tune: Callable[[], str] | None = None, *, kernel: str
) -> tuple[str, Any]:
  """(implementation, block_sizes) for a `kernel`'s ('shaw' or 'xl') `implementation` and
  `block_sizes` arguments: 'xla', 'pallas' or (XL) 'cudnn', and the Pallas tiles to use (None:
  the kernel's default).

  'xla', 'pallas' and 'cudnn' are kept with the caller's `block_sizes`. 'auto' is `tune()`,
  the caller's measured choice at the shapes of its call (`relpos.attention.autotune`: the
  fastest of its candidates, timed forward and backward, on a GPU; 'xla' on CPUs, where Pallas
  only interprets, and on TPUs, where these Triton kernels do not lower), or 'xla' without
  `tune`. The tuner names its choice 'xla', 'cudnn', 'pallas' (the caller's `block_sizes`,
  None: the default tiles) or 'pallas@QxK' (those tiles), and this returns its implementation
  and tiles. Raises ValueError for a name not in IMPLEMENTATIONS or one the kernel has not
  (`SERVES`: 'cudnn' is XL's only).
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
      f'implementation must be one of {", ".join(map(repr, IMPLEMENTATIONS))}; '
      f'got {implementation!r}'
    )
  if kernel not in SERVES[implementation]:
    served = [name for name in IMPLEMENTATIONS if kernel in SERVES[name]]
    raise ValueError(
      f"implementation={implementation!r} is not one of {kernel} attention's "
      f'({", ".join(map(repr, served))})'
    )
  if implementation != 'auto':
    return implementation, block_sizes
  if tune is None:
    return 'xla', block_sizes
  implementation, tiles = parse_choice(tune())
  return implementation, block_sizes if tiles is None else tiles
