"""benchmarks/gpu_compile.py: its readers of ptxas's report and of a compiled HLO module, on
recorded and hand-written text, and its one-line refusal where JAX has no CUDA plugin (the
compiling itself needs jax[cuda13] on Python >= 3.12: run by hand, figures in docs/gpu.md)."""

import importlib.util
import types

import pytest
from gpu_compile import STEP_HEADER, census, main, parse_ptxas, step_row

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


# A compiled module's shape: fusion bodies (never launched themselves), a while loop whose body
# launches a fusion and a custom call, a GEMM fusion and an unfused copy in the entry.
HLO = """\
HloModule jit_step, entry_computation_layout={(bf16[4,4]{1,0})->bf16[4,4]{0,1}}

%fused_transpose.1 (param_0: f32[2,3]) -> f32[3,2] {
  %param_0 = f32[2,3]{1,0} parameter(0)
  ROOT %transpose.9 = f32[3,2]{1,0} transpose(%param_0), dimensions={1,0}
}

%gemm_fusion.2 (p0: bf16[4,4], p1: bf16[4,4]) -> bf16[4,4] {
  %p0 = bf16[4,4]{1,0} parameter(0)
  %p1 = bf16[4,4]{1,0} parameter(1)
  ROOT %dot.1 = bf16[4,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%region_0.3 (arg: (s32[], f32[2,3])) -> (s32[], f32[2,3]) {
  %arg = (s32[], f32[2,3]) parameter(0)
  %x = f32[2,3]{1,0} get-tuple-element(%arg), index=1
  %loop_transpose_fusion = f32[3,2]{1,0} fusion(%x), kind=kLoop, calls=%fused_transpose.1
  %kernel = f32[2,3]{1,0} custom-call(%loop_transpose_fusion), custom_call_target="mosaic_gpu_v2"
  %i = s32[] get-tuple-element(%arg), index=0
  ROOT %tuple = (s32[], f32[2,3]) tuple(%i, %kernel)
}

%region_1.4 (arg: (s32[], f32[2,3])) -> pred[] {
  %arg = (s32[], f32[2,3]) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %n = s32[] constant(12)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main.5 (a: bf16[4,4]) -> bf16[4,4] {
  %a = bf16[4,4]{1,0} parameter(0)
  %gemm = bf16[4,4]{1,0} fusion(%a, %a), kind=kCustom, calls=%gemm_fusion.2
  %init = (s32[], f32[2,3]) custom-call(), custom_call_target="AllocateBuffer"
  %loop = (s32[], f32[2,3]) while(%init), condition=%region_1.4, body=%region_0.3
  ROOT %copy.7 = bf16[4,4]{0,1} copy(%gemm)
}
"""


def test_census_counts_launches_once_per_computation():
  assert census(HLO) == {
    'kernels': 5,  # gemm, AllocateBuffer, copy; the loop body's fusion and custom call
    'matmuls': 1,
    'copies': 2,  # the unfused copy and the transpose fusion; the transpose inside it is not one
    'copy_bytes': 2 * (16 * 2 + 6 * 4),  # each read and written: bf16[4,4] and f32[3,2]
    'custom_calls': {'mosaic_gpu_v2': 1, 'AllocateBuffer': 1},
  }


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
  row = step_row('xl', 'mosaic', memory, census(HLO), 12.3)
  assert row.count('|') == STEP_HEADER.count('|')
  assert row.startswith('| xl | mosaic | 1.000 | 1.500 | 5 | 1 | 2 | 0.0 | AllocateBuffer 1, ')
