"""Pure functional attention kernels and position schemes.

Kernels: vanilla (with an optional logit bias), Shaw et al. 2018 and Transformer-XL. All take
query [batch, q_len, heads, head_dim] and key/value [batch, kv_len, heads, head_dim], an
optional bool mask broadcastable to [batch, heads, q_len, kv_len] (True = may attend), and
return [batch, q_len, heads, head_dim]. Softmax and matmul sums run in float32 (float64 for
float64 inputs); bf16 inputs stay bf16 in the matmuls. Shaw's and Transformer-XL's kernels take
`implementation='auto' | 'xla' | 'pallas' | 'mosaic'` (XL also 'cudnn'): 'pallas' is a fused,
tiled flash-attention style kernel in Pallas's Triton backend (`pallas_shaw`, `pallas_xl`,
shared parts in `pallas_common`), interpreted on CPU; 'mosaic' a causal one in Pallas Mosaic GPU
(`mosaic_shaw`, `mosaic_xl`, shared parts in `mosaic_common`; Hopper, bf16/fp16), used where the
mask is causal and 'xla' or 'pallas' elsewhere (`mosaic_dispatch`); XL's 'cudnn' is its position
term as the bias of cuDNN's flash attention (`xl.xl_attention_cudnn`: bf16/fp16, no dropout,
NVIDIA GPUs); 'auto' is, on a GPU, whichever of 'xla', 'pallas' at a few tilings, (XL in bf16)
'cudnn' and (opted in) 'mosaic' ran fastest forward and backward at the shapes of the call,
timed on first use and cached (`autotune`), and 'xla' elsewhere. The names and what each serves,
takes and runs on are `implementations`' (no Pallas imported).

Position schemes that feed vanilla attention: T5's bucketed relative bias
(`t5_relative_bias`) and ALiBi's linear bias (`alibi_bias`), both [heads, q_len, kv_len]
logit biases passed as `dot_product_attention(..., bias=...)`, and RoPE (`apply_rope`), which
rotates queries and keys by their absolute positions before the dot product.
"""

import importlib

# Each public name and the module that defines it, imported on first use (PEP 562): importing a
# light module of this package (`implementations`, `masking`) then loads no kernel, and with
# them no Pallas, which the config declarations and the training layer need not.
_HOMES = {
  'alibi_bias': 'alibi',
  'alibi_slopes': 'alibi',
  'apply_rope': 'rope',
  'causal_mask': 'masking',
  'dot_product_attention': 'dot_product',
  'relative_buckets': 'shaw',
  'relative_shift': 'xl',
  'shaw_attention': 'shaw',
  'shaw_attention_banded': 'shaw',
  'shaw_attention_dense': 'shaw',
  'sinusoidal_embedding': 'sinusoid',
  't5_relative_bias': 't5',
  't5_relative_buckets': 't5',
  'xl_attention': 'xl',
  'xl_relative_encoding': 'sinusoid',
  'with_causal': 'masking',
}


def __getattr__(name: str):
  """A public name (`_HOMES`) or a submodule (`attention.shaw`), imported now."""
  if name in _HOMES:
    return getattr(importlib.import_module(f'{__name__}.{_HOMES[name]}'), name)
  if name.startswith('_'):
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  try:
    return importlib.import_module(f'{__name__}.{name}')
  except ModuleNotFoundError as error:
    if error.name != f'{__name__}.{name}':
      raise
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}') from None


def __dir__():
  return sorted({*globals(), *_HOMES})


__all__ = sorted(_HOMES)
