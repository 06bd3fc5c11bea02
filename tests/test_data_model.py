"""Packed rows on the model: attention never crosses a document boundary, and the step is
compiled for the batch the data pipeline yields."""

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
from trainer.config import switch_kind
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


def _structure(batch) -> dict:
  return {k: (tuple(v.shape), np.dtype(v.dtype)) for k, v in batch.items()}


def test_the_planned_batch_is_the_batch_every_data_kind_yields(tmp_path):
  """`axtrain plan` (and bench-tpu, the TPU efficiency test) compile the step for
  planner/plan.py:abstract_inputs's batch: the same arrays, shapes and dtypes as the batches
  the data pipeline gives the step, train and eval, for every registered data kind (on its
  example, trainer/data/base.py:Source.example) and for synthetic's packed documents."""
  import configs.llama  # pylint: disable=import-outside-toplevel
  from planner import plan  # pylint: disable=import-outside-toplevel
  from trainer import config as config_lib, experiment, meshes  # pylint: disable=import-outside-toplevel

  cases = []
  for kind in DATA.kinds():
    (tmp_path / kind).mkdir()
    cases.append((kind, DATA.entry(kind).target.example(tmp_path / kind)))
  cases.append(("synthetic", {"mean_doc_len": 16}))  # its example is the unpacked stream
  packed = set()
  for kind, values in cases:
    cfg = configs.llama.get_config("size=test")
    switch_kind(cfg, "data", kind)
    cfg.data.update({**values, "seq_len": 32, "batch_size": 4})
    cfg.eval.batch_size = 2
    run = config_lib.parse(cfg)
    exp = experiment.build(run, meshes.lookup("cpu"), jax.devices()[:1])
    _, planned = plan.abstract_inputs(exp, run.data.batch_size)
    real = next(exp.source.train_iterator(process_index=0, process_count=1))
    assert _structure(planned) == _structure(real), (kind, values)
    _, planned = plan.abstract_inputs(exp, run.eval.batch_size)
    (real,) = exp.source.eval_batches(batch_size=2, num_batches=1, process_index=0,
                                      process_count=1)
    assert _structure(planned) == _structure(real), (kind, values)
    if "segment_ids" in planned:
      packed.add((kind, values.get("mean_doc_len")))
  # every corpus kind packs documents; synthetic when asked
  assert packed == {(k, None) for k in DATA.kinds() if k != "synthetic"} | {("synthetic", 16)}
