"""trainer.microbatch_rows and eval.microbatch_rows: rows per device at once, the accumulation
derived from the mesh in use."""

from __future__ import annotations

import json

import configs.llama
import jax
import pytest

from core.registry import ConfigError
from launcher import main as main_lib
from trainer import config as config_lib, experiment, mesh_rules, meshes


def _build(**trainer):
  cfg = configs.llama.get_config("size=test")
  cfg.data.batch_size, cfg.eval.batch_size = 8, 8
  for k, v in trainer.items():
    setattr(cfg.trainer, k, v)
  return experiment.build(config_lib.parse(cfg), meshes.lookup("cpu"), jax.devices()[:1])


def test_microbatch_rows_sets_the_accumulation_for_the_devices_in_use():
  assert _build(microbatch_rows=2).run.trainer.grad_accum_steps == 4
  assert _build(microbatch_rows=8).run.trainer.grad_accum_steps == 1
  assert _build(microbatch_rows=16).run.trainer.grad_accum_steps == 1  # fewer rows than that
  assert _build(microbatch_rows=2, grad_accum_steps=4).run.trainer.grad_accum_steps == 4
  with pytest.raises(ConfigError, match="set one of them"):
    _build(microbatch_rows=2, grad_accum_steps=2)
  with pytest.raises(ConfigError, match="not a multiple of 3"):
    _build(microbatch_rows=3)


def test_a_rule_leaves_microbatch_rows_alone_when_the_command_line_sets_the_accumulation():
  cfg = configs.llama.get_config("size=test")
  cfg.mesh.rules = (({"platform": "cpu"}, {"trainer.microbatch_rows": 2}),)
  mesh_rules.apply_rules(cfg, meshes.lookup("cpu"), {"trainer.grad_accum_steps"})
  assert cfg.trainer.microbatch_rows == 0
  mesh_rules.apply_rules(cfg, meshes.lookup("cpu"), set())
  assert cfg.trainer.microbatch_rows == 2


def _losses(tmp_path, name, *flags):
  out = tmp_path / name
  code = main_lib.main(["axtrain", "--config=configs/llama.py:size=test", *flags,
                        "--config.trainer.max_steps=2", "--config.trainer.log_every=1",
                        "--config.data.batch_size=8", "--config.data.seq_len=32",
                        "--config.eval.batch_size=8", "--config.eval.num_batches=1",
                        "--progress=false", f"--output_dir={out}"])
  assert code == 0
  records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  return [r["loss"] for r in records if "loss" in r], [r["eval_loss"] for r in records
                                                       if "eval_loss" in r]


def test_microbatch_rows_trains_as_the_accumulation_it_sets(tmp_path):
  rows = _losses(tmp_path, "rows", "--config.trainer.microbatch_rows=2",
                 "--config.eval.microbatch_rows=4")
  accum = _losses(tmp_path, "accum", "--config.trainer.grad_accum_steps=4")
  assert rows[0] == accum[0]  # the same program
  assert rows[1] == pytest.approx(accum[1], rel=1e-6)  # eval sums added in another order


def test_a_rule_switches_a_kind_unless_the_command_line_configured_that_component():
  rule = (({"platform": "cpu"}, {"optimizer.kind": "adafactor", "trainer.microbatch_rows": 2}),)
  cfg = configs.llama.get_config("size=test")
  cfg.optimizer.learning_rate = 1e-3
  cfg.mesh.rules = rule
  mesh_rules.apply_rules(cfg, meshes.lookup("cpu"), set())
  assert cfg.optimizer.kind == "adafactor" and cfg.optimizer.learning_rate == 1e-3
  assert "b2" not in cfg.optimizer  # adafactor's node, not adamw's with its kind renamed
  config_lib.parse(cfg)
  kept = configs.llama.get_config("size=test")
  kept.mesh.rules = rule
  mesh_rules.apply_rules(kept, meshes.lookup("cpu"), {"optimizer.b2"})
  assert kept.optimizer.kind == "adamw" and kept.trainer.microbatch_rows == 2
