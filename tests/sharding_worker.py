"""Run by tests/test_sharding.py in a subprocess with 8 fake CPU devices; prints one JSON object.

    python tests/sharding_worker.py CLI_RUN_DIR

Trains the `test`-size LLaMA on one device and on several meshes through the
same recipe the CLI uses (trainer.experiment.build), and reports losses, the
bytes each device holds, and the compiler's memory analysis. Then runs the CLI
itself (launcher.main.main) with --mesh=cpu into CLI_RUN_DIR, in this process
for its 8 devices.
"""

from __future__ import annotations

import json
import os
import sys
import time

from tests.cli_batch import run_captured
from tests.conftest import xla_flags

# Fake devices must exist before jax is imported; the tests' XLA flags make the CPU compiles
# several times faster, and every run here uses the same flags.
os.environ["XLA_FLAGS"] = xla_flags(8)
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402

from configs.base import lm_config  # noqa: E402
from modules import llama  # noqa: E402
from modules.hf_maps import fused_like  # noqa: E402
from trainer import config as config_lib, experiment, meshes  # noqa: E402

STEPS = 10
MESHES = {"data=8": dict(data=8, fsdp=1, model=1),
          "fsdp=8": dict(data=1, fsdp=8, model=1),
          "fsdp=4,model=2": dict(data=1, fsdp=4, model=2),
          "data=2,fsdp=2,model=2": dict(data=2, fsdp=2, model=2)}


def run_config(mesh: dict, *, remat="none", accum=1, fused=False):
  cfg = lm_config(llama.model_node("test"), max_steps=STEPS, learning_rate=1e-2, batch_size=8,
                  seq_len=32, warmup_steps=2, data_kind="stdlib")
  cfg.model.remat = remat
  cfg.model.block.attention.fused_qkv = cfg.model.block.ffn.fused_gate_up = fused
  cfg.trainer.grad_accum_steps = accum
  cfg.eval.batch_size = 8
  for axis, n in mesh.items():
    cfg.mesh[axis] = n
  return config_lib.parse(cfg)


def build(mesh: dict, devices, **kw):
  return experiment.build(run_config(mesh, **kw), meshes.lookup("cpu"), devices=devices)


def batches(exp):
  data = exp.source.train_iterator(process_index=0, process_count=1)
  return [exp.global_batch(next(data)) for _ in range(STEPS)]


def train(exp, state=None, steps=STEPS):
  t = time.process_time()
  try:
    return _train(exp, state, steps)
  finally:
    print(f"{dict(exp.mesh.shape)} {time.process_time() - t:.1f}s", file=sys.stderr)


def _train(exp, state=None, steps=STEPS):
  """(losses, compiled step) for `steps` steps from a fresh init (or a copy of `state`)."""
  state = exp.init() if state is None else jax.tree.map(lambda x: x.copy(), state)
  with exp.context():
    data = batches(exp)
    compiled = exp.step_fn.lower(state, data[0]).compile()
    losses = []
    for batch in data[:steps]:
      state, metrics = compiled(state, batch)
      losses.append(float(metrics["loss"]))
  return losses, compiled


def nbytes(tree) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def device_bytes(tree, device) -> int:
  """Bytes of `tree`'s shards that live on `device`."""
  return sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards
             if s.device == device)


def fused_projections(mesh: dict, devices, one_state) -> dict:
  """The one-device run's start with its projections fused (the same weights: hf_maps.
  fused_like; a fresh optimizer state either way), trained on `mesh` with fused_qkv and
  fused_gate_up: its losses, the fused kernels' shardings and one device's share."""
  exp = build(mesh, devices, fused=True)
  state = exp.init()
  params = fused_like(jax.device_get(one_state.params), jax.device_get(state.params))
  state = state.replace(params=jax.device_put(params, exp.state_shardings.params))
  losses = train(exp, state=state)[0]
  block = exp.state_shardings.params["layers"]["block"]
  held = state.params["layers"]["block"]["attention"]["qkv"].addressable_shards[0].data.shape
  return {"losses": losses, "qkv_spec": [list(a) if isinstance(a, tuple) else a
                                         for a in block["attention"]["qkv"].spec],
          "wi_wu_spec": [list(a) if isinstance(a, tuple) else a
                         for a in block["ffn"]["wi_wu"].spec],
          "qkv_shape": list(state.params["layers"]["block"]["attention"]["qkv"].shape),
          "qkv_shard_shape": list(held)}


def main() -> None:
  devices = jax.devices()
  out = {"device_count": len(devices)}
  one = build({"data": 1, "fsdp": 1, "model": 1}, devices[:1])
  one_state = one.init()
  losses, one_step = train(one, state=one_state)
  out["losses"] = {"1": losses}
  for name, mesh in MESHES.items():
    exp = build(mesh, devices)
    if name in ("data=8", "fsdp=4,model=2"):  # init under a mesh: checked by the other two
      out["losses"][name] = train(exp, state=jax.device_put(one_state, exp.state_shardings))[0]
      if name == "fsdp=4,model=2":
        out["fused"] = fused_projections(mesh, devices, one_state)
      continue
    if name != "fsdp=8":
      out["losses"][name] = train(exp)[0]
      continue
    with exp.context():
      init = exp.init_fn.lower(jax.random.key(0)).compile()
      state = init(jax.random.key(0))
    out["losses"][name], step = train(exp, state=state)
    with exp.context():
      lowered = exp.step_fn.lower(state, batches(exp)[0]).as_text()
    init_mem, step_mem = init.memory_analysis(), step.memory_analysis()
    out["fsdp8"] = {
        "params_bytes": nbytes(state.params), "opt_state_bytes": nbytes(state.opt_state),
        "state_bytes": nbytes(state), "batch_bytes": nbytes(batches(exp)[0]),
        "per_device": [{"params": device_bytes(state.params, d),
                        "opt_state": device_bytes(state.opt_state, d)} for d in devices],
        "step_argument_bytes": step_mem.argument_size_in_bytes,
        "init_output_bytes": init_mem.output_size_in_bytes,
        "init_temp_bytes": init_mem.temp_size_in_bytes,
        "mesh": dict(exp.mesh.shape),
        # Activation constraints in the lowered step (Shardy or GSPMD spelling).
        "activation_constraints": lowered.count("sdy.sharding_constraint")
                                  + lowered.count("@Sharding"),
    }

  # Gradient accumulation: 4 microbatches of 2 on a 4-device fsdp=2,model=2 mesh.
  accum = build({"data": 1, "fsdp": 2, "model": 2}, devices[:4], accum=4)
  out["losses"]["accum=4 (fsdp=2,model=2)"] = train(
      accum, state=jax.device_put(one_state, accum.state_shardings))[0]

  # Remat: the one-device run again under other policies, from the same parameters.
  out["remat"] = {"none": {"losses": out["losses"]["1"][:3],
                           "temp_bytes": one_step.memory_analysis().temp_size_in_bytes}}
  for policy in ("full", "qkv_proj,attn_out"):
    losses, compiled = train(build({"data": 1, "fsdp": 1, "model": 1}, devices[:1],
                                   remat=policy), state=one_state, steps=3)
    out["remat"][policy] = {"losses": losses,
                            "temp_bytes": compiled.memory_analysis().temp_size_in_bytes}

  out["cli"] = run_captured([
      "--config=configs/llama.py:size=test", "--mesh=cpu", "--config.trainer.max_steps=3",
      "--config.optimizer.schedule.warmup_steps=0", "--config.data.seq_len=32",
      "--config.data.batch_size=8", "--config.eval.batch_size=8", "--config.eval.num_batches=1",
      f"--output_dir={sys.argv[1]}", "--noprogress"])
  json.dump(out, sys.stdout)


if __name__ == "__main__":
  main()
