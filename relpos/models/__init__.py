"""Models built on the `relpos.attention` kernels (`relpos.models.transformer_xl`)."""
