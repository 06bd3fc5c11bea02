"""LLaMA's train step in plain JAX: no flax, no optax, no axtrain; the yardstick of axtrain's speed.

Written from the architecture alone, as an expert would write it by hand for speed: one
jitted function (`jitted_step`) that takes float32 master weights, computes in `compute_dtype`
(bfloat16 on accelerators) and updates with AdamW. The model is any row of modules/llama.py's
table: RMSNorm, RoPE in the Hugging Face half-split layout (LLaMA-3's frequency scaling too),
causal attention over G <= H kv heads, SwiGLU, an untied or tied head, a vocabulary padded to
a multiple (the pad ids' logits out of the softmax); packed documents (a batch's `positions`
and `segment_ids`) attend within their own document. Attention is axtrain's kernel written out
here: `einsum_attention` in the form of its `xla` implementation, or the Pallas splash kernel
called directly (jax.experimental.pallas.ops.tpu) with the same blocks as its `splash`, in
Pallas interpret mode off TPU (slow: for tests).

The math is axtrain's (benchmarks/compare.py and tests/test_plain_jax.py check that the losses
agree): parameters cast to the compute dtype once a step, norms and the softmax in
float32, the sum of token cross-entropies over the weights' sum; AdamW as trainer.optimizer
builds it: global-norm clip, b1, b2, eps, decoupled weight decay on weights only (decided by
logical axes, as below), a linear warm-up then cosine decay. `Options` holds how it computes:
the compute dtype and attention kernel (set as the axtrain run it stands for sets them), and
choices that change only its speed: layers unrolled or scanned, q/k/v and gate/up fused into
one matrix each, RoPE's partners by slices or by a permutation product, rematerialisation,
microbatches, cross-entropy in chunks.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as sa


@dataclasses.dataclass(frozen=True)
class Shape:
  vocab: int = 8192  # token ids
  dim: int = 256
  layers: int = 4
  heads: int = 4  # query heads
  hidden: int = 1024  # SwiGLU width
  eps: float = 1e-5  # RMSNorm
  theta: float = 10_000.0  # RoPE
  kv_heads: int = 0  # 0: heads (MHA)
  head_dim: int = 0  # 0: dim // heads
  padded_vocab: int = 0  # rows of the embedding and columns of the head; 0: vocab
  tied: bool = False  # the head is the embedding table, transposed
  rope_scaling: tuple | None = None  # LLaMA-3: (factor, low_freq, high_freq, original_max)

  @property
  def kv(self) -> int:
    return self.kv_heads or self.heads

  @property
  def hd(self) -> int:
    return self.head_dim or self.dim // self.heads

  @property
  def rows(self) -> int:
    return max(self.padded_vocab, self.vocab)


@dataclasses.dataclass(frozen=True)
class Options:
  """How the step computes: the dtype and attention kernel of the run compared with, and
  choices for speed that leave the math as it is (the rest)."""
  compute_dtype: str = "float32"  # float32 | bfloat16 (matmuls, activations; master weights f32)
  attention: str = "einsum"  # einsum (as axtrain's `xla`) | splash (the Pallas TPU kernel)
  splash_block: int = 1024  # splash: queries and keys per block (a multiple of 128)
  scan: bool = False  # layers as one scanned body over stacked weights, else a Python loop
  fused: bool = False  # q, k, v one [dim, (H + 2G) K] matrix; gate and up one [dim, 2F]
  rope: str = "halves"  # RoPE partners by slicing the halves, or "permute" (K x K product)
  remat: str = "none"  # none | full | dots_saveable | dots_with_no_batch_dims_saveable
  grad_accum: int = 1  # microbatches per step (strided rows, gradients summed in a scan)
  loss_chunk: int = 0  # > 0: head and cross-entropy over chunks of this many positions


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


REMAT = {"full": jax.checkpoint_policies.nothing_saveable,
         "dots_saveable": jax.checkpoint_policies.dots_saveable,
         "dots_with_no_batch_dims_saveable":
             jax.checkpoint_policies.dots_with_no_batch_dims_saveable}

# The splash kernel's inner loop takes keys this many at a time; one fused backward kernel
# (what modules/attn_splash.py measured fastest on a v5e chip; tests check the two agree).
SPLASH_KV_COMPUTE = 512

# The logical axes axtrain gives each parameter. A weight maps one vector space to another, so
# its axes name two; norm scales name one. Decided by meaning, not by rank: stacked for a scan,
# a norm scale is [layers, dim], 2-D like a matrix.
AXES = {"embed": ("vocab", "embed"), "head": ("embed", "vocab"),
        "wq": ("embed", "heads"), "wk": ("embed", "heads"), "wv": ("embed", "heads"),
        "wqkv": ("embed", "heads"), "wo": ("heads", "embed"), "w_gate": ("embed", "mlp"),
        "w_up": ("embed", "mlp"), "w_gate_up": ("embed", "mlp"), "w_down": ("mlp", "embed"),
        "attn_norm": ("norm",), "mlp_norm": ("norm",), "final_norm": ("norm",)}


def decayed(name: str, h: Hyper) -> bool:
  return len(set(AXES[name])) >= 2 and (h.decay_embeddings or name != "embed")


def init_params(key, s: Shape, o: Options = Options()) -> dict:
  """Normal(0.02) matrices, unit norm scales, laid out for `o`. Layer matrices are [in, out]."""
  keys = iter(jax.random.split(key, 2 + 7 * s.layers))
  normal = lambda shape: 0.02 * jax.random.normal(next(keys), shape, jnp.float32)
  q, kv = s.heads * s.hd, s.kv * s.hd
  layers = [{"attn_norm": jnp.ones((s.dim,), jnp.float32),
             "wq": normal((s.dim, q)), "wk": normal((s.dim, kv)), "wv": normal((s.dim, kv)),
             "wo": normal((q, s.dim)), "mlp_norm": jnp.ones((s.dim,), jnp.float32),
             "w_gate": normal((s.dim, s.hidden)), "w_up": normal((s.dim, s.hidden)),
             "w_down": normal((s.hidden, s.dim))} for _ in range(s.layers)]
  params = {"embed": normal((s.rows, s.dim)), "layers": layers,
            "final_norm": jnp.ones((s.dim,), jnp.float32)}
  if not s.tied:
    params["head"] = normal((s.dim, s.rows))
  return arrange(params, o)


def arrange(params: dict, o: Options) -> dict:
  """Parameters with a list of per-layer {wq, wk, wv, ..., w_up} -> the layout `o` computes
  with: matrices fused (concatenated along their outputs), layers stacked for a scan."""
  layers = params["layers"]
  if o.fused:
    fuse = lambda p: {"attn_norm": p["attn_norm"],
                      "wqkv": jnp.concatenate([p["wq"], p["wk"], p["wv"]], axis=1),
                      "wo": p["wo"], "mlp_norm": p["mlp_norm"],
                      "w_gate_up": jnp.concatenate([p["w_gate"], p["w_up"]], axis=1),
                      "w_down": p["w_down"]}
    layers = [fuse(p) for p in layers]
  if o.scan:
    layers = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
  return {**params, "layers": layers}


def rms_norm(x, scale, eps):
  """In float32, the result in x's dtype."""
  y = x.astype(jnp.float32)
  y = y * jax.lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + eps)
  return (y * scale.astype(jnp.float32)).astype(x.dtype)


def inv_freq(s: Shape):
  """RoPE's frequencies per pair; LLaMA-3's scaling (Hugging Face `rope_type: llama3`)."""
  freq = 1.0 / (s.theta ** (jnp.arange(0, s.hd, 2, dtype=jnp.float32) / s.hd))
  if s.rope_scaling is None:
    return freq
  factor, low, high, original = s.rope_scaling
  wavelen = 2 * math.pi / freq
  scaled = jnp.where(wavelen > original / low, freq / factor, freq)
  smooth = (original / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = (wavelen >= original / high) & (wavelen <= original / low)
  return jnp.where(medium, smoothed, scaled)


def rope_tables(positions, s: Shape, o: Options):
  """cos, sin [B, L, 1, K/2] for slices of the halves; [B, L, 1, K] with the sign of each
  half's partner folded into sin for the permutation product."""
  angles = positions[..., None].astype(jnp.float32) * inv_freq(s)
  cos, sin = jnp.cos(angles)[:, :, None], jnp.sin(angles)[:, :, None]
  if o.rope == "permute":
    return jnp.concatenate([cos, cos], axis=-1), jnp.concatenate([-sin, sin], axis=-1)
  return cos, sin


def rope(x, cos, sin, o: Options):
  """Rotates pairs (i, i + K/2) in float32; the result in x's dtype."""
  k = x.shape[-1]
  if o.rope == "permute":  # every array K wide: (x2, x1) from an exact permutation product
    partner = jnp.roll(jnp.eye(k, dtype=x.dtype), k // 2, axis=0)
    swapped = jnp.einsum("blhk,kj->blhj", x, partner, precision=jax.lax.Precision.HIGHEST)
    return (x.astype(jnp.float32) * cos + swapped.astype(jnp.float32) * sin).astype(x.dtype)
  x1, x2 = x[..., :k // 2].astype(jnp.float32), x[..., k // 2:].astype(jnp.float32)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def einsum_attention(q, k, v, segment_ids):
  """[B, L, H, K] queries over [B, L, G, K] keys and values, causal within each segment, as
  axtrain's `xla` implementation computes it: heads ahead of length (batched matmuls over B
  and G), the R = H/G query heads of a group one at a time (one [B, G, L, L] logits array
  live), logits in the compute dtype and the softmax in float32, normalised after the second
  matmul, whose extra column of ones gives the row sums (no pass of its own over [L, L]).
  On CPU this form took 10.1 ms where jax.nn.softmax between [B, L, G, R, K] einsums took
  13.7 ms (fwd + bwd, 8 x 128 tokens, 6 heads of 32)."""
  b, length, h, hd = q.shape
  g = k.shape[2]
  mask = jnp.tril(jnp.ones((length, length), bool))[None, None]
  if segment_ids is not None:
    mask = mask & (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
  q = q.reshape(b, length, g, h // g, hd).transpose(3, 0, 2, 1, 4)  # [R, B, G, L, K]
  k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
  v = jnp.concatenate([v, jnp.ones((*v.shape[:3], 1), v.dtype)], axis=-1)
  outs = []
  for q_r in q:
    logits = jnp.einsum("bgqk,bgsk->bgqs", q_r, k)
    logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min).astype(jnp.float32)
    logits = logits * hd ** -0.5
    e = jnp.exp(logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True)))
    out = jnp.einsum("bgqs,bgsk->bqgk", e.astype(v.dtype), v, preferred_element_type=jnp.float32)
    outs.append((out[..., :-1] / out[..., -1:]).astype(v.dtype))
  return jnp.stack(outs, axis=3).reshape(b, length, h, hd)


def splash_blocks(length: int, block: int) -> sa.BlockSizes:
  """`block` queries and keys (clipped to the length), keys SPLASH_KV_COMPUTE at a time."""
  b = min(block, length)
  compute = math.gcd(b, SPLASH_KV_COMPUTE)
  return sa.BlockSizes(block_q=b, block_kv=b, block_kv_compute=compute, block_q_dkv=b,
                       block_kv_dkv=b, block_kv_dkv_compute=compute, use_fused_bwd_kernel=True)


def splash_attention(q, k, v, segment_ids, o: Options):
  """The Pallas TPU kernel, one row at a time (vmap), skipping the blocks the mask hides."""
  b, length, h, hd = q.shape
  q = (q * hd ** -0.5).astype(q.dtype)
  q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
  mask = sa.MultiHeadMask([sa.CausalMask((length, length))] * h)
  kernel = sa.make_splash_mha(mask, block_sizes=splash_blocks(length, o.splash_block),
                              head_shards=1, q_seq_shards=1,
                              interpret=jax.default_backend() != "tpu")
  if segment_ids is None:
    out = jax.vmap(kernel)(q, k, v)
  else:
    out = jax.vmap(lambda q, k, v, ids: kernel(q, k, v, segment_ids=sa.SegmentIds(ids, ids)))(
        q, k, v, segment_ids)
  return out.transpose(0, 2, 1, 3)


def layer(p, x, cos, sin, segment_ids, s: Shape, o: Options):
  """x += attention(norm(x)); x += SwiGLU(norm(x)), on one layer's (cast) weights."""
  b, length, _ = x.shape
  hq, hkv = s.heads * s.hd, s.kv * s.hd
  h = rms_norm(x, p["attn_norm"], s.eps)
  if o.fused:
    q, k, v = jnp.split(h @ p["wqkv"], [hq, hq + hkv], axis=-1)
  else:
    q, k, v = h @ p["wq"], h @ p["wk"], h @ p["wv"]
  q = rope(q.reshape(b, length, s.heads, s.hd), cos, sin, o)
  k = rope(k.reshape(b, length, s.kv, s.hd), cos, sin, o)
  v = v.reshape(b, length, s.kv, s.hd)
  if o.attention == "splash":
    out = splash_attention(q, k, v, segment_ids, o)
  else:
    out = einsum_attention(q, k, v, segment_ids)
  x = x + out.reshape(b, length, hq) @ p["wo"]
  h = rms_norm(x, p["mlp_norm"], s.eps)
  if o.fused:
    gate, up = jnp.split(h @ p["w_gate_up"], 2, axis=-1)
  else:
    gate, up = h @ p["w_gate"], h @ p["w_up"]
  return x + (jax.nn.silu(gate) * up) @ p["w_down"]


def hidden(params, batch, s: Shape, o: Options):
  """The final norm's output [B, L, D] of (cast) parameters on a batch."""
  tokens = batch["inputs"]
  positions = batch.get("positions")
  if positions is None:
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  cos, sin = rope_tables(positions, s, o)
  segment_ids = batch.get("segment_ids")
  body = functools.partial(layer, s=s, o=o)
  if o.remat != "none":
    body = jax.checkpoint(body, policy=REMAT[o.remat], prevent_cse=not o.scan)
  x = params["embed"][tokens]
  if o.scan:
    x, _ = jax.lax.scan(lambda x, p: (body(p, x, cos, sin, segment_ids), None), x,
                        params["layers"])
  else:
    for p in params["layers"]:
      x = body(p, x, cos, sin, segment_ids)
  return rms_norm(x, params["final_norm"], s.eps)


def logits(x, head, s: Shape):
  """x @ head [.., rows]; the pad ids (vocab and up) at the lowest float."""
  out = x @ head
  if s.rows == s.vocab:
    return out
  return jnp.where(jnp.arange(s.rows) < s.vocab, out, jnp.finfo(out.dtype).min)


def cross_entropy_sum(x, head, targets, weights, s: Shape):
  """sum(weights * (logsumexp(logits) - logits[target])), in float32."""
  z = logits(x, head, s).astype(jnp.float32)
  nll = (jax.nn.logsumexp(z, axis=-1)
         - jnp.take_along_axis(z, targets[..., None], axis=-1)[..., 0])
  return jnp.sum(nll * weights)


def chunked_cross_entropy_sum(x, head, targets, weights, s: Shape, chunk: int):
  """cross_entropy_sum over chunks of `chunk` positions (chunk j: positions j, j + n, ...),
  one chunk's logits at a time, forward and backward (a rematerialised scan body)."""
  b, length = x.shape[:2]
  n = length // chunk
  split = lambda a: jnp.moveaxis(a.reshape(b, chunk, n, *a.shape[2:]), 2, 0)

  @jax.checkpoint
  def body(total, xs):
    x_c, targets_c, weights_c = xs
    return total + cross_entropy_sum(x_c, head, targets_c, weights_c, s), None

  total, _ = jax.lax.scan(body, jnp.float32(0), (split(x), split(targets), split(weights)))
  return total


def loss_sums(params, batch, s: Shape, o: Options):
  """(sum of weighted token losses, (that sum, sum of weights)) of one (micro)batch; the
  parameters cast to the compute dtype (nothing to do where grads_and_sums did that)."""
  dtype = jnp.dtype(o.compute_dtype)
  params = jax.tree.map(lambda p: p.astype(dtype), params)
  x = hidden(params, batch, s, o)
  head = params["embed"].T if s.tied else params["head"]
  weights = batch["weights"].astype(jnp.float32)
  if o.loss_chunk:
    total = chunked_cross_entropy_sum(x, head, batch["targets"], weights, s, o.loss_chunk)
  else:
    total = cross_entropy_sum(x, head, batch["targets"], weights, s)
  return total, (total, jnp.sum(weights))


def grads_and_sums(params, batch, s: Shape, o: Options):
  """(gradient of the loss sum, (loss sum, weight sum)) over the batch, in `o.grad_accum`
  microbatches (rows i, i + n, ...) whose sums a scan adds up. The gradients are taken with
  respect to the compute-dtype copy of the parameters, made once a step, and summed in the
  parameters' dtype (the values the cast's transpose gives, without a float32 gradient per
  microbatch beside the accumulator)."""
  dtype = jnp.dtype(o.compute_dtype)
  compute = jax.tree.map(lambda p: p.astype(dtype), params)
  grad = jax.grad(functools.partial(loss_sums, s=s, o=o), has_aux=True)
  n = o.grad_accum
  if n == 1:
    grads, sums = grad(compute, batch)
  else:
    micro = jax.tree.map(lambda a: a.reshape(a.shape[0] // n, n, *a.shape[1:]).swapaxes(0, 1),
                         batch)

    def body(acc, mb):
      g, sums = grad(compute, mb)
      return (jax.tree.map(lambda a, x: a + x.astype(a.dtype), acc[0], g),
              jax.tree.map(jnp.add, acc[1], sums)), None

    zeros = (jax.tree.map(jnp.zeros_like, params), (jnp.float32(0), jnp.float32(0)))
    (grads, sums), _ = jax.lax.scan(body, zeros, micro)
  return jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params), sums


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


def train_step(params, opt, batch, *, s: Shape, h: Hyper, o: Options = Options()):
  grads, (loss_sum, weight_sum) = grads_and_sums(params, batch, s, o)
  denom = jnp.maximum(weight_sum, 1.0)
  grads = jax.tree.map(lambda g: g / denom, grads)
  params, opt, grad_norm, lr = adamw(params, grads, opt, h)
  return params, opt, {"loss": loss_sum / denom, "grad_norm": grad_norm, "learning_rate": lr}


def jitted_step(s: Shape, h: Hyper, o: Options = Options()):
  """(params, opt, batch) -> (params, opt, metrics), donating params and optimizer state."""
  return jax.jit(functools.partial(train_step, s=s, h=h, o=o), donate_argnums=(0, 1))


def from_axtrain(params, o: Options = Options()) -> dict:
  """axtrain's decoder_lm parameters (unrolled `layers_i` or scanned `layers`, projections
  separate or fused) -> the layout `o` computes with (`arrange`)."""
  def layer_of(p):
    a, f = p["block"]["attention"], p["block"]["ffn"]
    if "qkv" in a:  # attention.fused_qkv: [dim, G, R + 2, K], each group's R queries, k, v
      r = a["qkv"].shape[2] - 2
      a = {"q": a["qkv"][:, :, :r], "k": a["qkv"][:, :, r], "v": a["qkv"][:, :, r + 1], **a}
    if "wi_wu" in f:  # mlp.fused_gate_up: [dim, 2, F], gate then up
      f = {"wi": f["wi_wu"][:, 0], "wu": f["wi_wu"][:, 1], **f}
    d = a["q"].shape[0]
    return {"attn_norm": p["block"]["attention_norm"]["scale"],
            "wq": a["q"].reshape(d, -1), "wk": a["k"].reshape(d, -1),
            "wv": a["v"].reshape(d, -1), "wo": a["o"].reshape(-1, d),
            "mlp_norm": p["block"]["ffn_norm"]["scale"],
            "w_gate": f["wi"], "w_up": f["wu"], "w_down": f["wo"]}
  if "layers" in params:
    n = jax.tree.leaves(params["layers"])[0].shape[0]
    layers = [layer_of(jax.tree.map(lambda x, i=i: x[i], params["layers"])) for i in range(n)]
  else:
    layers = [layer_of(params[f"layers_{i}"]) for i in range(len(
        [k for k in params if k.startswith("layers_")]))]
  out = {"embed": params["embedding"]["embedding"], "layers": layers,
         "final_norm": params["final_norm"]["scale"]}
  if "head" in params:
    out["head"] = params["head"]
  return arrange(out, o)
