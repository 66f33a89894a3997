"""benchmarks/hlo_cost.py: a compiled module's launches, their FLOPs and bytes, and the floor
they put under a step, on hand-written HLO whose figures are counted here by hand."""

import pytest
from hlo_cost import DEVICES, Device, census, launch_cost, launches, parse, roofline, shape_bytes

# The entry launches: a GEMM fusion (bf16 [8,16] x [16,32]), a fusion that reads one layer of a
# stacked [4,8,16] f32 weight through a dynamic slice, a fusion that writes a [1,8,16] update
# into a [4,8,16] buffer in place, a loop (trip count 3) whose body launches one elementwise
# fusion, a conditional with a cheap and a dear branch, and an unfused layout copy.
FUSED_UPDATE = """\
%fused_update (u0: f32[4,8,16], u1: f32[1,8,16], u2: s32[]) -> f32[4,8,16] {
  %u1 = f32[1,8,16]{2,1,0} parameter(1)
  %u0 = f32[4,8,16]{2,1,0} parameter(0)
  %u2 = s32[] parameter(2)
  %zero.1 = s32[] constant(0)
  ROOT %dus = f32[4,8,16]{2,1,0} dynamic-update-slice(%u0, %u1, %u2, %zero.1, %zero.1)
}
"""
HLO = """\
HloModule jit_step, entry_computation_layout={(bf16[8,16]{1,0})->f32[32,8]{0,1}}

%gemm_fusion.1_computation (p0: bf16[8,16], p1: bf16[16,32]) -> f32[8,32] {
  %p0 = bf16[8,16]{1,0} parameter(0)
  %p1 = bf16[16,32]{1,0} parameter(1)
  ROOT %dot.1 = f32[8,32]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_slice (s0: f32[4,8,16], s1: s32[]) -> f32[1,8,16] {
  %s0 = f32[4,8,16]{2,1,0} parameter(0)
  %s1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  %ds = f32[1,8,16]{2,1,0} dynamic-slice(%s0, %s1, %zero, %zero), dynamic_slice_sizes={1,8,16}
  ROOT %neg = f32[1,8,16]{2,1,0} negate(%ds)
}

@FUSED_UPDATE@

%fused_add (a0: f32[1024]) -> f32[1024] {
  %a0 = f32[1024]{0} parameter(0)
  ROOT %add = f32[1024]{0} add(%a0, %a0)
}

%body (arg: (s32[], f32[1024])) -> (s32[], f32[1024]) {
  %arg = (s32[], f32[1024]{0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %x = f32[1024]{0} get-tuple-element(%arg), index=1
  %loop_add = f32[1024]{0} fusion(%x), kind=kLoop, calls=%fused_add
  ROOT %out = (s32[], f32[1024]{0}) tuple(%i, %loop_add)
}

%condition (arg.1: (s32[], f32[1024])) -> pred[] {
  %arg.1 = (s32[], f32[1024]{0}) parameter(0)
  ROOT %true = pred[] constant(true)
}

%cheap (c0: f32[1024]) -> f32[1024] {
  %c0 = f32[1024]{0} parameter(0)
  ROOT %cheap_add = f32[1024]{0} fusion(%c0), kind=kLoop, calls=%fused_add
}

%dear (d0: f32[1024]) -> f32[1024] {
  %d0 = f32[1024]{0} parameter(0)
  %k = (f32[1024]{0}, f32[65536]{0}) custom-call(%d0), custom_call_target="mosaic_gpu_v2"
  ROOT %k0 = f32[1024]{0} get-tuple-element(%k), index=0
}

ENTRY %main (a: bf16[8,16], b: bf16[16,32], w: f32[4,8,16], v: f32[1024], j: s32[], p: pred[]) -> f32[32,8] {
  %a = bf16[8,16]{1,0} parameter(0)
  %b = bf16[16,32]{1,0} parameter(1)
  %w = f32[4,8,16]{2,1,0} parameter(2)
  %v = f32[1024]{0} parameter(3)
  %j = s32[] parameter(4)
  %p = pred[] parameter(5)
  %gemm = f32[8,32]{1,0} fusion(%a, %b), kind=kCustom, calls=%gemm_fusion.1_computation
  %layer = f32[1,8,16]{2,1,0} fusion(%w, %j), kind=kLoop, calls=%fused_slice
  %stored = f32[4,8,16]{2,1,0} fusion(%w, %layer, %j), kind=kLoop, calls=%fused_update
  %init = (s32[], f32[1024]{0}) tuple(%j, %v)
  %loop = (s32[], f32[1024]{0}) while(%init), condition=%condition, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %branch = f32[1024]{0} conditional(%p, %v, %v), true_computation=%cheap, false_computation=%dear
  ROOT %copy = f32[32,8]{0,1} copy(%gemm)
}
""".replace('@FUSED_UPDATE@\n', FUSED_UPDATE)  # noqa: E501
MODULE = parse(HLO)


def test_parse_reads_shapes_operands_and_roots():
  assert MODULE.entry == 'main'
  assert MODULE.shapes['gemm'] == 'f32[8,32]{1,0}'
  assert MODULE.shapes['k'] == '(f32[1024]{0}, f32[65536]{0})'
  gemm = next(i for i in MODULE.computations['main'] if i.name == 'gemm')
  assert gemm.opcode == 'fusion' and gemm.operands == ('a', 'b')
  assert gemm.called == ['gemm_fusion.1_computation']
  assert MODULE.roots['fused_update'] == 'dus'
  assert shape_bytes('(bf16[2,3]{1,0}, pred[5]{0})') == 2 * 6 + 5
  assert shape_bytes('f32[]') == 4


def test_launches_follow_loops_and_branches():
  found = {(launch.instruction.name, launch.times, launch.branch) for launch in launches(MODULE)}
  assert found == {
    ('gemm', 1, ()),
    ('layer', 1, ()),
    ('stored', 1, ()),
    ('loop_add', 3, ()),  # the body, its known trip count times; the condition launches nothing
    ('cheap_add', 1, (('branch', 0),)),
    ('k', 1, (('branch', 1),)),
    ('copy', 1, ()),
  }


def _cost(name):
  instruction = next(
    launch.instruction for launch in launches(MODULE) if launch.instruction.name == name
  )
  return launch_cost(instruction, MODULE)


def test_costs_count_matmuls_and_what_is_really_moved():
  gemm = _cost('gemm')
  assert gemm.kind == 'matmul' and gemm.half_precision
  assert gemm.flops == 2 * 8 * 16 * 32
  assert gemm.bytes == 8 * 16 * 2 + 16 * 32 * 2 + 8 * 32 * 4
  # One layer of the stacked weight is read, not all four; the index is 4 bytes.
  assert _cost('layer').bytes == 8 * 16 * 4 + 4 + 8 * 16 * 4
  # In place: the update read and written, the buffer neither.
  assert _cost('stored').bytes == 8 * 16 * 4 + 4 + 8 * 16 * 4
  copy = _cost('copy')
  assert copy.kind == 'layout copy' and copy.bytes == 2 * 8 * 32 * 4 and copy.flops == 0
  kernel = _cost('k')
  assert kernel.kind == 'custom call' and kernel.bytes == 1024 * 4 * 2 + 65536 * 4


def test_the_floor_sums_each_launch_at_its_bound_and_the_dearer_branch():
  device = Device('test', bf16_flops=1e6, float32_flops=5e5, bandwidth=1e9)
  floor = roofline(MODULE, device)
  gemm = max(2 * 8 * 16 * 32 / 1e6, (8 * 16 * 2 + 16 * 32 * 2 + 8 * 32 * 4) / 1e9)
  assert gemm == 2 * 8 * 16 * 32 / 1e6  # compute-bound at this peak
  expected = {
    'matmul': gemm,
    'memory-bound': (2 * (8 * 16 * 4) + 4) * 2 / 1e9 + 3 * 2 * 4096 / 1e9,
    'layout copy': 2 * 8 * 32 * 4 / 1e9,
    'custom call': (1024 * 4 * 2 + 65536 * 4) / 1e9,  # the dear branch, not the cheap one
  }
  for name, seconds in expected.items():
    assert floor.kinds[name][3] == pytest.approx(seconds), name
  assert floor.seconds == pytest.approx(sum(expected.values()))
  assert floor.launches == 1 + 2 + 3 + 1 + 1  # gemm; slice and update; 3 loop runs; k; copy
  assert floor.top[0][2] == 'gemm'
  # A faster memory lowers only the memory-bound parts.
  faster = roofline(MODULE, Device('test', 1e6, 5e5, 2e9))
  assert faster.kinds['matmul'][3] == pytest.approx(gemm)
  assert faster.kinds['layout copy'][3] == pytest.approx(expected['layout copy'] / 2)


def test_the_cheapest_branch_where_asked():
  device = Device('test', bf16_flops=1e6, float32_flops=5e5, bandwidth=1e9)
  cheapest = roofline(MODULE, device, branches='cheapest')
  assert cheapest.kinds['custom call'][0] == 0
  dearest = roofline(MODULE, device)
  assert dearest.kinds['memory-bound'][3] - cheapest.kinds['memory-bound'][3] == pytest.approx(
    -2 * 4096 / 1e9
  )
  with pytest.raises(ValueError, match='branches'):
    roofline(MODULE, device, branches='first')
  # A branch that launches nothing is the cheapest.
  empty = parse(
    HLO.replace(
      'ROOT %cheap_add = f32[1024]{0} fusion(%c0), kind=kLoop, calls=%fused_add',
      'ROOT %cheap_add = f32[1024]{0} bitcast(%c0)',
    )
  )
  assert roofline(empty, device, branches='cheapest').seconds == pytest.approx(
    cheapest.seconds - 2 * 4096 / 1e9
  )


def test_census_counts_each_launching_instruction_once():
  assert census(MODULE) == {
    'kernels': 7,  # gemm, layer, stored, the loop's add, both branches' launches, copy
    'matmuls': 1,
    'copies': 1,
    'copy_bytes': 2 * 8 * 32 * 4,
    'custom_calls': {'mosaic_gpu_v2': 1},
  }


def test_devices_are_the_data_sheet_figures():
  assert DEVICES['H100'].bandwidth == 3.35e12 and DEVICES['H200'].bandwidth == 4.8e12
  assert DEVICES['H200'].bf16_flops == DEVICES['H100'].bf16_flops == 989.4e12


# XLA:GPU's asynchronous form of a fusion, as it wraps a scanned layer's write into a stacked
# buffer: a fusion-start (shape: its operands, its result, a context) and a fusion-done.
ASYNC_HLO = """\
HloModule jit_async

@FUSED_UPDATE@

ENTRY %main (w: f32[4,8,16], u: f32[1,8,16], j: s32[]) -> f32[4,8,16] {
  %w = f32[4,8,16]{2,1,0} parameter(0)
  %u = f32[1,8,16]{2,1,0} parameter(1)
  %j = s32[] parameter(2)
  %start = ((f32[4,8,16]{2,1,0}, f32[1,8,16]{2,1,0}, s32[]), f32[4,8,16]{2,1,0}, u32[]) fusion-start(%w, %u, %j), kind=kLoop, calls=%fused_update
  ROOT %done = f32[4,8,16]{2,1,0} fusion-done(%start)
}
""".replace('@FUSED_UPDATE@\n', FUSED_UPDATE)  # noqa: E501


def test_an_asynchronous_fusion_is_one_launch_costed_as_the_fusion_it_wraps():
  """The start is the launch, in place like the plain fusion (the update read and written, the
  stacked buffer neither); the done launches nothing. Counted whole, start and done each read
  and wrote the buffer: a scanned enwik8_base step's floor read 113 ms instead of 11."""
  module = parse(ASYNC_HLO)
  (launch,) = launches(module)
  assert launch.instruction.name == 'start'
  cost = launch_cost(launch.instruction, module)
  assert cost.kind == 'memory-bound'
  assert cost.bytes == 8 * 16 * 4 + 4 + 8 * 16 * 4
  assert census(module)['kernels'] == 1


def test_tuple_elements_split_at_the_top_level_only():
  from hlo_cost import tuple_elements

  shape = '((f32[4,8]{1,0}, s32[]), bf16[2,3]{1,0}, u32[])'
  assert tuple_elements(shape) == ['(f32[4,8]{1,0}, s32[])', 'bf16[2,3]{1,0}', 'u32[]']
  assert tuple_elements('f32[4]{0}') == ['f32[4]{0}']


# Dropout's shape of work: a fusion hashing a u32 counter into random bits (integer ops, a
# nested fusion among them), turning them into a float (a divide, transcendental-priced), and
# a plain elementwise fusion beside it; both write few bytes per element.
RANDOM_HLO = """\
HloModule jit_random

%inner_hash (h0: u32[4096]) -> u32[4096] {
  %h0 = u32[4096]{0} parameter(0)
  %c13 = u32[4096]{0} constant({...})
  %left = u32[4096]{0} shift-left(%h0, %c13)
  %right = u32[4096]{0} shift-right-logical(%h0, %c13)
  ROOT %rot = u32[4096]{0} or(%left, %right)
}

%fused_bits (b0: u32[4096], b1: f32[4096]) -> pred[4096] {
  %b0 = u32[4096]{0} parameter(0)
  %b1 = f32[4096]{0} parameter(1)
  %mixed = u32[4096]{0} add(%b0, %b0)
  %rotated = u32[4096]{0} fusion(%mixed), kind=kLoop, calls=%inner_hash
  %bits = u32[4096]{0} xor(%rotated, %mixed)
  %as_float = f32[4096]{0} convert(%bits)
  %unit = f32[4096]{0} divide(%as_float, %b1)
  %total = f32[] reduce(%unit, %b1), dimensions={0}, to_apply=%inner_hash
  ROOT %keep = pred[4096]{0} compare(%unit, %b1), direction=LT
}

%fused_scale (s0: f32[4096]) -> f32[4096] {
  %s0 = f32[4096]{0} parameter(0)
  ROOT %twice = f32[4096]{0} multiply(%s0, %s0)
}

ENTRY %main (counter: u32[4096], threshold: f32[4096]) -> pred[4096] {
  %counter = u32[4096]{0} parameter(0)
  %threshold = f32[4096]{0} parameter(1)
  %scaled = f32[4096]{0} fusion(%threshold), kind=kLoop, calls=%fused_scale
  ROOT %keep_mask = pred[4096]{0} fusion(%counter, %scaled), kind=kLoop, calls=%fused_bits
}
"""


def test_elementwise_operations_are_counted_per_element_and_can_bound_a_launch():
  module = parse(RANDOM_HLO)
  costs = {
    launch.instruction.name: launch_cost(launch.instruction, module) for launch in launches(module)
  }
  n = 4096
  # add, the nested fusion's shift, shift and or, xor, convert, compare: 7 per element; the
  # divide 8 (TRANSCENDENTAL_COST); the reduce once per element read. The nested fusion is
  # counted in place, not launched.
  assert costs['keep_mask'].elementwise == (7 + 8 + 1) * n
  assert costs['keep_mask'].bytes == n * 4 + n * 4 + n * 1
  assert costs['scaled'].elementwise == n
  assert costs['keep_mask'].kind == costs['scaled'].kind == 'memory-bound'
  # At 1e9 B/s and 1e9 operations/s, the random bits outlast their bytes; the scale does not.
  device = Device('test', 1e6, 5e5, bandwidth=1e9, elementwise_ops=1e9)
  assert costs['keep_mask'].kind_on(device) == 'ALU-bound'
  assert costs['keep_mask'].seconds(device) == pytest.approx(16 * n / 1e9)
  assert costs['scaled'].kind_on(device) == 'memory-bound'
  floor = roofline(module, device)
  assert floor.kinds['ALU-bound'][:1] == [1]
  assert floor.kinds['ALU-bound'][3] == pytest.approx(16 * n / 1e9)
  assert floor.kinds['memory-bound'][3] == pytest.approx(2 * n * 4 / 1e9)
  # Without an elementwise rate (the default), they are free beside their bytes.
  unbounded = roofline(module, Device('test', 1e6, 5e5, bandwidth=1e9))
  assert unbounded.kinds['ALU-bound'][0] == 0
  assert unbounded.seconds == pytest.approx((2 * n * 4 + 2 * n * 4 + n) / 1e9)
  # A matmul's elementwise epilogue is left to its matmul bound.
  assert _cost('gemm').elementwise == 0.0


def test_hopper_issues_33_5_t_elementwise_operations_a_second():
  # 132 SMs x 4 schedulers x 32 lanes at 1.98 GHz: half the data sheet's 67 TFLOP/s of FP32
  # (an FMA counted as two).
  for name in ('H100', 'H200'):
    assert DEVICES[name].elementwise_ops == pytest.approx(33.45e12, rel=1e-3)
