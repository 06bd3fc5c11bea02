"""The tiny demo model on a weighted mixture: the embedded stdlib corpus plus your JSONL.

    axtrain --config=configs/tiny_mixture.py:path=corpus.jsonl,weight=0.3

`weight` is the share of each batch drawn from `path` (field `text`); the rest is
stdlib. Each component is a data node of its kind with a weight (`component`); the
mixture sets seq_len and batch_size for all. See docs/data.md.
"""

from configs.base import lm_config
from core.config_args import Needed, parse_arg
from core.registry import ConfigError
from modules import llama
from trainer.config import switch_kind
from trainer.data.mixture import component


def get_config(arg=None):
  args = parse_arg(arg, path=Needed("your JSON Lines corpus, field text"), weight=0.3)
  if not 0 < args["weight"] < 1:  # else the stdlib share, 1 - weight, is what gets refused
    raise ConfigError(f"config argument weight={args['weight']}: the share of each batch drawn "
                      f"from path, in (0, 1)")
  cfg = lm_config(llama.model_node("tiny"), max_steps=600, learning_rate=3e-3,
                  batch_size=16, seq_len=256, warmup_steps=50)
  switch_kind(cfg, "data", "mixture", sources=(
      component("stdlib", weight=1.0 - args["weight"]),
      component("jsonl", path=args["path"], weight=args["weight"])))
  cfg.eval.every_steps = 200
  cfg.eval.batch_size = 16
  return cfg
