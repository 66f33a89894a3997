"""Attention kernel benchmark sizes (benchmarks/attention.py reads this config).

    python benchmarks/attention.py --config=configs/attention_benchmark.py          # full table
    python benchmarks/attention.py --config=configs/attention_benchmark.py:quick    # ~1 min
    python benchmarks/attention.py --config=configs/attention_benchmark.py:gpu      # on a GPU
    python benchmarks/attention.py --config=configs/attention_benchmark.py \\
        --config.lengths=1024 --config.distances=16 --config.rounds=3

Presets: full and quick time the XLA kernels in float32 (CPU); gpu is issue 15's GPU table:
n in {512, 2048, 8192}, k in {16, 64}, bf16, vanilla, cuDNN flash attention, Shaw and XL in
both implementations.
"""

import ml_collections

from relpos.config import unknown_preset


def get_config(preset: str = 'full') -> ml_collections.ConfigDict:
  if preset not in ('full', 'quick', 'gpu'):
    raise unknown_preset(preset, ('full', 'quick', 'gpu'))
  config = ml_collections.ConfigDict()
  config.heads = 8
  config.head_dim = 64
  # Every row uses batch = max(1, tokens // n), so rows of different n cost alike.
  config.tokens = 4096
  config.lengths = (128, 512, 2048) if preset == 'full' else (128, 512)
  config.distances = (4, 16, 64) if preset == 'full' else (16,)
  config.rounds = 5  # interleaved timing rounds per row; the median is reported
  config.repeats = 1  # calls per timing, dispatched back to back (GPU: hides dispatch)
  config.compile_threads = 0  # functions compiled at once before timing; 0: one per core
  config.dtype = 'float32'
  config.kernels = ('vanilla', 'shaw', 'banded', 'dense', 'xl')
  config.peak_tflops = 0.0  # 0: the device's data-sheet bf16 peak where known, else none
  config.plot = ''  # a .png path: time / vanilla against n, drawn after the table
  # Kernels whose fwd+bwd is then traced (benchmarks/step_profile.py) at every (n, k): where
  # the time goes, each Pallas kernel (forward, dq, dk/dv, d rel) by its name.
  config.profile = ()
  if preset == 'gpu':
    config.tokens = 32768
    config.lengths = (512, 2048, 8192)
    config.distances = (16, 64)
    config.dtype = 'bfloat16'
    # Few calls: on an H200 the Pallas kernels took up to 0.5 s per fwd+bwd call at n = 512.
    config.rounds = 3
    config.repeats = 3
    # JAX's own Pallas flash kernels (Triton, Mosaic GPU) beside cuDNN: what each backend
    # reaches without relative terms, the ceilings of relpos's fused kernels.
    config.kernels = (
      'vanilla',
      'cudnn',
      'flash_pallas',
      'flash_mosaic',
      'shaw',
      'shaw_pallas',
      'xl',
      'xl_pallas',
      'xl_cudnn',
    )
    # XL's backward took 5.3x its forward on an H200 (docs/gpu.md): which of its kernels.
    config.profile = ('xl_pallas', 'shaw_pallas')
  return config
