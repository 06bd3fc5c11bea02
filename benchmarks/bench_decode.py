"""Decoding speed: prefill latency and decode tokens/s at batch 1 and 8 (trainer/generate.py).

    python -m benchmarks.bench_decode

Models of configs/tiny.py and configs/bench_lm.py with random parameters in
float32 (the numbers do not depend on the values), prompts of PROMPT tokens.
Prefill latency: the jitted generate call that stops after its first token
(prefill + one sample). Decode: the same call for 1 + NEW tokens (greedy, no
EOS) minus the first, so tokens/s = batch * NEW / (difference). Medians of
ROUNDS timed calls after one compiling call each.
"""

from __future__ import annotations

import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp

from configs import bench_lm, tiny
from modules.decoder import MODELS
from trainer import config as config_lib
from trainer.generate import SamplingOptions, generate

PROMPT, NEW, ROUNDS, BATCHES = 64, 64, 5, (1, 8)


def _median_s(fn) -> float:
  jax.block_until_ready(fn())  # compile
  times = []
  for _ in range(ROUNDS):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def measure(name: str, cfg) -> list[dict]:
  model = MODELS.build(config_lib.parse(cfg).model)
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
                         ["params"])
  rows = []
  for batch in BATCHES:
    prompts = jax.random.randint(jax.random.key(batch), (batch, PROMPT), 0,
                                 cfg.model.vocab_size)
    lengths = jnp.full((batch,), PROMPT, jnp.int32)

    def timed(new):
      options = SamplingOptions(max_new_tokens=new, temperature=0.0,
                                cache_length=PROMPT + 1 + NEW)
      return _median_s(lambda: generate(params, prompts, lengths, jax.random.key(0),  # pylint: disable=cell-var-from-loop
                                        model=model, options=options).tokens)

    first_s, total_s = timed(1), timed(1 + NEW)
    decode_s = total_s - first_s
    rows.append({"model": name, "batch": batch, "prompt tokens": PROMPT, "new tokens": NEW,
                 "prefill latency (ms)": f"{1e3 * first_s:.1f}",
                 "decode tokens/s": f"{batch * NEW / decode_s:,.0f}" if decode_s > 0 else "n/a",
                 "decode ms/step": f"{1e3 * decode_s / NEW:.2f}"})
  return rows


def run() -> list[dict]:
  return measure("tiny", tiny.get_config()) + measure("bench_lm", bench_lm.get_config())


if __name__ == "__main__":
  for row in run():
    print(row)
