"""Decoding speed: prefill latency and decode tokens/s at batch 1 and 8 (trainer/generate.py).

    python -m benchmarks.bench_decode

Models of configs/tiny.py and configs/bench_lm.py with random parameters in
float32 (the numbers do not depend on the values). Prefill: one jitted forward
pass that fills the KV cache for a PROMPT-token prompt per row. Decode: the
jitted generate loop (prefill + NEW greedy steps, no EOS) minus that prefill,
so tokens/s = batch * NEW / (generate time - prefill time). Medians of ROUNDS
timed calls after one compiling call.
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
from trainer.generate import SamplingOptions, generate, init_cache, zeros_like_cache

PROMPT, NEW, ROUNDS, BATCHES = 64, 64, 3, (1, 8)


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
  options = SamplingOptions(max_new_tokens=NEW, temperature=0.0, cache_length=PROMPT + NEW)

  @jax.jit
  def prefill(prompts_BxP):
    cache = zeros_like_cache(init_cache(model, batch=prompts_BxP.shape[0],
                                        length=PROMPT + NEW), jnp.float32)
    positions = jnp.broadcast_to(jnp.arange(PROMPT), prompts_BxP.shape)
    logits, variables = model.apply({"params": params, "cache": cache}, prompts_BxP, positions,
                                    decode=True, mutable=["cache"])
    return logits[:, -1], variables["cache"]

  rows = []
  for batch in BATCHES:
    prompts = jax.random.randint(jax.random.key(batch), (batch, PROMPT), 0,
                                 cfg.model.vocab_size)
    lengths = jnp.full((batch,), PROMPT, jnp.int32)
    prefill_s = _median_s(lambda: prefill(prompts))  # pylint: disable=cell-var-from-loop
    total_s = _median_s(lambda: generate(  # pylint: disable=cell-var-from-loop
        params, prompts, lengths, jax.random.key(0), model=model, options=options).tokens)
    rows.append({"model": name, "batch": batch, "prompt tokens": PROMPT, "new tokens": NEW,
                 "prefill latency (ms)": f"{1e3 * prefill_s:.1f}",
                 "decode tokens/s": f"{batch * NEW / max(total_s - prefill_s, 1e-9):,.0f}",
                 "decode ms/step": f"{1e3 * (total_s - prefill_s) / NEW:.2f}"})
  return rows


def run() -> list[dict]:
  return measure("tiny", tiny.get_config()) + measure("bench_lm", bench_lm.get_config())


if __name__ == "__main__":
  for row in run():
    print(row)
