"""relpos: relative position representations in self-attention (JAX/Flax)."""
