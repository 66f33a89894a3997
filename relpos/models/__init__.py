"""The two models on the `relpos.attention` kernels, with one shared attention layer: the
encoder-decoder `transformer` and the Transformer-XL LM `transformer_xl`."""
