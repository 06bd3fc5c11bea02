"""int8 training's quality on a real corpus (issue 46 item 3, the CPU half): configs/bench_lm.py
(8.4M parameters, 4 layers, sequences of 256) on the embedded corpus (the Python standard
library's source as UTF-8 bytes: `data.kind=stdlib`) for 300 steps, once as shipped (float32
dots: the recipe's compute dtype, which `trainer.compute_dtype=auto` would also choose on a
CPU) and once with `model.quantization.kind=int8`, from the same start on the same batches. The
final eval loss (16 held-out batches, 32,768 bytes) of int8 must be within 1% of float32's.

Both runs are computed here; no expected number is stored. The figures of the run that
docs/quantization.md quotes are printed (`pytest -s`).
"""

from __future__ import annotations

import time

import jax
import pytest
from absl import flags

from launcher import config_loading
from trainer import config as config_lib, experiment, loop, meshes

STEPS = 300
CORPUS = ("--config.data.kind=stdlib", "--config.data.tokenizer.kind=bytes")


def _run(kind: str, *, initial: bool = False):
  """(final eval loss, logged train losses, eval loss before training or None) of one run."""
  argv = ["axtrain", "--config=configs/bench_lm.py", *CORPUS,
          f"--config.trainer.max_steps={STEPS}", "--config.trainer.log_every=50",
          "--config.eval.num_batches=16", f"--config.model.quantization.kind={kind}"]
  fv = flags.FlagValues()
  config_loading.define(fv, argv)
  fv(argv)
  exp = experiment.build(config_lib.parse(fv["config"].value), meshes.lookup("cpu"))
  before = loop.initial_eval_loss(exp) if initial else None
  start = time.time()
  result = loop.train(exp)
  losses = [r["loss"] for r in result.records if "loss" in r]
  print(f"{kind}: compute dtype {jax.numpy.dtype(exp.compute_dtype).name}, train loss every 50 "
        f"steps {[round(x, 4) for x in losses]}, final eval loss {result.final_eval_loss:.5f}"
        f" (before training: {before}), {time.time() - start:.0f} s", flush=True)
  return result.final_eval_loss, losses, before


@pytest.mark.slow  # two 300-step runs of bench_lm: 18 and 50 minutes on 2 loaded shared cores
def test_int8_final_eval_loss_within_1_percent_of_float32_on_bench_lm():
  reference, ref_losses, before = _run("none", initial=True)
  int8, int8_losses, _ = _run("int8")
  print(f"int8 / float32 final eval loss: {int8:.5f} / {reference:.5f} = {int8 / reference:.5f}")
  assert int8 != reference and int8_losses != ref_losses  # the quantization changed the numbers
  assert reference < 0.5 * before  # and the runs trained (from ~ln 8192)
  assert abs(int8 - reference) / reference < 0.01, (int8, reference)
