"""Run by tests/test_context_pipeline.py in a subprocess with 8 fake CPU devices; prints one JSON
object.

    python tests/context_pipeline_worker.py TMP_DIR
    python tests/context_pipeline_worker.py --splash

For each mesh with context-parallel or pipeline axes (each also with FSDP): the `test` LLaMA's
losses over 6 steps of packed documents (the stdlib source: segment ids and positions) and its
float32 gradients on one batch, next to one device's from the same parameters; how much each
device holds; a checkpoint written by a pipelined mesh restored into one without stages and
back; `axtrain plan`'s report of a pipelined, context-parallel mesh; and the CLI's answers to bad input, with what they left in TMP_DIR. With --splash: the
splash kernel under context parallelism against `xla` attention (slow: Pallas interpret mode).
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time

from tests.cli_batch import run_captured
from tests.conftest import xla_flags

os.environ["XLA_FLAGS"] = xla_flags(8)
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from configs.base import lm_config  # noqa: E402
from modules import llama  # noqa: E402
from trainer import config as config_lib, experiment, loop, meshes  # noqa: E402
from trainer.step import loss_sums, sown_means  # noqa: E402

STEPS = 6
ONE = {"data": 1, "fsdp": 1, "model": 1}
# name: (mesh axes, model changes). `attention`: the implementation (query chunks of 4 for
# `chunked`: two per context shard).
CASES = {
    "context=8": ({"data": 1, "fsdp": 1, "context": 8}, {}),
    "fsdp=2,context=4 (chunked)": ({"data": 1, "fsdp": 2, "context": 4},
                                   {"attention": "chunked"}),
    "stage=4,data=2": ({"data": 2, "fsdp": 1, "stage": 4},
                       {"num_layers": 4, "pipeline_microbatches": 4}),
    "stage=2,fsdp=4 (remat)": ({"data": 1, "fsdp": 4, "stage": 2},
                               {"num_layers": 4, "remat": "full"}),
}
# Gradients only (no training run): another attention implementation under context=8, and
# context parallelism inside pipeline stages.
GRAD_ONLY = {
    "context=8 (dot_product)": ({"data": 1, "fsdp": 1, "context": 8},
                                {"attention": "dot_product"}),
    "stage=2,context=2,fsdp=2": ({"data": 1, "fsdp": 2, "stage": 2, "context": 2},
                                 {"num_layers": 4, "pipeline_microbatches": 2}),
    # a block group (dense then MoE, modules/block_group.py): the stages split its repeats
    "stage=2,data=4 (dense, moe group)": ({"data": 4, "fsdp": 1, "stage": 2},
                                          {"num_layers": 8, "group": ["dense", "moe"]}),
    # 9 layers of (MoE, dense): its 4 repeats split by the stages, then its remainder (an MoE
    # layer) after them, over the whole mesh
    "stage=2,data=4 (group, remainder)": ({"data": 4, "fsdp": 1, "stage": 2},
                                          {"num_layers": 9, "group": ["moe", "dense"]}),
}


def group_model(pattern):
  """The `test` LLaMA whose layers alternate a dense MLP and a dropless MoE (in the order of
  `pattern`) without its load-balancing loss (taken per microbatch, it would move the gradients
  a little); an odd depth ends with the pattern's first layer (the group's remainder)."""
  from core.registry import registry  # pylint: disable=import-outside-toplevel
  node = llama.model_node("test")
  moe = node.block.copy_and_resolve_references()
  moe.ffn = registry("ffn").node("moe", num_experts=4, hidden_dim=32, capacity_factor=0.0,
                                 aux_loss_coef=0.0)
  node.block = registry("block").node("group", pattern=tuple(pattern), remainder="first",
                                      blocks={"dense": node.block, "moe": moe})
  return node


def run_config(mesh: dict, *, attention="xla", num_layers=None, remat="none",
               pipeline_microbatches=0, max_steps=STEPS, group=False):
  cfg = lm_config(group_model(group) if group else llama.model_node("test"), max_steps=max_steps,
                  learning_rate=1e-2, batch_size=8, seq_len=32, warmup_steps=2,
                  data_kind="stdlib")
  cfg.optimizer.schedule.decay_steps = 9  # the same schedule whatever max_steps
  if not group:
    cfg.model.block.attention.implementation = attention
    cfg.model.block.attention.query_chunk_size = 4
  cfg.model.num_layers = num_layers or cfg.model.num_layers
  cfg.model.remat = remat
  cfg.model.pipeline_microbatches = pipeline_microbatches
  cfg.trainer.log_every = 1
  cfg.eval.batch_size = 8
  cfg.eval.num_batches = 1
  for axis, n in mesh.items():
    cfg.mesh[axis] = n
  return config_lib.parse(cfg)


def build(mesh: dict, devices, **model):
  return experiment.build(run_config(mesh, **model), meshes.lookup("cpu"), devices=devices)


def copy(tree):
  return jax.tree.map(lambda x: x.copy(), tree)


def train(exp, state):
  state = jax.device_put(copy(state), exp.state_shardings)
  data = exp.source.train_iterator(process_index=0, process_count=1)
  losses = []
  with exp.context():
    compiled = exp.step_fn.lower(state, exp.global_batch(next(data))).compile()
    data = exp.source.train_iterator(process_index=0, process_count=1)
    for _ in range(STEPS):
      state, metrics = compiled(state, exp.global_batch(next(data)))
      losses.append(float(metrics["loss"]))
  return losses, compiled


def grads(exp, params, batch):
  """float32 gradients of the mean token loss on `batch`, as numpy."""
  def mean_loss(params, batch):
    total, stats = loss_sums(params, batch, model=exp.model, compute_dtype=jnp.float32)
    return total / stats["weight_sum"]
  fn = jax.jit(jax.grad(mean_loss), in_shardings=(exp.state_shardings.params, exp.batch_sharding),
               out_shardings=exp.state_shardings.params)
  params = jax.device_put(copy(params), exp.state_shardings.params)
  batch = exp.global_batch(batch)
  with exp.context():
    out = fn(params, batch)
  return jax.tree.map(np.asarray, out)


def router_means(exp, params, batch) -> dict:
  """The MoE layers' router statistics on `batch`, means over layers (trainer/step.py:
  sown_means, as the step reports them)."""
  def means(params, batch):
    _, state = exp.model.apply({"params": params}, batch["inputs"], batch["positions"],
                               batch["segment_ids"], mutable=["metrics"])
    return sown_means(state["metrics"])
  fn = jax.jit(means, in_shardings=(exp.state_shardings.params, exp.batch_sharding))
  params = jax.device_put(copy(params), exp.state_shardings.params)
  with exp.context():
    return {k: float(v) for k, v in fn(params, exp.global_batch(batch)).items()}


def device_bytes(tree, device) -> int:
  return sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards
             if s.device == device)


def equality(devices) -> dict:
  out = {"losses": {}, "grads": {}, "router": {}, "temp_bytes": {}, "layer_bytes": {}, "one": {}}
  refs = {}
  for name, (mesh, model) in {**CASES, **GRAD_ONLY}.items():
    # One device's run of the same model; the attention implementation and remat policy change
    # only rounding, so every case is held to the one-device `xla` run without remat.
    key = json.dumps({k: model[k] for k in ("num_layers", "group") if k in model})
    if key not in refs:
      one = build(ONE, devices[:1], **json.loads(key))
      state = one.init()
      batch = next(one.source.train_iterator(process_index=0, process_count=1))
      losses, compiled = train(one, state)
      refs[key] = dict(one=one, state=state, batch=batch, losses=losses, compiled=compiled,
                       grads=grads(one, state.params, batch))
      out["one"][key] = losses
    ref = refs[key]
    exp = build(mesh, devices, **model)
    if name in CASES:
      losses, compiled = train(exp, ref["state"])
      out["losses"][name] = {"mesh": losses, "one": ref["losses"]}
      out["temp_bytes"][name] = {"mesh": compiled.memory_analysis().temp_size_in_bytes,
                                 "one": ref["compiled"].memory_analysis().temp_size_in_bytes}
      text = compiled.as_text()
      out["temp_bytes"][name].update(collective_permutes=text.count("collective-permute("),
                                     all_gathers=text.count("all-gather("))
    got = grads(exp, ref["state"].params, ref["batch"])
    diffs = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), got,
                                         ref["grads"]))
    scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(ref["grads"]))
    out["grads"][name] = {"max_abs_diff": max(diffs), "max_abs": scale}
    if model.get("group"):
      out["router"][name] = {"mesh": router_means(exp, ref["state"].params, ref["batch"]),
                             "one": router_means(ref["one"], ref["state"].params,
                                                 ref["batch"])}
    if "stage" in mesh:
      placed = jax.device_put(copy(ref["state"].params), exp.state_shardings.params)
      layers = placed["layers"]
      out["layer_bytes"][name] = {
          "total": sum(x.nbytes for x in jax.tree.leaves(layers)),
          "per_device": [device_bytes(layers, d) for d in devices], "stages": mesh["stage"],
          "fsdp": mesh["fsdp"]}
  return out


def restore_across_meshes(devices, tmp: pathlib.Path) -> dict:
  """Steps 1-2 on stage=2,fsdp=4 (checkpointed), 3-4 restored on fsdp=8 (no stages), 5-6
  restored on stage=4,data=2: the losses, for the one-device run of the same model."""
  got = {}
  for mesh, steps in (({"data": 1, "fsdp": 4, "stage": 2}, 2), ({"data": 1, "fsdp": 8}, 4),
                      ({"data": 2, "fsdp": 1, "stage": 4}, 6)):
    exp = build(mesh, devices, max_steps=steps, num_layers=4)
    result = loop.train(exp, checkpoint_dir=tmp / "moved")
    got.update({r["step"]: r["loss"] for r in result.records if "loss" in r})
  return got


def plans(devices) -> dict:
  """`axtrain plan`'s report of the pipelined and context-parallel `test` model on gpu-h100-8
  (8 CPU stand-ins), and the same without stages."""
  from planner import plan as plan_lib, plan_report  # pylint: disable=import-outside-toplevel
  entry = meshes.lookup("gpu-h100-8")
  out = {}
  for name, mesh in (("stage=2,context=2,fsdp=2", {"stage": 2, "context": 2, "fsdp": 2}),
                     ("fsdp=8", {"fsdp": 8})):
    run = run_config({"data": 1, **mesh}, num_layers=4, pipeline_microbatches=4)
    p = plan_lib.plan(run, entry, config_name="test", devices=devices, with_eval=False)
    out[name] = {"text": plan_report.text(p, timings=False), "json": json.loads(json.dumps(
        plan_report.to_json(p), default=str))}
  return out


BAD = {
    "context does not divide length": (
        ["--config=configs/llama.py:size=test", "--config.mesh.data=1", "--config.mesh.context=8",
         "--config.data.seq_len=40"], "must be a multiple of 16"),
    "splash block does not fit": (
        ["--config=configs/llama.py:size=test", "--config.mesh.data=4", "--config.mesh.context=2",
         "--config.data.seq_len=256", "--config.model.block.attention.implementation=splash"],
        "(2 x 2) = 64 positions, which must be a multiple of 128"),
    "stage without scanned layers": (
        ["--config=configs/llama.py:size=test", "--config.mesh.data=4", "--config.mesh.stage=2"],
        "model.scan_layers is False"),
    "stage does not divide layers": (
        ["--config=configs/llama.py:size=test", "--config.mesh.data=2", "--config.mesh.stage=4",
         "--config.model.scan_layers=true"], "must divide model.num_layers=2"),
    "microbatches do not divide the batch": (
        ["--config=configs/llama.py:size=test", "--config.mesh.data=4", "--config.mesh.stage=2",
         "--config.model.scan_layers=true", "--config.model.pipeline_microbatches=3"],
        "into 3 microbatches"),
    "negative microbatches": (
        ["--config=configs/llama.py:size=test", "--config.model.pipeline_microbatches=-1"],
        "model.pipeline_microbatches must be >= 0"),
    "stage and context too many devices": (
        ["--config=configs/llama.py:size=test", "--config.mesh.data=1", "--config.mesh.stage=4",
         "--config.mesh.context=4"], "needs 16 devices but 8 are available"),
}


def bad_input(tmp: pathlib.Path) -> dict:
  out = {}
  for i, (name, (args, message)) in enumerate(BAD.items()):
    run_dir = tmp / f"bad{i}"
    result = run_captured([*args, f"--output_dir={run_dir}", "--noprogress"])
    out[name] = dict(result, message=message, left=run_dir.exists())
  return out


def splash_context(devices) -> dict:
  """The splash kernel under context=2 (x data=4) against `xla` attention on one device: value
  and gradients of [4, 512] packed rows, 4 query heads over 2 kv heads (Pallas interpret mode)."""
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  from modules import context  # pylint: disable=import-outside-toplevel
  from modules.attention import AttentionConfig  # pylint: disable=import-outside-toplevel
  from modules.masks import Mask  # pylint: disable=import-outside-toplevel
  from modules.attn_splash import splash_attention  # pylint: disable=import-outside-toplevel
  from modules.attn_xla import xla_attention  # pylint: disable=import-outside-toplevel
  from trainer import sharding  # pylint: disable=import-outside-toplevel
  length = 512
  q, k, v = (jax.random.normal(key, (4, length, heads, 64))
             for key, heads in zip(jax.random.split(jax.random.key(0), 3), (4, 2, 2)))
  lengths = jnp.array([[100, 300, 112], [500, 6, 6], [128, 128, 256], [1, 255, 256]])
  seg = jax.vmap(lambda n: jnp.repeat(jnp.arange(3), n, total_repeat_length=length))(lengths)

  def loss(fn):
    return jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v))),
                                      argnums=(0, 1, 2)))
  cfg = AttentionConfig(num_heads=4, position=None, splash_block_size=128)
  want = loss(lambda q, k, v: xla_attention(q, k, v, Mask(segment_ids_BxL=seg), cfg))(q, k, v)

  def split(q, k, v):
    z = lambda a: context.zigzag(a, 2)
    return context.unzigzag(
        splash_attention(z(q), z(k), z(v), Mask(segment_ids_BxL=z(seg)), cfg), 2)
  mesh = sharding.make_mesh({"data": 4, "stage": 1, "fsdp": 1, "context": 2, "model": 1},
                            devices)
  with jax.set_mesh(mesh), nn.logical_axis_rules(meshes.DEFAULT_RULES):
    got = loss(split)(q, k, v)
  diff = lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
  return {"value": diff(got[0], want[0]), "value_scale": float(abs(want[0])),
          "grads": [diff(a, b) for a, b in zip(got[1], want[1])],
          "grad_scale": max(float(np.max(np.abs(g))) for g in want[1])}


def main() -> None:
  devices = jax.devices()
  if sys.argv[1] == "--splash":
    json.dump(splash_context(devices), sys.stdout)
    return
  tmp = pathlib.Path(sys.argv[1])
  out = {"device_count": len(devices)}
  for name, fn in (("equality", lambda: equality(devices)),
                   ("restore", lambda: restore_across_meshes(devices, tmp)),
                   ("bad", lambda: bad_input(tmp)), ("plans", lambda: plans(devices))):
    start = time.process_time()
    out[name] = fn()
    print(f"{name}: {time.process_time() - start:.1f} s of CPU", file=sys.stderr)
  json.dump(out, sys.stdout)


if __name__ == "__main__":
  main()
