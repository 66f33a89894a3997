"""The two models on the `relpos.attention` kernels, with one shared attention layer: the
encoder-decoder `transformer` and the Transformer-XL LM `transformer_xl`.

Importing the package makes JAX draw its random bits on the CPU without a rolled loop (same
bits, faster dropout: `relpos.threefry_lowering`)."""

from relpos import threefry_lowering

threefry_lowering.unroll_on_cpu()
