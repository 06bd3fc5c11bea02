"""benchmarks/attention.py (the attention kernels alone, issue 46) runs off TPU: every kernel in
Pallas interpret mode on a small case, one JSON line each, with its FLOP counts and shares; a
kernel that cannot run here (tokamax not installed) gives a line that says why."""

from __future__ import annotations

import json

import pytest

from benchmarks import attention


def test_one_line_a_kernel_with_its_shares(tmp_path, capsys):
  assert attention.main([f"--out={tmp_path}", "--shape=1x4x2", "--seq=256", "--docs=3",
                         "--kernels=pallas_hd64,splash", "--our_blocks=128x128",
                         "--splash_blocks=128x128x128", "--rounds=1", "--steps=1"]) == 0
  rows = [json.loads(l) for l in (tmp_path / "attention.jsonl").read_text().splitlines()]
  assert [(r["kernel"], r["blocks"]) for r in rows] == [
      ("pallas_hd64", [128, 128, "transposed"]), ("pallas_hd64", [128, 128, "padded"]),
      ("splash", [128, 128, 128])]
  flops = 4 * 256 * 256 / 2 * 64 * 4 * 1  # 4 x seq^2 / 2 x head_dim x heads x rows
  for r in rows:
    assert "error" not in r, r
    assert r["forward_flops"] == flops and r["seq"] == 256 and r["docs"] == 3
    assert r["fwd_share"] == pytest.approx(flops / (r["fwd_ms"] / 1e3) / 197e12)
    assert r["fwd_bwd_share"] == pytest.approx(3.5 * flops / (r["fwd_bwd_ms"] / 1e3) / 197e12)
    assert r["backward_passes"] == pytest.approx((r["fwd_bwd_ms"] - r["fwd_ms"]) / r["fwd_ms"])
    assert r["max_abs_diff_vs_xla"] < 0.05  # bfloat16 outputs of the same attention
  assert capsys.readouterr().out.count("benchmarks.attention: ") == 3


def test_segments_are_documents_cut_at_seeded_places():
  case = attention.Case(rows=3, seq=64, heads=2, kv_heads=2, docs=5)
  seg = attention.segments(case)
  assert seg.shape == (3, 64) and (seg == attention.segments(case)).all()
  for row in seg:
    assert row[0] == 0 and row[-1] == 4 and ((row[1:] - row[:-1]) >= 0).all()
    assert set(row.tolist()) == set(range(5))


def test_tokamax_missing_is_a_line_not_a_failure(tmp_path):
  """Where tokamax is not importable (this project's .venv does not hold it: it is pinned in
  benchmarks/tokamax_wheels.sh for the chip), its kernels give one `skipped` line."""
  why = attention._tokamax_missing()  # pylint: disable=protected-access
  if why is None:
    pytest.skip("tokamax is importable here")
  assert attention.main([f"--out={tmp_path}", "--shape=1x2x2", "--seq=128",
                         "--kernels=tokamax_splash"]) == 0
  [row] = [json.loads(l) for l in (tmp_path / "attention.jsonl").read_text().splitlines()]
  assert row["kernel"] == "tokamax_splash" and row["skipped"] == why
  assert "tokamax==0.0.12" in why and "benchmarks/tokamax_wheels.sh" in why
