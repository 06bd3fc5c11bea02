"""Shared pieces of the run configs in this folder (not a config itself).

`lm_config` returns a complete run config with every section and option; the
files beside this one call it and change a few fields, or switch a component's kind
with `trainer.config.switch_kind(cfg, "model.block.ffn", "moe", num_experts=8)` (what
`--config.model.block.ffn.kind=moe` does), which keeps the fields both kinds have.
"""

from __future__ import annotations

import ml_collections

import modules  # noqa: F401  (registers the layer library)
import trainer.data  # noqa: F401  (registers data sources)
import trainer.optimizer  # noqa: F401  (registers optimizers)
from core.registry import registry
from trainer.config import (CheckpointConfig, EvalConfig, InitConfig, MeshConfig, TrainerConfig,
                            section_node)


def lm_config(model: ml_collections.ConfigDict, *, max_steps: int, learning_rate: float,
              batch_size: int, seq_len: int, warmup_steps: int,
              data_kind: str = "stdlib") -> ml_collections.ConfigDict:
  cfg = ml_collections.ConfigDict()
  cfg.model = model
  cfg.optimizer = registry("optimizer").node(
      "adamw", learning_rate=learning_rate,
      schedule=registry("schedule").node("warmup_cosine", warmup_steps=warmup_steps))
  cfg.data = registry("data").node(data_kind, batch_size=batch_size, seq_len=seq_len)
  cfg.trainer = section_node(TrainerConfig, max_steps=max_steps)
  cfg.eval = section_node(EvalConfig)
  cfg.mesh = section_node(MeshConfig)
  cfg.checkpoint = section_node(CheckpointConfig)
  cfg.init = section_node(InitConfig)
  return cfg
