"""Train a model from a config file, resuming from the workdir's latest checkpoint.

    python train.py --config=configs/char_tiny.py --workdir=runs/char_tiny [--config.key=value ...]

Evaluates the final checkpoint at the end (as eval.py does) and prints the metric last.
"""

from relpos.training import tasks

if __name__ == '__main__':
  tasks.launch('train_and_evaluate')
