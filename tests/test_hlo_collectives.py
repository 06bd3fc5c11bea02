"""What the planner counts of the collectives in compiled HLO (planner/hlo_collectives.py): loop
bodies times their trip count, and groups across hosts as network traffic (split from
tests/test_plan.py)."""

from __future__ import annotations

import pytest

from planner import hlo_collectives


def test_collectives_multiply_loop_bodies_by_their_trip_count():
  hlo = """HloModule m

%cond (p: (s32[], f32[8])) -> pred[] {
  %c = s32[] constant(5)
  ROOT %lt = pred[] compare(%g, %c), direction=LT
}

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %ag = f32[8,4]{1,0} all-gather(%x), replica_groups=[2,4]<=[8], dimensions={1}
}

ENTRY %main (a: f32[8]) -> f32[8] {
  %w = (s32[], f32[8]) while(%t), condition=%cond, body=%body
  %ar = f32[16]{0} all-reduce(%a), replica_groups={{0,1}}, to_apply=%add
}
"""
  c = hlo_collectives.collectives(hlo, 8)
  assert c.bytes_by_kind["all-gather"] == 5 * 8 * 4 * 4 * 3 / 4
  assert c.bytes_by_kind["all-reduce"] == 2 * 16 * 4 * 1 / 2


@pytest.mark.parametrize("start, trips", [(0, 4), (2, 3)])
def test_a_loop_counting_by_two_runs_half_its_bound(start, trips):
  """libtpu's windowed einsum loops (FSDP's all-gather or reduce-scatter folded into the matmul)
  carry no known_trip_count and step their counter by 2 towards `i < 8`: 4 trips from 0, not 8
  (counted as 8, llm_1b on tpu-v5e-16 executed 1.84x its model FLOPs where full remat makes
  about 1.3x)."""
  hlo = f"""HloModule m

%cond (p: (u32[], f32[8])) -> pred[] {{
  %p = (u32[], f32[8]) parameter(0)
  %i = u32[] get-tuple-element(%p), index=0
  %c = u32[] constant(8)
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}}

%body (p: (u32[], f32[8])) -> (u32[], f32[8]) {{
  %p = (u32[], f32[8]) parameter(0)
  %i = u32[] get-tuple-element(%p), index=0
  %x = f32[8] get-tuple-element(%p), index=1
  %two = u32[] constant(2)
  %next = u32[] add(%i, %two)
  %ag = f32[8,4]{{1,0}} all-gather(%x), replica_groups=[2,4]<=[8], dimensions={{1}}
  ROOT %t = (u32[], f32[8]) tuple(%next, %x)
}}

ENTRY %main (a: f32[8]) -> f32[8] {{
  %zero = u32[] constant({start})
  %t = (u32[], f32[8]) tuple(%zero, %a)
  %w = (u32[], f32[8]) while(%t), condition=%cond, body=%body
}}
"""
  c = hlo_collectives.collectives(hlo, 8)
  assert c.bytes_by_kind["all-gather"] == trips * 8 * 4 * 4 * 3 / 4


def test_a_group_across_hosts_counts_as_network_traffic_whatever_its_size():
  """Two hosts of 8: a group {0, 8} (data parallel across hosts) crosses, {0..7} does not."""
  hlo = """HloModule m

ENTRY %main (a: f32[8]) -> f32[8] {
  %across = f32[16]{0} all-reduce(%a), replica_groups=[8,2]<=[2,8]T(1,0), to_apply=%add
  %within = f32[16]{0} all-reduce(%a), replica_groups=[2,8]<=[16], to_apply=%add
  %listed = f32[16]{0} all-reduce(%a), replica_groups={{0,8},{1,9}}, to_apply=%add
}
"""
  c = hlo_collectives.collectives(hlo, 16, per_host=8)
  across = 2 * 16 * 4 * 1 / 2  # 2 (n-1)/n of the buffer, n = 2
  within = 2 * 16 * 4 * 7 / 8
  assert c.bytes_by_kind["all-reduce"] == 2 * across + within
  assert c.cross_host_bytes == 2 * across
