"""Run by tests/test_ep_sharding.py in a subprocess with 8 fake CPU devices; prints one JSON object.

    python tests/ep_sharding_worker.py OUTPUT_DIR

Expert parallelism: a 2-layer `moe_tiny` trains 6 steps on one device and on meshes with an
`expert` axis (alone, with FSDP, with FSDP and tensor parallelism), from the same parameters
(drawn with numpy: no init to compile) and batches, through the recipe the CLI uses (trainer.experiment.build); reports the losses,
the gradients of the first batch, the all-to-alls in the compiled step and the experts each
device holds. Vocabulary padding: a narrow GPT-2 with the real 50,257-id vocabulary trains
tensor parallel (model=2) against one device. Then the CLI with an expert axis that does not
divide the experts (launcher.main.main in this process), into OUTPUT_DIR/bad.
"""

from __future__ import annotations

import json
import os
import sys

from tests.cli_batch import run_captured
from tests.conftest import xla_flags

# Fake devices must exist before jax is imported.
os.environ["XLA_FLAGS"] = xla_flags(8)
os.environ["JAX_PLATFORMS"] = "cpu"

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from configs import gpt2 as gpt2_config, moe_tiny  # noqa: E402
from core.registry import ConfigError  # noqa: E402
from trainer import config as config_lib, experiment, meshes  # noqa: E402
from trainer.step import TrainState, loss_sums  # noqa: E402

STEPS = 6
ONE = {"data": 1, "fsdp": 1, "expert": 1, "model": 1}
EP_MESHES = {"expert=8": dict(data=1, fsdp=1, expert=8, model=1),
             "fsdp=2,expert=4": dict(data=1, fsdp=2, expert=4, model=1),
             "fsdp=2,expert=2,model=2": dict(data=1, fsdp=2, expert=2, model=2),
             # expert and context parallel together: each sequence over 4 devices, in the
             # load-balanced layout, whose router queues still fill in token order
             "expert=2,context=4": dict(data=1, fsdp=1, expert=2, context=4, model=1),
             # MoE layers inside two GPipe stages: losses and router metrics as on one device
             # (without the load-balancing loss, a product of batch means that the stages
             # take per microbatch, as gradient accumulation does)
             "stage=2,expert=2": dict(data=2, stage=2, fsdp=1, expert=2, model=1)}
NO_AUX_LOSS = ("stage=2,expert=2",)
WITH_GRADS = ("1", "fsdp=2,expert=4", "fsdp=2,expert=2,model=2",
              "expert=2,context=4")  # each costs a compile


def moe_config(mesh: dict, *, aux_loss_coef: float = 0.01):
  cfg = moe_tiny.get_config()
  cfg.model.num_layers = 2
  cfg.model.block.ffn.aux_loss_coef = aux_loss_coef
  cfg.data.seq_len, cfg.data.batch_size, cfg.eval.batch_size = 32, 8, 8
  cfg.trainer.max_steps, cfg.optimizer.schedule.warmup_steps = STEPS, 2
  for axis, n in mesh.items():
    cfg.mesh[axis] = n
  return config_lib.parse(cfg)


def gpt2_config_of(mesh: dict, *, vocab_multiple: int = 128):
  cfg = gpt2_config.get_config(None)
  cfg.model.dim, cfg.model.num_layers = 64, 2
  cfg.model.block.attention.num_heads, cfg.model.block.ffn.hidden_dim = 4, 256
  cfg.model.vocab_multiple = vocab_multiple
  cfg.data = moe_tiny.get_config().data  # bytes: ids < 256, well inside GPT-2's vocabulary
  cfg.data.seq_len, cfg.data.batch_size, cfg.eval.batch_size = 32, 8, 8
  cfg.trainer.max_steps, cfg.optimizer.schedule.warmup_steps = 3, 1
  for axis, n in mesh.items():
    cfg.mesh[axis] = n
  return config_lib.parse(cfg)


def fresh_state(run, devices) -> TrainState:
  """Parameters drawn with numpy from the abstract shapes (norm scales 1, biases 0) and a fresh
  optimizer state: what init gives, without compiling it."""
  exp = experiment.build(run, meshes.lookup("cpu"), devices=devices)
  rng = np.random.default_rng(0)

  def draw(path, leaf):
    name = jax.tree_util.keystr(path)
    if name.endswith(("['scale']", "_bias']", "['bias']")):
      return np.full(leaf.shape, 1.0 if name.endswith("['scale']") else 0.0, np.float32)
    return rng.normal(0.0, 0.02, leaf.shape).astype(np.float32)

  params = jax.tree_util.tree_map_with_path(draw, nn.meta.unbox(exp.abstract_state.params))
  return TrainState(step=np.zeros((), np.int32), params=params,
                    opt_state=jax.device_get(exp.optimizer.tx.init(params)))


def train(run, devices, state, *, steps: int, with_grads: bool = True) -> dict:
  """Losses of `steps` steps from a copy of `state`, the first batch's gradients, the
  compiled step's all-to-alls, and the expert rows each device holds."""
  exp = experiment.build(run, meshes.lookup("cpu"), devices=devices)
  state = jax.device_put(state, exp.state_shardings)
  data = exp.source.train_iterator(process_index=0, process_count=1)
  batches = [exp.global_batch(next(data)) for _ in range(steps)]
  out = {"mesh": dict(exp.mesh.shape)}
  with exp.context():
    if with_grads:
      def mean_loss(params, batch):
        total, stats = loss_sums(params, batch, model=exp.model, compute_dtype=jnp.float32)
        return total / stats["weight_sum"]
      grads = jax.jit(jax.grad(mean_loss))(state.params, batches[0])
      out["grads"] = [np.asarray(g).tolist() for g in jax.tree.leaves(jax.device_get(grads))]
    compiled = exp.step_fn.lower(state, batches[0]).compile()
    hlo = compiled.as_text()
    out["all_to_alls"], out["all_gathers"] = hlo.count("all-to-all("), hlo.count("all-gather(")
    losses = []
    for batch in batches:
      state, metrics = compiled(state, batch)
      losses.append(float(metrics["loss"]))
  out["losses"] = losses
  out["metrics"] = {k: float(v) for k, v in metrics.items() if k.startswith("moe_")}
  ffn = state.params["layers"]["block"].get("ffn", {})
  if "wi" in ffn:  # [layers, experts, embed, mlp]: the experts (rows of dim 1) per device
    out["experts_per_device"] = sorted({s.data.shape[1] for s in ffn["wi"].addressable_shards})
  return out


def main() -> None:
  devices = jax.devices()
  out = {"device_count": len(devices)}

  state = fresh_state(moe_config(ONE), devices[:1])
  runs = {"1": train(moe_config(ONE), devices[:1], state, steps=STEPS)}
  runs["1 (no aux loss)"] = train(moe_config(ONE, aux_loss_coef=0.0), devices[:1], state,
                                  steps=STEPS, with_grads=False)
  for mesh_name, mesh in EP_MESHES.items():
    aux = 0.0 if mesh_name in NO_AUX_LOSS else 0.01
    runs[mesh_name] = train(moe_config(mesh, aux_loss_coef=aux), devices, state, steps=STEPS,
                            with_grads=mesh_name in WITH_GRADS)
  out["capacity"] = runs

  gpt2_one = gpt2_config_of(ONE)
  state = fresh_state(gpt2_one, devices[:1])
  tp = dict(data=1, fsdp=4, expert=1, model=2)
  out["gpt2"] = {"1": train(gpt2_one, devices[:1], state, steps=3, with_grads=False),
                 "fsdp=4,model=2": train(gpt2_config_of(tp), devices, state, steps=3,
                                         with_grads=False),
                 "embedding_shape": list(state.params["embedding"]["embedding"].shape)}
  try:
    experiment.build(gpt2_config_of(tp, vocab_multiple=1), meshes.lookup("cpu"), devices=devices)
    out["gpt2"]["unpadded_error"] = None
  except ConfigError as e:
    out["gpt2"]["unpadded_error"] = str(e)

  out["bad_expert_axis"] = run_captured([
      "--config=configs/moe_tiny.py", "--config.model.block.ffn.num_experts=6",
      "--config.mesh.data=1", "--config.mesh.expert=8", f"--output_dir={sys.argv[1]}/bad",
      "--noprogress"])
  json.dump(out, sys.stdout)


if __name__ == "__main__":
  main()
