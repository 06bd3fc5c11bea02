"""The bench_lm model and train step in plain JAX: no flax, no optax, no axtrain.

Written from the architecture alone (LLaMA: RMSNorm, RoPE in the Hugging Face
half-split layout, causal MHA, SwiGLU, untied head) as the yardstick of
`make bench`: axtrain's step must be at least as fast as this one jitted
function. AdamW matches trainer.optimizer's defaults: global-norm clip 1.0,
b1 0.9, b2 0.95, eps 1e-8, decoupled weight decay 0.1 on weights only (decided
by logical axes, as below), and a linear warm-up then cosine decay to 10% of
the peak.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Shape:
  vocab: int = 8192
  dim: int = 256
  layers: int = 4
  heads: int = 4
  hidden: int = 1024
  eps: float = 1e-5  # RMSNorm
  theta: float = 10_000.0  # RoPE


@dataclasses.dataclass(frozen=True)
class Hyper:
  peak_lr: float = 3e-4
  warmup_steps: int = 10
  total_steps: int = 100  # cosine decay length, warm-up included
  end_ratio: float = 0.1
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  weight_decay: float = 0.1
  decay_embeddings: bool = True
  clip_norm: float = 1.0


# The logical axes axtrain gives each parameter. A weight maps one vector space to another, so
# its axes name two; norm scales name one. Decided by meaning, not by rank: in axtrain's
# scanned stacks a norm scale is [layers, dim], 2-D like a matrix.
AXES = {"embed": ("vocab", "embed"), "head": ("embed", "vocab"),
        "wq": ("embed", "heads"), "wk": ("embed", "heads"), "wv": ("embed", "heads"),
        "wo": ("heads", "embed"), "w_gate": ("embed", "mlp"), "w_up": ("embed", "mlp"),
        "w_down": ("mlp", "embed"), "attn_norm": ("norm",), "mlp_norm": ("norm",),
        "final_norm": ("norm",)}


def decayed(name: str, h: Hyper) -> bool:
  return len(set(AXES[name])) >= 2 and (h.decay_embeddings or name != "embed")


def init_params(key, s: Shape) -> dict:
  """Normal(0.02) matrices, unit norm scales. Layer matrices are [in, out]."""
  keys = iter(jax.random.split(key, 2 + 7 * s.layers))
  normal = lambda shape: 0.02 * jax.random.normal(next(keys), shape, jnp.float32)
  layers = []
  for _ in range(s.layers):
    layers.append({
        "attn_norm": jnp.ones((s.dim,), jnp.float32),
        "wq": normal((s.dim, s.dim)), "wk": normal((s.dim, s.dim)),
        "wv": normal((s.dim, s.dim)), "wo": normal((s.dim, s.dim)),
        "mlp_norm": jnp.ones((s.dim,), jnp.float32),
        "w_gate": normal((s.dim, s.hidden)), "w_up": normal((s.dim, s.hidden)),
        "w_down": normal((s.hidden, s.dim)),
    })
  return {"embed": normal((s.vocab, s.dim)), "layers": layers,
          "final_norm": jnp.ones((s.dim,), jnp.float32), "head": normal((s.dim, s.vocab))}


def rms_norm(x, scale, eps):
  return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def rope(x, cos, sin):
  half = x.shape[-1] // 2
  x1, x2 = x[..., :half], x[..., half:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def forward(params, tokens, s: Shape):
  """tokens [B, L] int32 -> logits [B, L, V] float32."""
  b, length = tokens.shape
  hd = s.dim // s.heads
  inv_freq = 1.0 / (s.theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd))
  angles = jnp.arange(length, dtype=jnp.float32)[:, None] * inv_freq  # [L, hd/2]
  cos, sin = jnp.cos(angles)[:, None], jnp.sin(angles)[:, None]  # [L, 1, hd/2]
  causal = jnp.tril(jnp.ones((length, length), bool))
  x = params["embed"][tokens]
  for p in params["layers"]:
    h = rms_norm(x, p["attn_norm"], s.eps)
    q = rope((h @ p["wq"]).reshape(b, length, s.heads, hd), cos, sin)
    k = rope((h @ p["wk"]).reshape(b, length, s.heads, hd), cos, sin)
    v = (h @ p["wv"]).reshape(b, length, s.heads, hd)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
    scores = jnp.where(causal, scores, -1e30)
    att = jax.nn.softmax(scores, axis=-1)
    o = jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, length, s.dim)
    x = x + o @ p["wo"]
    h = rms_norm(x, p["mlp_norm"], s.eps)
    x = x + (jax.nn.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]
  return rms_norm(x, params["final_norm"], s.eps) @ params["head"]


def loss_fn(params, batch, s: Shape):
  """Weighted mean next-token cross-entropy (nats)."""
  logits = forward(params, batch["inputs"], s)
  logp = jax.nn.log_softmax(logits, axis=-1)
  nll = -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)[..., 0]
  w = batch["weights"]
  return jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1.0)


def learning_rate(step, h: Hyper):
  step = step.astype(jnp.float32)
  warm = h.peak_lr * step / max(h.warmup_steps, 1)
  t = jnp.clip((step - h.warmup_steps) / max(h.total_steps - h.warmup_steps, 1), 0.0, 1.0)
  cosine = h.peak_lr * (h.end_ratio + (1 - h.end_ratio) * 0.5 * (1 + jnp.cos(jnp.pi * t)))
  return jnp.where(step < h.warmup_steps, warm, cosine)


def init_opt(params):
  zeros = jax.tree.map(jnp.zeros_like, params)
  return {"mu": zeros, "nu": jax.tree.map(jnp.zeros_like, params),
          "step": jnp.zeros((), jnp.int32)}


def adamw(params, grads, opt, h: Hyper):
  norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
  scale = jnp.where(norm > h.clip_norm, h.clip_norm / norm, 1.0)
  grads = jax.tree.map(lambda g: g * scale, grads)
  t = opt["step"] + 1
  mu = jax.tree.map(lambda m, g: h.b1 * m + (1 - h.b1) * g, opt["mu"], grads)
  nu = jax.tree.map(lambda n, g: h.b2 * n + (1 - h.b2) * g * g, opt["nu"], grads)
  c1 = 1 - h.b1 ** t.astype(jnp.float32)
  c2 = 1 - h.b2 ** t.astype(jnp.float32)
  lr = learning_rate(opt["step"], h)

  def update(path, p, m, n):
    u = (m / c1) / (jnp.sqrt(n / c2) + h.eps)
    if decayed(path[-1].key, h):
      u = u + h.weight_decay * p
    return p - lr * u

  new = jax.tree_util.tree_map_with_path(update, params, mu, nu)
  return new, {"mu": mu, "nu": nu, "step": t}, norm, lr


def train_step(params, opt, batch, *, s: Shape, h: Hyper):
  loss, grads = jax.value_and_grad(loss_fn)(params, batch, s)
  params, opt, grad_norm, lr = adamw(params, grads, opt, h)
  return params, opt, {"loss": loss, "grad_norm": grad_norm, "learning_rate": lr}


def jitted_step(s: Shape, h: Hyper):
  """(params, opt, batch) -> (params, opt, metrics), donating params and optimizer state."""
  return jax.jit(functools.partial(train_step, s=s, h=h), donate_argnums=(0, 1))


def from_axtrain(params) -> dict:
  """axtrain's decoder_lm parameters (unrolled `layers_i` or scanned `layers`) -> this layout."""
  def layer(p):
    a, f = p["block"]["attention"], p["block"]["ffn"]
    d = a["q"].shape[0]
    return {"attn_norm": p["block"]["attention_norm"]["scale"],
            "wq": a["q"].reshape(d, -1), "wk": a["k"].reshape(d, -1),
            "wv": a["v"].reshape(d, -1), "wo": a["o"].reshape(-1, d),
            "mlp_norm": p["block"]["ffn_norm"]["scale"],
            "w_gate": f["wi"], "w_up": f["wu"], "w_down": f["wo"]}
  if "layers" in params:
    n = jax.tree.leaves(params["layers"])[0].shape[0]
    layers = [layer(jax.tree.map(lambda x, i=i: x[i], params["layers"])) for i in range(n)]
  else:
    layers = [layer(params[f"layers_{i}"]) for i in range(len(
        [k for k in params if k.startswith("layers_")]))]
  return {"embed": params["embedding"]["embedding"], "layers": layers,
          "final_norm": params["final_norm"]["scale"], "head": params["head"]}
