"""axtrain's training loop against benchmarks/plain_jax.py on the same model, batches and start.

Rounds alternate which side runs first (ABBA), so that drift in a machine's load falls on
both. axtrain's figure is what its own loop logs (`step_time_s` of its metrics record, steps
2..K of `trainer.loop.train`); plain JAX's is the same span timed around its loop, which also
pulls batches from the same iterator. Plain JAX computes what the experiment computes
(`plain_shape`, `plain_hyper`, `plain_options`: the model, AdamW and schedule, the compute
dtype, attention kernel, remat, microbatches and loss chunks); it may run in several
`variants` (Options that change only its speed), each timed in every round.

`make bench` (benchmarks/run.py) compares on CPU; `python -m benchmarks.chip compare` on the
lent TPU chip (`chip_experiment` builds the run as the CLI does, mesh rules included).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time

import jax

from benchmarks import plain_jax
from launcher import config_loading
from trainer import config as config_lib, experiment, loop, mesh_rules, meshes
from trainer.experiment import Experiment

AXTRAIN = "axtrain"


@dataclasses.dataclass
class Comparison:
  name: str
  params: int
  tokens_per_step: int
  flops_per_step: float
  ours_step_s: list[float]  # per round, steady state
  plain_step_s: list[float]
  ours_first_s: float  # time to first step: init + compile + one step
  plain_first_s: float
  ours_loss: float  # loss logged at the last step of round 1 (same start, same batches)
  plain_loss: float

  @property
  def ours_median_s(self) -> float:
    return statistics.median(self.ours_step_s)

  @property
  def plain_median_s(self) -> float:
    return statistics.median(self.plain_step_s)

  @property
  def ratio(self) -> float:
    """Throughput of axtrain over plain JAX (> 1: axtrain is faster)."""
    return self.plain_median_s / self.ours_median_s


@dataclasses.dataclass
class Side:
  """One side's figures over the rounds."""
  step_s: list[float] = dataclasses.field(default_factory=list)  # per round, steps 2..K
  first_s: float | None = None  # time to first step: init + compile + one step
  loss: float | None = None  # loss at step K of round 1

  @property
  def median_s(self) -> float:
    return statistics.median(self.step_s)


def model_flops_per_step(exp: Experiment) -> float:
  """6 N T for the matmul parameters (not the input embedding table) + attention.

  Attention: 12 * layers * seq * dim per token (QK^T and AV, forward and
  backward), counting the full square as PaLM's MFU does.
  """
  m = exp.run.model
  n = exp.num_params - m.vocab_size * m.dim * (0 if m.tie_embeddings else 1)
  tokens = exp.source.batch_size * exp.source.seq_len
  return 6 * n * tokens + 12 * m.num_layers * exp.source.seq_len * m.dim * tokens


def _check_llama(m) -> None:
  """ValueError for a model that plain_jax does not write: it is LLaMA only."""
  b, a, f = m.block, m.block.attention, m.block.ffn
  found = {"model": m.kind, "embedding": m.embedding.kind,
           "position_embedding": m.position_embedding.kind, "block": b.kind,
           "norm": b.norm.kind, "final_norm": m.final_norm.kind, "attention": a.kind,
           "position": a.position.kind, "ffn": f.kind,
           "ffn.activation": getattr(f, "activation", None),
           "ffn.gated": getattr(f, "gated", None),
           "biases": a.qkv_bias or a.out_bias or getattr(f, "use_bias", True),
           "qk_norm": a.norm is not None, "eps": b.norm.eps == m.final_norm.eps}
  llama = {"model": "decoder_lm", "embedding": "token", "position_embedding": "none",
           "block": "pre_norm", "norm": "rmsnorm", "final_norm": "rmsnorm",
           "attention": "attention", "ffn": "mlp", "ffn.activation": "silu",
           "ffn.gated": True, "biases": False, "qk_norm": False, "eps": True}
  bad = [f"{k}={found[k]}" for k, v in llama.items() if found[k] != v]
  if found["position"] not in ("rope", "rope_llama3"):
    bad.append(f"position={found['position']}")
  if bad:
    raise ValueError(f"plain_jax writes LLaMA models only; this one has {', '.join(bad)}")


def plain_shape(exp: Experiment) -> plain_jax.Shape:
  m = exp.run.model
  _check_llama(m)
  a = m.block.attention
  p = a.position
  scaling = ((p.factor, p.low_freq_factor, p.high_freq_factor, p.original_max_position)
             if p.kind == "rope_llama3" else None)
  return plain_jax.Shape(vocab=m.vocab_size, dim=m.dim, layers=m.num_layers,
                         heads=a.num_heads, hidden=m.block.ffn.hidden_dim,
                         eps=m.block.norm.eps, theta=p.theta, kv_heads=a.num_kv_heads or 0,
                         head_dim=a.head_dim or 0, padded_vocab=m.padded_vocab_size,
                         tied=m.tie_embeddings, rope_scaling=scaling)


def plain_hyper(exp: Experiment) -> plain_jax.Hyper:
  o = exp.run.optimizer
  if o.kind != "adamw" or o.state_dtype != "float32":
    raise ValueError("plain_jax implements adamw with float32 state only")
  if o.schedule.kind != "warmup_cosine":
    raise ValueError("plain_jax implements the warmup_cosine schedule only")
  steps = exp.run.trainer.max_steps
  schedule = o.schedule.fitted(steps)  # as trainer/schedules.py fits it into a short run
  return plain_jax.Hyper(peak_lr=o.learning_rate, warmup_steps=schedule.warmup_steps,
                         total_steps=schedule.decay_steps or steps,
                         end_ratio=schedule.end_ratio,
                         b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay,
                         decay_embeddings=o.decay_embeddings,
                         clip_norm=math.inf if o.clip_norm is None else o.clip_norm)


def plain_attention(implementation: str, platform: str) -> str:
  """Plain JAX's attention for an experiment's implementation: the einsums of axtrain's `xla`
  for `xla`; the Pallas splash kernel for `splash`, and on a TPU for any other kernel (our own
  pallas_hd64, tokamax's): the fastest that JAX itself ships, so that the ratio counts a kernel
  of ours as axtrain's gain over what a plain JAX user has (the einsums would count it twice)."""
  if implementation == "splash" or (implementation != "xla" and platform == "tpu"):
    return "splash"
  return "einsum"


def plain_options(exp: Experiment, **changes) -> plain_jax.Options:
  """What the experiment computes (dtype, attention: `plain_attention`; remat, microbatches,
  loss chunks), unrolled layers, and `changes` (speed choices: scan, fused, rope)."""
  m, t = exp.run.model, exp.run.trainer
  if m.remat != "none" and m.remat not in plain_jax.REMAT:
    raise ValueError(f"plain_jax does not implement model.remat={m.remat}; it has "
                     f"{', '.join(plain_jax.REMAT)}")
  a = m.block.attention
  attention = plain_attention(a.implementation, exp.mesh.devices.flat[0].platform)
  if attention != "splash" and a.logits_dtype != "compute":
    raise ValueError("plain_jax writes attention logits in the compute dtype only")
  return dataclasses.replace(plain_jax.Options(
      compute_dtype=jax.numpy.dtype(exp.compute_dtype).name,
      attention=attention,
      splash_block=a.splash_block_size, remat=m.remat, grad_accum=t.grad_accum_steps,
      loss_chunk=t.loss_chunk_size), **changes)


class _Plain:
  """Plain JAX on the experiment's model, batches and hyperparameters, laid out by `options`."""

  def __init__(self, exp: Experiment, options: plain_jax.Options):
    self.exp, self.options = exp, options
    self.shape, self.hyper = plain_shape(exp), plain_hyper(exp)
    self.step = plain_jax.jitted_step(self.shape, self.hyper, options)

  def first(self) -> float:
    """Time to first step from nothing: own init (jitted) + compile + one step."""
    t = time.perf_counter()
    params = jax.jit(plain_jax.init_params, static_argnums=(1, 2))(
        jax.random.key(0), self.shape, self.options)
    data = self.exp.source.train_iterator(process_index=0, process_count=1)
    params, opt, _ = self.step(params, plain_jax.init_opt(params), next(data))
    jax.block_until_ready(params)
    return time.perf_counter() - t

  def run(self, params) -> tuple[float, float]:
    """K steps from `params` (axtrain layout): (steady-state step seconds, last loss)."""
    steps = self.exp.run.trainer.max_steps
    params = jax.device_put(plain_jax.from_axtrain(params, self.options))
    opt = plain_jax.init_opt(params)
    data = self.exp.source.train_iterator(process_index=0, process_count=1)
    params, opt, metrics = self.step(params, opt, next(data))
    jax.block_until_ready(params)
    t = time.perf_counter()
    for _ in range(steps - 1):
      params, opt, metrics = self.step(params, opt, next(data))
    loss = float(jax.device_get(metrics["loss"]))
    return (time.perf_counter() - t) / max(steps - 1, 1), loss


def _axtrain_round(exp: Experiment, side: Side) -> None:
  result = loop.train(exp)
  record = [x for x in result.records if "step_time_s" in x][-1]
  side.step_s.append(record["step_time_s"])
  if side.first_s is None:
    side.first_s, side.loss = result.time_to_first_step_s, record["loss"]


def measure(exp: Experiment, variants: dict[str, plain_jax.Options], *,
            rounds: int) -> dict[str, Side]:
  """`rounds` interleaved runs of trainer.max_steps steps of axtrain (key AXTRAIN) and of plain
  JAX in each of `variants`; odd rounds run the sides in reverse order. One side's state is
  freed before the next starts (both need not fit at once)."""
  cfg = exp.run.trainer
  if cfg.log_every != cfg.max_steps or cfg.max_steps < 2:
    raise ValueError("compare needs trainer.log_every == trainer.max_steps >= 2")
  plains = {name: _Plain(exp, o) for name, o in variants.items()}
  sides = {name: Side() for name in (AXTRAIN, *plains)}
  start = jax.device_get(exp.init().params)
  for r in range(rounds):
    order = list(sides) if r % 2 == 0 else list(sides)[::-1]
    for name in order:
      if name == AXTRAIN:
        _axtrain_round(exp, sides[name])
        continue
      side, plain = sides[name], plains[name]
      if side.first_s is None:
        side.first_s = plain.first()
      seconds, loss = plain.run(start)
      side.step_s.append(seconds)
      if side.loss is None:
        side.loss = loss
  return sides


# Plain JAX's speed choices by name, for variant specs such as "scan+fused+permute".
VARIANT_WORDS = {"unrolled": {"scan": False}, "scan": {"scan": True},
                 "fused": {"fused": True}, "unfused": {"fused": False},
                 "halves": {"rope": "halves"}, "permute": {"rope": "permute"}}
# The fastest plain step on CPU (`make bench`). Measured on 2 shared cores (2026-12-05, min of
# 12 interleaved steps each, s/step): bench_lm axtrain 1.64, plain unrolled 1.69, +fused 1.40,
# +permute 1.70; tiny 0.265 / 0.279 / 0.229; scanned layers were slower (tiny 0.46).
CPU_VARIANT = "unrolled+fused"


def variant(exp: Experiment, spec: str) -> plain_jax.Options:
  """plain_options(exp) changed by the words of `spec`, joined by '+' (VARIANT_WORDS)."""
  changes = {}
  for word in spec.split("+"):
    if word not in VARIANT_WORDS:
      raise ValueError(f"plain variant '{word}' is not one of {', '.join(VARIANT_WORDS)}")
    changes.update(VARIANT_WORDS[word])
  return plain_options(exp, **changes)


def compare(name: str, exp: Experiment, *, rounds: int,
            options: plain_jax.Options | None = None) -> Comparison:
  """`rounds` interleaved runs of exp.run.trainer.max_steps steps on each side; plain JAX as
  `options` (default: the variant CPU_VARIANT)."""
  sides = measure(exp, {"plain": options or variant(exp, CPU_VARIANT)}, rounds=rounds)
  ours, plain = sides[AXTRAIN], sides["plain"]
  return Comparison(name=name, params=exp.num_params,
                    tokens_per_step=exp.source.batch_size * exp.source.seq_len,
                    flops_per_step=model_flops_per_step(exp), ours_step_s=ours.step_s,
                    plain_step_s=plain.step_s, ours_first_s=ours.first_s,
                    plain_first_s=plain.first_s, ours_loss=ours.loss, plain_loss=plain.loss)


def chip_experiment(config: str, overrides: tuple[str, ...], *, steps: int) -> Experiment:
  """The run of `axtrain --config=config *overrides` on the devices here, built as the CLI
  builds it (the recipe's mesh rules applied), for `steps` steps logged once at the end and
  one eval batch (the loop evaluates after its last step; that is not timed)."""
  argv = (*overrides, f"--config.trainer.max_steps={steps}",
          f"--config.trainer.log_every={steps}", "--config.eval.num_batches=1")
  cfg = config_loading.load(config, *argv)
  entry = meshes.select("auto")
  mesh_rules.apply_rules(cfg, entry, {k for k, _ in config_loading.overrides(["axtrain", *argv])})
  return experiment.build(config_lib.parse(cfg), entry)


def row(sides: dict[str, Side], exp: Experiment, variants: dict[str, plain_jax.Options]) -> dict:
  """The figures of `measure` as one JSON-ready record: what axtrain's run computes with (its
  recipe's rules applied); per side the per-round step seconds, median tokens/s, time to first
  step and loss at step K; ratio = axtrain's tokens/s over the fastest plain variant's (>= 1:
  axtrain is at least as fast)."""
  tokens = exp.source.batch_size * exp.source.seq_len
  m, t = exp.run.model, exp.run.trainer
  out = {"tokens_per_step": tokens, "params": exp.num_params,
         "flops_per_step": model_flops_per_step(exp), "sides": {},
         "axtrain_config": {"scan_layers": m.scan_layers, "remat": m.remat,
                            "attention": m.block.attention.implementation,
                            "fused_qkv": m.block.attention.fused_qkv,
                            "fused_gate_up": m.block.ffn.fused_gate_up,
                            "grad_accum_steps": t.grad_accum_steps,
                            "loss_chunk_size": t.loss_chunk_size,
                            "compute_dtype": jax.numpy.dtype(exp.compute_dtype).name}}
  for name, side in sides.items():
    out["sides"][name] = {
        "step_s": side.step_s, "median_step_s": side.median_s,
        "tokens_per_sec": tokens / side.median_s, "first_step_s": side.first_s,
        "loss": side.loss,
        **({"options": dataclasses.asdict(variants[name])} if name in variants else {})}
  best = min(variants, key=lambda n: sides[n].median_s)
  out["fastest_plain"] = best
  out["ratio"] = sides[best].median_s / sides[AXTRAIN].median_s
  out["ratios"] = {n: sides[n].median_s / sides[AXTRAIN].median_s for n in variants}
  return out
