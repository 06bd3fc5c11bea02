"""planner/hlo_ops.py: per-op bytes, FLOPs and names of compiled HLO, against hand counts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from planner import hlo_ops

PEAK, HBM, LINK = 100e12, 1e12, 1e11


def _report(text, **kw):
  return hlo_ops.ops_report(text, num_devices=8, peak_flops=PEAK, hbm_bandwidth=HBM,
                            link_bandwidth=LINK, **kw)


def test_a_compiled_matmul_inside_a_loop_counts_every_trip():
  """A jitted CPU program: five matmuls in a fori_loop; FLOPs and bytes from the shapes."""
  def f(a, b):
    return jax.lax.fori_loop(0, 5, lambda i, x: jnp.tanh(x @ b), a)

  a = jax.ShapeDtypeStruct((64, 32), jnp.float32)
  b = jax.ShapeDtypeStruct((32, 32), jnp.float32)
  compiled = jax.jit(f).lower(a, b).compile()
  r = _report(compiled.as_text())
  matmul = r.totals()["matmul"]
  assert matmul["flops"] == 5 * 2 * 64 * 32 * 32
  # Each trip's matmul reads a [64, 32] and a [32, 32] and writes a [64, 32] (float32), at least.
  assert matmul["bytes"] >= 5 * 4 * (64 * 32 + 32 * 32 + 64 * 32)
  assert matmul["ops"] == 5


HLO = """HloModule m

%fused_dot (p0: bf16[16,64], p1: bf16[64,32]) -> bf16[16,32] {
  %p0 = bf16[16,64]{1,0} parameter(0)
  %p1 = bf16[64,32]{1,0} parameter(1)
  ROOT %d = bf16[16,32]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_conv (p0: bf16[2,128,192,1], p1: bf16[192,6,32,1]) -> bf16[2,128,6,32] {
  %p0 = bf16[2,128,192,1]{1,2,3,0} parameter(0)
  %p1 = bf16[192,6,32,1]{0,2,1,3} parameter(1)
  ROOT %c = bf16[2,128,6,32]{1,3,2,0} convolution(%p0, %p1), window={size=1x6 pad=0_0x5_5 rhs_reversal=0x1}, dim_labels=0bf1_i1o0->0b1f
}

%fused_cast (p0: f32[16,32]) -> bf16[16,32] {
  %p0 = f32[16,32]{1,0} parameter(0)
  ROOT %cv = bf16[16,32]{1,0} convert(%p0)
}

ENTRY %main (x: bf16[16,64], w: bf16[64,32], y: f32[16,32], q: bf16[2,128,192,1], k: bf16[192,6,32,1]) -> bf16[16,32] {
  %x = bf16[16,64]{1,0} parameter(0), metadata={op_name="x"}
  %w = bf16[64,32]{1,0} parameter(1)
  %y = f32[16,32]{1,0} parameter(2)
  %q = bf16[2,128,192,1]{1,2,3,0} parameter(3)
  %k = bf16[192,6,32,1]{0,2,1,3} parameter(4)
  %mm = bf16[16,32]{1,0} fusion(%x, %w), kind=kOutput, calls=%fused_dot, metadata={op_name="jit(train_step)/transpose(jvp(DecoderLM))/layers_11/block/ffn/bld,df->blf/dot_general"}
  %qk = bf16[2,128,6,32]{1,3,2,0} fusion(%q, %k), kind=kOutput, calls=%fused_conv, metadata={op_name="jit(train_step)/jvp(DecoderLM)/layers_0/block/attention/bld,dhk->blhk/dot_general"}
  %cast = bf16[16,32]{1,0} fusion(%y), kind=kLoop, calls=%fused_cast, metadata={op_name="jit(train_step)/optimizer/convert_element_type"}
  %ag = bf16[64,32]{1,0} all-gather(%w), replica_groups=[2,4]<=[8], dimensions={0}
  ROOT %out = bf16[16,32]{1,0} add(%mm, %cast)
}
"""


def test_hand_written_hlo_bytes_flops_categories_and_names():
  r = _report(HLO, compiler_bytes=1e6, compiler_flops=1e6)
  ops = {o.name: o for o in r.ops}
  assert set(ops) == {"mm", "qk", "cast", "ag", "out"}  # parameters move nothing of their own
  mm, qk, cast, ag = ops["mm"], ops["qk"], ops["cast"], ops["ag"]
  assert (mm.category, mm.flops, mm.bytes) == ("matmul", 2 * 16 * 64 * 32,
                                              2 * (16 * 64 + 64 * 32 + 16 * 32))
  assert (mm.module, mm.primitive, mm.pass_) == ("DecoderLM/layers_*/block/ffn",
                                                 "bld,df->blf dot_general", "backward")
  # The TPU writes einsum bld,dhk->blhk as a convolution whose window slides over the heads
  # with padding: each output meets 192 input features and one real tap.
  assert qk.flops == 2 * 2 * 128 * 6 * 32 * 192
  assert (qk.module, qk.pass_) == ("DecoderLM/layers_*/block/attention", "forward")
  assert (cast.category, cast.bytes, cast.module) == ("copy/convert", 16 * 32 * (4 + 2),
                                                      "optimizer")
  assert ag.category == "collective" and ag.sent == 64 * 32 * 2 * 3 / 4
  assert ag.seconds == pytest.approx(ag.bytes / HBM + ag.sent / LINK)
  assert mm.seconds == pytest.approx(max(mm.flops / PEAK, mm.bytes / HBM))
  assert r.flops == mm.flops + qk.flops
  assert r.coverage() == (pytest.approx(r.bytes / 1e6), pytest.approx(r.flops / 1e6))
  top = r.top("bytes", 2)
  assert top[0].label == "DecoderLM/layers_*/block/attention bld,dhk->blhk dot_general [forward]"


@pytest.mark.parametrize("op_name,expected", [
    ("jit(train_step)/transpose(jvp(DecoderLM))/layers_3/block/attention/bld,dhk->blhk/"
     "dot_general", ("DecoderLM/layers_*/block/attention", "bld,dhk->blhk dot_general",
                     "backward")),
    ("jit(train_step)/jvp(loss)/reduce_sum", ("loss", "reduce_sum", "forward")),
    ("jit(train_step)/while/body/checkpoint/transpose(jvp(loss))/add",
     ("loss", "add", "backward")),
    ("jit(train_step)/optimizer/mul", ("optimizer", "mul", "step")),
    ("", ("", "", "step")),
])
def test_name_stack(op_name, expected):
  assert hlo_ops.name_stack(op_name) == expected


SCAN_HLO = """HloModule m

%inner (q0: bf16[12,64,32], q1: s32[]) -> bf16[64,32] {
  %q0 = bf16[12,64,32]{2,1,0} parameter(0)
  %q1 = s32[] parameter(1)
  %z = s32[] constant(0)
  %ds = bf16[1,64,32]{2,1,0} dynamic-slice(%q0, %q1, %z, %z), dynamic_slice_sizes={1,64,32}
  ROOT %b = bf16[64,32]{1,0} bitcast(%ds)
}

%layer (p0: bf16[12,16,32], p1: bf16[16,64], p2: bf16[12,64,32], p3: s32[]) -> bf16[12,16,32] {
  %p0 = bf16[12,16,32]{2,1,0} parameter(0)
  %p1 = bf16[16,64]{1,0} parameter(1)
  %p2 = bf16[12,64,32]{2,1,0} parameter(2)
  %p3 = s32[] parameter(3)
  %w = bf16[64,32]{1,0} fusion(%p2, %p3), kind=kLoop, calls=%inner
  %d = bf16[16,32]{1,0} dot(%p1, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %bd = bf16[1,16,32]{2,1,0} bitcast(%d)
  %z = s32[] constant(0)
  ROOT %dus = bf16[12,16,32]{2,1,0} dynamic-update-slice(%p0, %bd, %p3, %z, %z)
}

ENTRY %main (acc: bf16[12,16,32], x: bf16[16,64], ws: bf16[12,64,32], i: s32[]) -> bf16[12,16,32] {
  %acc = bf16[12,16,32]{2,1,0} parameter(0)
  %x = bf16[16,64]{1,0} parameter(1)
  %ws = bf16[12,64,32]{2,1,0} parameter(2)
  %i = s32[] parameter(3)
  ROOT %f = bf16[12,16,32]{2,1,0} fusion(%acc, %x, %ws, %i), kind=kOutput, calls=%layer
}
"""


def test_a_scanned_layer_reads_its_slice_and_writes_its_update_in_place():
  """One layer of a scanned stack: the fusion takes layer i's weights out of the stacked [12, ...]
  array (in a nested fusion) and writes its output into the stacked result in place. Its bytes
  are those of the slice, the input, the scalar index and the update, not of the stacks."""
  (op,) = _report(SCAN_HLO).ops
  slice_, x, index, update = 64 * 32 * 2, 16 * 64 * 2, 4, 16 * 32 * 2
  assert op.bytes == slice_ + x + index + update
  assert op.flops == 2 * 16 * 64 * 32


# TPU HLO as libtpu writes it after memory space assignment: S(1) in a layout places the buffer
# in the on-chip alternate memory (VMEM), no S(...) in HBM. A loss's take_along_axis: a gather
# of one value per row out of [4,2048,32000] logits (shapes of 125m at 4 rows, fused as the TPU
# compiler fuses it), then a quantizing fusion whose input and two of its outputs are on chip.
TPU_HLO = """
HloModule jit_train_step, entry_computation_layout={()->f32[8192]{0}}

%fused_take (param_0.5: f32[4,2048,32000], param_1.3: s32[4,2048,3]) -> f32[8192] {
  %param_0.5 = f32[4,2048,32000]{2,1,0:T(8,128)} parameter(0)
  %param_1.3 = s32[4,2048,3]{1,0,2:T(4,128)S(1)} parameter(1)
  %gather.10 = f32[4,2048]{1,0:T(4,128)} gather(%param_0.5, %param_1.3), offset_dims={}, collapsed_slice_dims={0,1,2}, start_index_map={0,1,2}, index_vector_dim=2, slice_sizes={1,1,1}
  ROOT %bitcast.9 = f32[8192]{0:T(1024)S(1)} bitcast(%gather.10)
}

%fused_round (param_0.7: bf16[4,2048,2048]) -> (s8[4,2048,2048], s8[4,2048,2048], s8[4,2048,2048]) {
  %param_0.7 = bf16[4,2048,2048]{2,1,0:T(8,128)(2,1)S(1)} parameter(0)
  %convert.1 = s8[4,2048,2048]{2,1,0:T(32,128)(4,1)} convert(%param_0.7)
  ROOT %tuple.1 = (s8[4,2048,2048]{2,1,0:T(32,128)(4,1)}, s8[4,2048,2048]{2,1,0:T(32,128)(4,1)S(1)}, s8[4,2048,2048]{2,1,0:T(32,128)(4,1)S(1)}) tuple(%convert.1, %convert.1, %convert.1)
}

ENTRY %main () -> f32[8192] {
  %logits = f32[4,2048,32000]{2,1,0:T(8,128)} parameter(0)
  %index = s32[4,2048,3]{1,0,2:T(4,128)S(1)} parameter(1)
  %hidden = bf16[4,2048,2048]{2,1,0:T(8,128)(2,1)S(1)} parameter(2)
  %round = (s8[4,2048,2048]{2,1,0:T(32,128)(4,1)}, s8[4,2048,2048]{2,1,0:T(32,128)(4,1)S(1)}, s8[4,2048,2048]{2,1,0:T(32,128)(4,1)S(1)}) fusion(%hidden), kind=kLoop, calls=%fused_round
  %slice.1 = f32[1,2048,32000]{2,1,0:T(8,128)S(1)} slice(%logits), slice={[0:1], [0:2048], [0:32000]}
  ROOT %take = f32[8192]{0:T(1024)S(1)} fusion(%logits, %index), kind=kCustom, calls=%fused_take
}
"""


def test_a_gather_reads_what_it_takes_and_on_chip_bytes_are_told_apart():
  """Hand counts: the gather reads its 8192 values (and all its indices), not the 128 MB of
  logits; bytes in S(1) layouts are `alt_bytes`, counted per operand and per output element."""
  ops = {o.name: o for o in _report(TPU_HLO).ops}
  take, round_, slice_ = ops["take"], ops["round"], ops["slice.1"]
  values, index = 8192 * 4, 4 * 2048 * 3 * 4
  assert take.bytes == values + index + values  # read from the logits, the indices, written
  assert take.alt_bytes == index + values  # the indices and the result are on chip
  hidden, one = 4 * 2048 * 2048 * 2, 4 * 2048 * 2048
  assert round_.bytes == hidden + 3 * one
  assert round_.alt_bytes == hidden + 2 * one
  rows = 2048 * 32000 * 4
  assert (slice_.bytes, slice_.alt_bytes) == (2 * rows, rows)  # read from HBM, written on chip
