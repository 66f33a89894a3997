"""Evaluate the latest checkpoint of a workdir; the last line printed is the metric.

    python eval.py --config=configs/char_tiny.py --workdir=runs/char_tiny   # ... bpc=<float>
    python eval.py --workdir=runs/char_tiny   # the config the run recorded (its config.json)

Evaluation settings come from config.eval (split, tgt_len, mem_len, clamp_len, same_length).
`--output_dir=D` writes eval_results.json (and translations) to D instead of the workdir, so
one checkpoint can be scored with several config.eval settings side by side.
"""

from relpos import runtime

if __name__ == '__main__':
  runtime.apply_defaults()  # before JAX starts: allocator, compilation cache
  from relpos.training import tasks

  tasks.launch('evaluate')
