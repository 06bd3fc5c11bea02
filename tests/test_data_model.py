"""Packed rows on the model: attention never crosses a document boundary."""

from __future__ import annotations

import json

import flax.linen as nn
import jax
import numpy as np

import modules  # noqa: F401  (registers the layer library)
import trainer.data  # noqa: F401
from modules import llama
from modules.decoder import MODELS
from core.registry import registry
from trainer.data.base import DATA


def test_changing_one_document_never_changes_the_logits_of_another(tmp_path):
  path = tmp_path / "docs.jsonl"
  path.write_text("".join(json.dumps({"text": f"document number {i} " + "ab" * (i % 9)}) + "\n"
                          for i in range(100)))
  node = registry("data").node("jsonl", path=str(path), seq_len=64, batch_size=4)
  src = DATA.build(registry("data").parse(node, "data"), vocab_size=256, seed=1)
  batch = next(src.train_iterator(process_index=0, process_count=1))
  tokens, seg, pos = (batch[k] for k in ("inputs", "segment_ids", "positions"))
  r = 0
  assert seg[r].max() >= 2  # documents are 20-40 bytes: two or more per 64-token row
  model = MODELS.build(MODELS.parse(llama.model_node("test"), "model"))
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), tokens[:1])["params"])
  apply = jax.jit(lambda t, p, s: model.apply({"params": params}, t, p, s))

  changed = tokens.copy()
  first = seg[r] == 1
  changed[r, first] = (changed[r, first] + 7) % 256
  later = seg[r] >= 2  # documents 2, 3, ... of the row
  base = np.asarray(apply(tokens, pos, seg))[r]
  after = np.asarray(apply(changed, pos, seg))[r]
  np.testing.assert_array_equal(base[later], after[later])
  assert not np.allclose(base[first], after[first])  # the change does reach document 1
  # without segment ids the same change leaks into document 2: the check can fail
  leak = np.asarray(apply(changed, pos, None))[r] - np.asarray(apply(tokens, pos, None))[r]
  assert np.abs(leak[later]).max() > 1e-4
