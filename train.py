"""Train a model from a config file, resuming from the workdir's latest checkpoint.

    python train.py --config=configs/char_tiny.py --workdir=runs/char_tiny [--config.key=value ...]

Evaluates the final checkpoint at the end (as eval.py does) and prints the metric last.
"""

from relpos import runtime

if __name__ == '__main__':
  runtime.apply_defaults()  # before JAX starts: allocator, compilation cache
  from relpos.training import tasks

  tasks.launch('train_and_evaluate')
