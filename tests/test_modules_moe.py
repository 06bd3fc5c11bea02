"""Mixture-of-experts: equals the dense MLP with one expert; balancing loss; capacity."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import modules  # noqa: F401  (registers the layer library)
from modules.mlp import FFN
from core.registry import ConfigError, registry
from tests.test_modules import random_params

DIM = 16


def _build(kind, **values):
  return FFN.build(FFN.parse(registry("ffn").node(kind, **values), "ffn"), dim=DIM)


def _init(module, x, seed, std=0.1):
  return random_params(module, x, seed=seed, std=std)


def _x(seed=0, shape=(2, 8, DIM)):
  return jax.random.normal(jax.random.key(seed), shape)


@pytest.mark.parametrize("capacity_factor,gated,activation",
                         [(1.0, True, "silu"), (0.0, False, "gelu_tanh")])
def test_one_expert_top1_equals_dense_mlp(capacity_factor, gated, activation):
  moe = _build("moe", num_experts=1, top_k=1, hidden_dim=32, gated=gated, activation=activation,
               capacity_factor=capacity_factor)
  mlp = _build("mlp", hidden_dim=32, gated=gated, activation=activation)
  x = _x()
  p = _init(moe, x, 1)
  dense = {name: p[name][0] for name in ("wi", "wu", "wo") if name in p}
  np.testing.assert_allclose(jax.jit(moe.apply)({"params": p}, x),
                             jax.jit(mlp.apply)({"params": dense}, x),
                             rtol=1e-6, atol=1e-6)


def test_dropless_equals_capacity_dispatch_when_nothing_is_dropped():
  x = _x()
  full = _build("moe", num_experts=4, top_k=2, hidden_dim=32, capacity_factor=2.0)  # C = L
  dropless = _build("moe", num_experts=4, top_k=2, hidden_dim=32, capacity_factor=0.0)
  p = _init(full, x, 1)
  np.testing.assert_allclose(jax.jit(full.apply)({"params": p}, x),
                             jax.jit(dropless.apply)({"params": p}, x),
                             rtol=1e-5, atol=1e-6)


def test_capacity_drops_tokens_past_it():
  moe = _build("moe", num_experts=2, top_k=1, hidden_dim=32, capacity_factor=0.5)
  x = _x(shape=(1, 16, DIM))
  p = _init(moe, x, 1, std=0.5)
  y = np.asarray(jax.jit(moe.apply)({"params": p}, x))
  served = np.sum(np.any(y != 0, axis=-1))
  assert served == 2 * moe.cfg.capacity(16) == 8  # 2 experts x 4 slots; the rest dropped


def test_load_balancing_loss_positive_and_trains_down():
  # Inputs share a direction and the router starts large, so most tokens pick one expert.
  moe = _build("moe", num_experts=4, top_k=1, hidden_dim=16, aux_loss_coef=1.0)
  x = _x(shape=(4, 16, DIM)) + 2.0
  target = jnp.tanh(x[..., ::-1])
  params = _init(moe, x, 3, std=0.5)

  def loss(p):
    y, state = moe.apply({"params": p}, x, mutable=["losses"])
    aux = sum(jnp.sum(v) for v in jax.tree.leaves(state["losses"]))
    return jnp.mean((y - target) ** 2) + aux, aux

  tx = optax.adam(3e-2)
  opt = tx.init(params)

  @jax.jit
  def step(p, o):
    (_, aux), g = jax.value_and_grad(loss, has_aux=True)(p)
    u, o = tx.update(g, o)
    return optax.apply_updates(p, u), o, aux

  auxes = []
  for _ in range(60):
    params, opt, aux = step(params, opt)
    auxes.append(float(aux))
  assert auxes[0] > 1.5  # imbalanced start (1.0 is perfectly balanced)
  assert all(a > 0 for a in auxes)
  assert auxes[-1] < 0.5 * auxes[0]


def test_moe_params_carry_experts_axis():
  moe = _build("moe", num_experts=4, top_k=2, hidden_dim=32)
  boxed = jax.eval_shape(moe.init, jax.random.key(0), _x())["params"]
  assert boxed["wi"].names == ("experts", "embed", "mlp")
  assert boxed["wo"].names == ("experts", "mlp", "embed")


def test_top_k_above_num_experts_is_a_config_error():
  with pytest.raises(ConfigError, match="top_k 3 must be between 1 and num_experts 2"):
    _build("moe", num_experts=2, top_k=3, hidden_dim=8)


def test_router_metrics_count_choices_and_drops():
  moe = _build("moe", num_experts=2, top_k=1, hidden_dim=32, capacity_factor=0.5)
  x = _x(shape=(1, 16, DIM))
  p = _init(moe, x, 1, std=0.5)
  y, state = jax.jit(lambda p, x: moe.apply({"params": p}, x, mutable=["metrics"]))(p, x)
  got = {name: float(values[0]) for name, values in state["metrics"].items()}
  choice = np.argmax(np.asarray(x[0]) @ np.asarray(p["router"]), axis=-1)  # top-1 by logit
  assert got["moe_tokens_per_expert/0"] == np.mean(choice == 0)
  assert got["moe_tokens_per_expert/1"] == np.mean(choice == 1)
  served = np.sum(np.any(np.asarray(y[0]) != 0, axis=-1))
  assert got["moe_dropped_fraction"] == pytest.approx(1 - served / 16) and served < 16


def test_step_reports_sown_metrics_as_means_over_layers():
  from configs import moe_tiny
  from trainer import config as config_lib, experiment, meshes
  from trainer.step import loss_sums
  cfg = moe_tiny.get_config()
  cfg.model.num_layers, cfg.data.seq_len, cfg.data.batch_size = 2, 16, 2
  cfg.eval.batch_size = 2
  exp = experiment.build(config_lib.parse(cfg), meshes.lookup("cpu"))
  state = exp.init()
  batch = exp.global_batch(next(exp.source.train_iterator(process_index=0, process_count=1)))
  args = (batch["inputs"], batch.get("positions"), batch.get("segment_ids"))
  _, per_layer = jax.jit(lambda p: exp.model.apply({"params": p}, *args, mutable=["metrics"]))(
      state.params)
  sown = per_layer["metrics"]["layers"]["block"]["ffn"]
  metrics = jax.jit(lambda p: loss_sums(p, batch, model=exp.model,
                                        compute_dtype=jnp.float32)[1]["metrics"])(state.params)
  assert sorted(metrics) == sorted(sown) and len(metrics) == 8 + 1  # 8 experts, drops
  for name, (values,) in sown.items():
    assert values.shape == (2,)  # one per scanned layer
    np.testing.assert_allclose(metrics[name], np.mean(values), rtol=1e-6)
  shares = sum(float(metrics[f"moe_tokens_per_expert/{e}"]) for e in range(8))
  assert shares == pytest.approx(1.0)
