"""benchmarks/step_profile.py: the HLO parser and the classification of a GPU module's ops
(hand-written HLO in the form XLA:GPU prints), the interval union, and real traces of small
jitted steps on the CPU (one with donated, mesh-replicated state, as the step benchmarks')."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import step_profile
from step_profile import Event, category, parse_hlo, pass_of

# XLA prints one instruction per line, however long.
GPU_HLO = """HloModule jit_step, entry_computation_layout={(bf16[64,64]{1,0})->f32[]}

%fused_transpose (param_0: bf16[4,8,16]) -> bf16[8,4,16] {
  %param_0 = bf16[4,8,16]{2,1,0} parameter(0)
  ROOT %transpose.1 = bf16[8,4,16]{2,1,0} transpose(%param_0), dimensions={1,0,2}
}

%gemm_fusion_dot.3_computation (parameter_0: bf16[64,64], parameter_1: bf16[64,64]) -> bf16[64,64] {
  %parameter_0 = bf16[64,64]{1,0} parameter(0)
  %parameter_1 = bf16[64,64]{1,0} parameter(1)
  ROOT %dot.3 = bf16[64,64]{1,0} dot(%parameter_0, %parameter_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_reduce (param_0.1: f32[64,64]) -> f32[64] {
  %param_0.1 = f32[64,64]{1,0} parameter(0)
  %constant_1 = f32[] constant(0)
  ROOT %reduce.2 = f32[64]{0} reduce(%param_0.1, %constant_1), dimensions={1}, to_apply=%add
}

%fused_gather (param_0.2: f32[128,64], param_1.2: s32[64,1]) -> f32[64,64] {
  %param_0.2 = f32[128,64]{1,0} parameter(0)
  %param_1.2 = s32[64,1]{1,0} parameter(1)
  ROOT %gather.1 = f32[64,64]{1,0} gather(%param_0.2, %param_1.2), offset_dims={1}
}

%fused_bits (param_0.4: u32[64], param_1.4: f32[64]) -> f32[64] {
  %param_0.4 = u32[64]{0} parameter(0)
  %param_1.4 = f32[64]{0} parameter(1)
  %constant_13 = u32[64]{0} constant({...})
  %shift-right-logical.1 = u32[64]{0} shift-right-logical(%param_0.4, %constant_13)
  %xor.1 = u32[64]{0} xor(%shift-right-logical.1, %param_0.4)
  %compare.1 = pred[64]{0} compare(%xor.1, %param_0.4), direction=LT
  ROOT %select.1 = f32[64]{0} select(%compare.1, %param_1.4, %param_1.4)
}

%fused_add (param_0.3: f32[64]) -> f32[64] {
  %param_0.3 = f32[64]{0} parameter(0)
  ROOT %add.9 = f32[64]{0} add(%param_0.3, %param_0.3)
}

ENTRY %main.10 (Arg_0.1: bf16[64,64]) -> f32[] {
  %Arg_0.1 = bf16[64,64]{1,0} parameter(0)
  %custom-call.2 = (bf16[64,64]{1,0}, s8[4194304]{0}) custom-call(%Arg_0.1, %Arg_0.1), custom_call_target="__cublas$gemm", metadata={op_name="jit(step)/jvp(dense)/dot_general" stack_frame_id=3}
  %custom-call.5 = bf16[2,64,64]{2,1,0} custom-call(%Arg_0.1), custom_call_target="__gpu$xla.gpu.triton", metadata={op_name="jit(step)/transpose(jvp(attention))/pallas_call"}
  %gemm_fusion_dot.3 = bf16[64,64]{1,0} fusion(%Arg_0.1, %Arg_0.1), kind=kCustom, calls=%gemm_fusion_dot.3_computation, metadata={op_name="jit(step)/transpose(jvp(ff))/dot_general"}
  %transpose_fusion = bf16[8,4,16]{2,1,0} fusion(%Arg_0.1), kind=kLoop, calls=%fused_transpose
  %input_reduce_fusion = f32[64]{0} fusion(%Arg_0.1), kind=kInput, calls=%fused_reduce, metadata={op_name="jit(step)/jvp(loss)/reduce_sum"}
  %loop_gather_fusion = f32[64,64]{1,0} fusion(%Arg_0.1), kind=kLoop, calls=%fused_gather
  %loop_add_fusion = f32[64]{0} fusion(%Arg_0.1), kind=kLoop, calls=%fused_add, metadata={op_name="jit(step)/add"}
  %loop_select_fusion = f32[64]{0} fusion(%Arg_0.1, %Arg_0.1), kind=kLoop, calls=%fused_bits, metadata={op_name="jit(step)/jvp()/select_n"}
  %all-reduce-start.1 = f32[64]{0} all-reduce-start(%loop_add_fusion), replica_groups={}, to_apply=%add
  ROOT %copy.7 = f32[] copy(%Arg_0.1)
}
"""  # noqa: E501


def test_a_gpu_modules_ops_are_classified_by_what_they_are_and_their_pass():
  instructions, computations = parse_hlo(GPU_HLO)
  assert instructions['custom-call.2'].target == '__cublas$gemm'
  assert instructions['gemm_fusion_dot.3'].calls == 'gemm_fusion_dot.3_computation'
  assert computations['fused_reduce'] == ['parameter', 'constant', 'reduce']
  want = {
    'custom-call.2': ('matmuls', 'forward'),
    'custom-call.5': ('attention kernels (Pallas, cuDNN)', 'backward'),
    'gemm_fusion_dot.3': ('matmuls', 'backward'),
    'transpose_fusion': ('layout copies, transposes', 'rest (loss, update)'),
    'input_reduce_fusion': ('reductions', 'forward'),
    'loop_gather_fusion': ('gather, scatter', 'rest (loss, update)'),
    'loop_add_fusion': ('elementwise fusions', 'rest (loss, update)'),
    'loop_select_fusion': ('random bits (dropout)', 'forward'),
    'all-reduce-start.1': ('collectives', 'rest (loss, update)'),
    'copy.7': ('layout copies, transposes', 'rest (loss, update)'),
  }
  got = {
    name: (category(instructions[name], computations), pass_of(instructions[name])) for name in want
  }
  assert got == want
  assert category(None, computations) == 'other' and pass_of(None) == 'rest (loss, update)'


def test_summary_adds_per_step_and_the_busy_time_is_the_union_of_intervals():
  ns = 1e6  # a millisecond
  events = [
    Event('custom-call.2', 0, 10 * ns),
    Event('custom-call.2', 5 * ns, 10 * ns),  # overlaps the first (another stream)
    Event('loop_add_fusion', 20 * ns, 5 * ns, kernel='loop_add_fusion_kernel'),
    Event('MemcpyH2D', 30 * ns, 2 * ns),
    Event('not-in-module', 40 * ns, 1 * ns),
  ]
  assert step_profile.busy_ns(events) == pytest.approx(23 * ns)
  profile = step_profile.summarize(events, GPU_HLO, steps=2, wall_s=0.1)
  assert profile.wall_s == pytest.approx(0.05) and profile.busy_s == pytest.approx(0.0115)
  assert profile.by_category['matmuls'] == pytest.approx(0.010)
  assert profile.by_category['elementwise fusions'] == pytest.approx(0.0025)
  assert profile.by_category['host-device copies'] == pytest.approx(0.001)
  assert profile.by_category['other'] == pytest.approx(0.0005)
  assert profile.by_pass['forward'] == pytest.approx(0.010)
  assert profile.by_op[0] == ('custom-call.2', 'matmuls', pytest.approx(0.010))
  table = profile.table(top=2)
  assert 'wall 50.00 ms/step; device busy 11.50 ms/step (23.0%)' in table
  assert '| matmuls | 10.00 | 20.0 |' in table
  assert '| custom-call.2 | matmuls | 10.000 | 20.0 |' in table
  # An op's kernel, where the trace names one (a Pallas kernel behind its custom call).
  assert '| loop_add_fusion (loop_add_fusion_kernel) | elementwise fusions | 2.500 |' in table
  assert 'not-in-module' not in table  # only the top 2 ops are listed


def test_a_real_trace_on_the_cpu_finds_the_steps_matmul(tmp_path):
  @jax.jit
  def step(a, b):
    return jnp.tanh(a @ b).T.sum(0)

  a = jnp.asarray(np.random.default_rng(0).normal(size=(256, 256)), jnp.float32)
  text = step_profile.compiled_text(step, a, a)

  def call():
    return step(a, a)

  profile = step_profile.profile(call, text(), steps=3, trace_dir=tmp_path / 'trace')
  assert profile.by_category['matmuls'] > 0
  assert 0 < profile.busy_s <= profile.wall_s * 1.05
  assert list(tmp_path.glob('trace/**/*.xplane.pb'))  # the trace is kept where asked
  assert profile.lines == ['/host:CPU: ' + profile.lines[0].split(': ', 1)[1]]


def test_a_train_step_with_donated_sharded_state_has_both_passes(capsys):
  """A train step as the step benchmarks profile one: state donated and replicated over the
  devices' mesh, a batch on one device; its compiled text is taken before the donation."""
  from relpos.training.mesh import data_mesh

  mesh = data_mesh()
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  weights = jax.device_put(jnp.ones((64, 64)) / 64, replicated)
  batch = jnp.asarray(np.random.default_rng(0).normal(size=(32, 64)), jnp.float32)

  @jax.jit
  def loss(w, x):
    return jnp.mean(jnp.tanh(jnp.tanh(x @ w) @ w) ** 2)

  train_step = jax.jit(lambda w, x: (w - 0.1 * jax.grad(loss)(w, x), loss(w, x)), donate_argnums=0)
  text = step_profile.compiled_text(train_step, weights, batch)
  carried = {'w': weights}

  def call():
    carried['w'], value = train_step(carried['w'], batch)
    return value

  step_profile.print_profiles({'tiny': call}, {'tiny': text}, steps=2)
  out = capsys.readouterr().out
  assert out.startswith('\n### profile: tiny\n')
  rows = {
    cells[1].strip(): float(cells[2])
    for cells in (line.split('|') for line in out.splitlines() if line.startswith('| '))
    if len(cells) == 5 and cells[2].strip().replace('.', '').isdigit()
  }
  assert rows['matmuls'] > 0 and rows['forward'] > 0 and rows['backward'] > 0


def test_a_device_event_without_an_hlo_op_stat_is_named_by_its_annotation_or_kernel():
  assert step_profile._op_of('k', {'hlo_op': 'fusion.3'}) == 'fusion.3'
  annotation = {'kernel_annotation': 'jit_step/fusion.7#hlo_op=fusion.7,hlo_module=jit_step#'}
  assert step_profile._op_of('loop_add_kernel', annotation) == 'fusion.7'
  assert step_profile._op_of('sm90_xmma_gemm_bf16', {'correlation_id': 4}) == 'sm90_xmma_gemm_bf16'
  named = {
    'sm90_xmma_gemm_bf16bf16_bf16f32': 'matmuls',
    'nvjet_hsh_128x256': 'matmuls',
    'xl_backward_drel': 'attention kernels (Pallas, cuDNN)',
    'shaw_forward': 'attention kernels (Pallas, cuDNN)',
    'MemcpyD2H': 'host-device copies',
    'ncclDevKernel_AllReduce': 'collectives',
    'input_reduce_fusion_3': 'reductions',
    'loop_multiply_fusion': 'elementwise fusions',
    'something_else': 'other',
  }
  assert {name: step_profile.category_of_name(name) for name in named} == named


def test_floor_line_on_a_known_gpu_only():
  import hlo_cost
  from step_profile import floor_line
  from test_hlo_cost import HLO

  floor = hlo_cost.roofline(hlo_cost.parse(HLO), hlo_cost.DEVICES['H200']).seconds
  line = floor_line(HLO, 'xl', 2e-3, 'NVIDIA H200')
  assert line.startswith('floor on the H200 SXM (benchmarks/hlo_cost.py')
  assert line.endswith(f'this step took 2.00 ms, {2e-3 / floor:.2f}x its floor')
  # 'mosaic' counts the cheap branch (the test module's conditional: a fusion, not the kernel).
  cheap = hlo_cost.roofline(hlo_cost.parse(HLO), hlo_cost.DEVICES['H200'], branches='cheapest')
  assert floor_line(HLO, 'xl, mosaic kernels', 2e-3, 'NVIDIA H200').endswith(
    f'{2e-3 / cheap.seconds:.2f}x its floor'
  )
  assert cheap.seconds < floor
  assert floor_line(HLO, 'xl', 2e-3, 'NVIDIA H100 80GB HBM3').startswith('floor on the H100 SXM')
  assert floor_line(HLO, 'xl', 2e-3, 'cpu') is None
  assert floor_line(HLO, 'xl', 2e-3, 'NVIDIA H100 PCIe') is None
  # Several module runs (a translation pass, a text per batch): their floors summed.
  twice = floor_line([HLO, HLO], 'xl', 2e-3, 'NVIDIA H200')
  assert 'over its 2 module runs' in twice and twice.endswith(f'{1e-3 / floor:.2f}x its floor')
  assert 'random bits' not in line  # no ALU-bound launch in that module


def test_floor_line_names_the_random_bits_part_of_the_floor(monkeypatch):
  import dataclasses

  import hlo_cost
  from step_profile import floor_line
  from test_hlo_cost import RANDOM_HLO

  # An H200 whose SMs issue slowly enough that the test module's hashing (16 operations against
  # 9 bytes an element) outlasts its bytes, and its plain scaling (1 against 8) does not.
  slow = dataclasses.replace(hlo_cost.DEVICES['H200'], elementwise_ops=2e12)
  monkeypatch.setitem(hlo_cost.DEVICES, 'H200', slow)
  roofline = hlo_cost.roofline(hlo_cost.parse(RANDOM_HLO), slow)
  bits = roofline.kinds['ALU-bound'][3]
  assert bits == pytest.approx(16 * 4096 / 2e12)
  line = floor_line(RANDOM_HLO, 'xl', 2e-3, 'NVIDIA H200')
  assert (
    f'{roofline.seconds * 1e3:.2f} ms a step (ALU-bound, random bits: {bits * 1e3:.2f} ms)'
    in (line)
  )
