"""benchmarks/gpu_compile.py: its readers of ptxas's report and of a compiled HLO module, on
recorded and hand-written text, and its one-line refusal where JAX has no CUDA plugin (the
compiling itself needs jax[cuda13] on Python >= 3.12: run by hand, figures in docs/gpu.md)."""

import importlib.util
import types

import hlo_cost
import pytest
from gpu_compile import (
  FLOOR_HEADER,
  KERNEL_PASSES,
  STEP_HEADER,
  floor_row,
  kernel_attention_flops,
  main,
  parse_ptxas,
  step_row,
  step_shape,
  top_operations,
)
from test_hlo_cost import MODULE

# Recorded from `MOSAIC_GPU_DUMP_PTXAS=1` while compiling mosaic_xl's gradient (jax 0.11.2):
# the forward twice (the gradient recomputes it), one backward kernel with a spill warning.
PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'relpos_xl_forward_mosaic_gpu_kernel' for 'sm_90a'
ptxas info    : Function properties for relpos_xl_forward_mosaic_gpu_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 158 registers, used 2 barriers, 1 bytes smem
ptxas info    : Compile time = 245.165 ms
ptxas info    : Compiling entry function 'relpos_xl_forward_mosaic_gpu_kernel' for 'sm_90a'
ptxas info    : Function properties for relpos_xl_forward_mosaic_gpu_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 158 registers, used 2 barriers, 1 bytes smem
ptxas warning : Registers are spilled to local memory in function 'relpos_xl_backward_dkv_mosaic_gpu_kernel', 100 bytes spill stores, 100 bytes spill loads
ptxas info    : Compiling entry function 'relpos_xl_backward_dkv_mosaic_gpu_kernel' for 'sm_90a'
ptxas info    : Function properties for relpos_xl_backward_dkv_mosaic_gpu_kernel
    104 bytes stack frame, 100 bytes spill stores, 100 bytes spill loads
ptxas info    : Used 255 registers, used 2 barriers, 104 bytes cumulative stack size, 1 bytes smem
"""  # noqa: E501


def test_parse_ptxas():
  assert parse_ptxas(PTXAS) == {
    'relpos_xl_forward': {'arch': 'sm_90a', 'registers': 158, 'spill_stores': 0, 'spill_loads': 0},
    'relpos_xl_backward_dkv': {
      'arch': 'sm_90a',
      'registers': 255,
      'spill_stores': 100,
      'spill_loads': 100,
    },
  }
  assert parse_ptxas('nothing compiled') == {}


def _has_cuda_plugin() -> bool:
  try:
    return importlib.util.find_spec('jax_plugins.xla_cuda13') is not None
  except ModuleNotFoundError:  # no jax_plugins package at all
    return False


@pytest.mark.skipif(
  _has_cuda_plugin(), reason='this JAX has the CUDA plugin: it compiles instead of refusing'
)
def test_refuses_in_one_line_without_the_cuda_plugin():
  with pytest.raises(SystemExit) as refusal:
    main(['kernels'])
  message = str(refusal.value)
  assert '\n' not in message
  assert message.startswith('gpu_compile: cannot compile for an H100 here')
  assert 'jax[cuda13]==0.11.2' in message


def test_step_rows_fill_the_header():
  memory = types.SimpleNamespace(argument_size_in_bytes=2**30, temp_size_in_bytes=3 * 2**29)
  row = step_row('xl', 'mosaic', memory, hlo_cost.census(MODULE), 12.3)
  assert row.count('|') == STEP_HEADER.count('|')
  assert row.startswith('| xl | mosaic | 1.000 | 1.500 | 7 | 1 | 1 | 0.0 | mosaic_gpu_v2 1 | 12 |')


def test_floor_rows_fill_the_header_and_add_the_kernels_arithmetic():
  floors = {name: hlo_cost.roofline(MODULE, device) for name, device in hlo_cost.DEVICES.items()}
  peak = hlo_cost.DEVICES['H200'].bf16_flops
  # The module launches a custom call, so the kernels' FLOPs join the floor: 1 ms of them.
  row = floor_row('xl', 'mosaic', floors, kernel_flops=peak * 1e-3, train_flops=peak * 1e-3)
  assert row.count('|') == FLOOR_HEADER.count('|')
  cells = [cell.strip() for cell in row.strip('|').split('|')]
  assert cells[:3] == ['xl', 'mosaic', '8']
  assert cells[5] == '0.0 / 0.0' and cells[6] == '1.0'
  # Model FLOPs worth 1 ms at the peak over 1 ms of kernels plus a floor of microseconds.
  assert cells[7] == '100% / 100%'
  # At an H200's bandwidth the custom call's 270 kB outweigh the GEMM's 8 kFLOP and 1.8 kB.
  assert top_operations(floors['H200'], 1) == ['- 0.00 ms, 1 launches, custom call: `(no op_name)`']


def test_kernel_attention_flops_by_hand():
  """XL, one layer, batch 1, 2 heads of 4, 4 queries over 4 + 4 keys: q·k, p·v and the
  position logits are each 2·4 FLOPs per head and visible pair, of which causally
  5 + 6 + 7 + 8 = 26. Shaw translation, one encoder and one decoder layer, sentences of 3: q·k
  and p·v over the encoder's 9 pairs and the decoder's 6 visible ones."""
  from relpos.config.char_lm_defaults import char_lm_config
  from relpos.config.translation_defaults import translate_config

  config = char_lm_config()
  config.model.update(num_layers=1, num_heads=2, head_dim=4, d_model=8, d_ff=16, position='xl')
  config.train.update(batch_size=1, tgt_len=4, mem_len=4)
  assert step_shape(config, 99) == (1, 4)
  assert kernel_attention_flops(config, (1, 4)) == KERNEL_PASSES * 3 * (2 * 4) * 2 * 26
  translation = translate_config()
  translation.model.update(encoder_layers=1, decoder_layers=1, num_heads=2, d_model=8)
  translation.model.position = 'shaw'
  translation.data.max_tokens = 12
  assert step_shape(translation, 3) == (4, 3, 3)
  assert kernel_attention_flops(translation, (1, 3, 3)) == KERNEL_PASSES * 2 * (2 * 4) * 2 * (9 + 6)
