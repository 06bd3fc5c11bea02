"""Decoder-only language models: embeddings, a stack of blocks (scanned or unrolled), LM head."""

import dataclasses
from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

from modules import context, pipeline
from modules.block import BLOCKS
from modules.embedding import EMBEDDINGS, POSITION_EMBEDDINGS
from modules.norms import NORMS
from core.registry import REQUIRED, ConfigError, Registry, child

MODELS = Registry("model")

# Rematerialisation policies by name. Names other than these are taken as the
# names of tagged activations to save (`jax.ad_checkpoint.checkpoint_name`).
REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "save_qkv_proj": jax.checkpoint_policies.save_only_these_names("qkv_proj"),
    "save_attn_out": jax.checkpoint_policies.save_only_these_names("qkv_proj", "attn_out"),
}
REMAT_NAMES = ("none", *REMAT_POLICIES)
# Activations tagged with checkpoint_name in the layer library (modules/attention.py);
# `remat` may also be a comma-separated list of these, saved and the rest recomputed.
CHECKPOINT_NAMES = ("qkv_proj", "attn_out")


# Saved whatever the policy: activations that depend on the batch alone, not on the layer's
# input, so that every layer's is one array (the attention mask of packed documents), built
# once in the forward pass rather than again in each layer's recomputation.
ALWAYS_SAVED = ("attention_mask",)


def remat_policy(name: str):
  policy = REMAT_POLICIES.get(name) or jax.checkpoint_policies.save_only_these_names(
      *name.split(","))
  return jax.checkpoint_policies.save_from_both_policies(
      policy, jax.checkpoint_policies.save_only_these_names(*ALWAYS_SAVED))


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecoderLMConfig:
  kind: str = "decoder_lm"
  vocab_size: int = REQUIRED  # tokens in the vocabulary
  dim: int = REQUIRED  # model width (residual stream)
  num_layers: int = REQUIRED  # decoder blocks
  scan_layers: bool = True  # one compiled block scanned over layers (fast compile) or unrolled
  # Microbatches per (accumulation) batch through the pipeline stages when the mesh splits the
  # layer stack (mesh.stage > 1; modules/pipeline.py); the idle fraction of a step is
  # (stages - 1) / (microbatches + stages - 1). 0 = as many as stages.
  pipeline_microbatches: int = 0
  remat: str = "none"  # none | full | dots_saveable | dots_with_no_batch_dims_saveable | save_qkv_proj | save_attn_out | tagged names, e.g. "qkv_proj,attn_out"
  tie_embeddings: bool = False  # LM head reuses the token embedding matrix
  embedding: Any = child("embedding")
  position_embedding: Any = child("position_embedding")  # none (RoPE lives in attention) / learned
  block: Any = child("block")
  final_norm: Any = child("norm")

  def check(self):
    for name in ("vocab_size", "dim", "num_layers"):
      if getattr(self, name) <= 0:
        raise ConfigError(f"model.{name} must be positive, got {getattr(self, name)}")
    if self.pipeline_microbatches < 0:
      raise ConfigError(f"model.pipeline_microbatches must be >= 0 (0 = as many as stages), got "
                        f"{self.pipeline_microbatches}")
    if self.remat not in REMAT_NAMES and not set(self.remat.split(",")) <= set(CHECKPOINT_NAMES):
      raise ConfigError(f"model.remat: unknown policy '{self.remat}'; known: {', '.join(REMAT_NAMES)}"
                        f", or tagged activations to save (comma-separated): "
                        f"{', '.join(CHECKPOINT_NAMES)}")


class _Layer(nn.Module):
  """Adapts a block to nn.scan's (carry, x) -> (carry, y) signature."""
  cfg: Any
  dim: int
  decode: bool = False  # an attribute, not a call input: nn.scan broadcasts arrays only

  @nn.compact
  def __call__(self, x_BxLxD, positions_BxL, segment_ids_BxL):
    block = BLOCKS.build(self.cfg, dim=self.dim, name="block")
    return block(x_BxLxD, positions_BxL, segment_ids_BxL, decode=self.decode), None


@MODELS.register("decoder_lm", DecoderLMConfig)
class DecoderLM(nn.Module):
  """tokens [B, L] -> logits [B, L, V] (in the parameters' dtype).

  With `head=False`: (final hidden states [B, L, D], LM head matrix [D, V]) instead, for a
  loss that computes the logits chunk by chunk (trainer.step, trainer.loss_chunk_size).
  decode=True: attention reads and writes its KV cache (the mutable "cache"
  collection) at `positions_BxL`; see trainer/generate.py.
  """
  cfg: DecoderLMConfig

  @nn.compact
  def __call__(self, tokens_BxL, positions_BxL=None, segment_ids_BxL=None, *, head: bool = True,
               decode: bool = False):
    cfg = self.cfg
    if positions_BxL is None:
      positions_BxL = jnp.broadcast_to(jnp.arange(tokens_BxL.shape[1]), tokens_BxL.shape)
    # Context parallelism: the sequence in the load-balanced layout until the final hidden
    # states, which go back to the natural order (modules/context.py).
    shards = 1 if decode else context.shards()[1]
    if shards > 1:
      tokens_BxL, positions_BxL = (context.zigzag(a, shards) for a in (tokens_BxL, positions_BxL))
      if segment_ids_BxL is not None:
        segment_ids_BxL = context.zigzag(segment_ids_BxL, shards)
    embed = EMBEDDINGS.build(cfg.embedding, vocab_size=cfg.vocab_size, dim=cfg.dim,
                             name="embedding")
    x = embed(tokens_BxL)
    pos = POSITION_EMBEDDINGS.build(cfg.position_embedding, dim=cfg.dim,
                                    name="position_embedding")(positions_BxL)
    if pos is not None:
      x = x + pos
    x = nn.with_logical_constraint(x, ("act_batch", "act_length", "act_embed"))

    layer = _Layer
    if cfg.remat != "none" and not decode:
      layer = nn.remat(layer, policy=remat_policy(cfg.remat), prevent_cse=not cfg.scan_layers)
    stage_axes, stages = pipeline.stages()
    if stages > 1 and not decode and not self.is_initializing():
      x = self._pipelined(x, positions_BxL, segment_ids_BxL, axes=stage_axes, stages=stages)
    elif cfg.scan_layers:
      stack = nn.scan(layer, variable_axes={"params": 0, "losses": 0, "cache": 0},
                      split_rngs={"params": True}, in_axes=(nn.broadcast, nn.broadcast),
                      length=cfg.num_layers, metadata_params={nn.PARTITION_NAME: "layers"})
      x, _ = stack(cfg=cfg.block, dim=cfg.dim, decode=decode, name="layers")(
          x, positions_BxL, segment_ids_BxL)
    else:
      for i in range(cfg.num_layers):
        x, _ = layer(cfg=cfg.block, dim=cfg.dim, decode=decode, name=f"layers_{i}")(
            x, positions_BxL, segment_ids_BxL)

    if shards > 1:
      x = nn.with_logical_constraint(context.unzigzag(x, shards),
                                     ("act_batch", "act_length", "act_embed"))
    x = NORMS.build(cfg.final_norm, dim=cfg.dim, name="final_norm")(x)
    if cfg.tie_embeddings:
      if not head:
        return x, embed.embedding.T.astype(x.dtype)
      with jax.named_scope("head"):  # names its ops in profiles and `axtrain plan --ops`
        logits = embed.attend(x)
    else:
      w = self.param("head", nn.with_logical_partitioning(
          nn.initializers.normal(cfg.embedding.init_std), ("embed", "vocab")),
          (cfg.dim, cfg.vocab_size))
      if not head:
        return x, w.astype(x.dtype)
      with jax.named_scope("head"):
        logits = jnp.einsum("bld,dv->blv", x, w.astype(x.dtype))
    return nn.with_logical_constraint(logits, ("act_batch", "act_length", "act_vocab"))

  def _pipelined(self, x_BxLxD, positions_BxL, segment_ids_BxL, *, axes, stages: int):
    """The scanned stack's layers as pipeline stages (modules/pipeline.py), on the parameters
    that `nn.scan` made for it ("layers", [num_layers, ...])."""
    cfg = self.cfg
    microbatches = cfg.pipeline_microbatches or stages
    pipeline.check(num_layers=cfg.num_layers, scan_layers=cfg.scan_layers, stage_count=stages,
                   batch=x_BxLxD.shape[0], microbatches=microbatches)
    block = _Layer(cfg=cfg.block, dim=cfg.dim, parent=None)
    sows = []

    def layer_fn(params, x, extras):
      (y, _), state = block.apply({"params": params}, x, *extras, mutable=["losses"])
      losses = jax.tree.leaves(state.get("losses", {}))
      sows.append(bool(losses))
      return y, sum((jnp.sum(v) for v in losses), jnp.float32(0))

    if cfg.remat != "none":
      layer_fn = jax.checkpoint(layer_fn, policy=remat_policy(cfg.remat), prevent_cse=False)
    x, aux = pipeline.gpipe(layer_fn, self.variables["params"]["layers"], x_BxLxD,
                            (positions_BxL, segment_ids_BxL), axes=axes, stage_count=stages,
                            microbatches=microbatches)
    if any(sows):  # the layers' own losses (MoE load balancing), summed over layers
      self.sow("losses", "pipeline_layers", aux)
    return x
