"""Command-line tools that read a trained run: translate and sample."""
