"""The tiny demo model on a weighted mixture: the embedded stdlib corpus plus your JSONL.

    axtrain --config=configs/tiny_mixture.py:path=corpus.jsonl,weight=0.3

`weight` is the share of each batch drawn from `path` (field `text`); the rest is
stdlib. Mixtures are set in config files since their `sources` are a tuple of dicts;
see docs/data.md.
"""

from configs.base import lm_config
from core.config_args import parse_arg
from modules import llama
from core.registry import registry


def get_config(arg=None):
  args = parse_arg(arg, path="corpus.jsonl", weight=0.3)
  cfg = lm_config(llama.model_node("tiny"), max_steps=600, learning_rate=3e-3,
                  batch_size=16, seq_len=256, warmup_steps=50)
  cfg.data = registry("data").node(
      "mixture", batch_size=16, seq_len=256,
      sources=({"kind": "stdlib", "weight": 1.0 - args["weight"]},
               {"kind": "jsonl", "path": args["path"], "weight": args["weight"]}))
  cfg.eval.every_steps = 200
  cfg.eval.batch_size = 16
  return cfg
