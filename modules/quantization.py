"""Quantized training (the `quantization` registry): the decoder layers' dense projections in
int8 or fp8, forward and backward, through Qwix's quantized-training provider (google/qwix,
`QtProvider`), as MaxText wires it (`maxtext/layers/quantizations.py`).

The model's node holds it (`model.quantization`), and the model's builder applies it to the
whole model (`modules/decoder.py`), so no layer sees it: Qwix intercepts the `jnp.einsum` and
`lax.dot_general` calls made inside the model's `__call__` and, under a rule, quantizes them.

What is quantized: every dot inside a decoder layer's block (module path `layers/block/...`,
`layers_<i>/block/...`, a group's remainder `layers_remainder/block/...`) that multiplies by a
parameter of the module making it: attention q/k/v/o, the MLP's gate/up/down, and MoE's router
and experts where they are einsums. Not quantized, as in MaxText (its rule matches
`decoder/.*layers.*`): the embedding, the LM head (outside the layers), and attention's own
products (scores and values: no parameter among the operands).

How: the inputs of each such dot are quantized per channel with absmax scales (dynamic range:
computed from the values of this step), the dot runs on the quantized values, and the output is
scaled back; in the backward pass the incoming gradient is quantized too (`bwd_qtype`), so both
gradient dots run quantized. The parameters stay float32 master weights (the optimizer updates
them; checkpoints and Hugging Face export hold them unchanged).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from core.registry import ConfigError, Registry

QUANTIZATION = Registry("quantization")

# The decoder layers' blocks (scanned: "layers/block/..."; unrolled: "layers_3/block/...";
# a block group's remainder: "layers_remainder/block/..."; a pipeline stage applies the block on
# its own: "block/...").
LAYER_PATHS = r"(layers(_\d+|_remainder)?/)?block/.*"


@dataclasses.dataclass(frozen=True, kw_only=True)
class NoQuantizationConfig:
  kind: str = "none"  # bf16 / float32 dots as the compute dtype gives them

  def check(self):
    pass


@dataclasses.dataclass(frozen=True, kw_only=True)
class _QuantizedConfig:
  # Also quantize the incoming gradient of each dot in the backward pass (both gradient dots run
  # quantized), as MaxText's int8 and `fp8_full` rules do; False: backward in the compute dtype.
  backward: bool = True

  def check(self):
    pass


@dataclasses.dataclass(frozen=True, kw_only=True)
class Int8Config(_QuantizedConfig):
  kind: str = "int8"  # activations, weights and gradients in int8


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fp8Config(_QuantizedConfig):
  # Forward: activations and weights in float8_e4m3fn; backward: the incoming gradient in
  # float8_e5m2 (more range, less precision).
  kind: str = "fp8"


# The quantized types of each kind: (forward, backward).
QTYPES = {"int8": (jnp.int8, jnp.int8), "fp8": (jnp.float8_e4m3fn, jnp.float8_e5m2)}


# Qwix is imported where a quantized kind is built, not with this module: it imports flax.nnx
# (and IPython where installed), 1.4 s of every start on the v5e host (`python -X importtime`,
# 2026-12-08), and most runs quantize nothing.
@functools.cache
def _provider_class():
  """ParameterDotsProvider: Qwix's quantized training on the dots that multiply by a parameter;
  other dots (attention's scores and values, both operands activations) pass through
  unquantized."""
  import qwix  # pylint: disable=import-outside-toplevel
  from qwix._src.utils import flax_util  # pylint: disable=import-outside-toplevel

  def has_parameter(operands) -> bool:
    try:
      return any(flax_util.find_param(x) is not None for x in operands)
    except ValueError:  # Qwix's shape heuristic found several same-shaped parameters
      return False

  class ParameterDotsProvider(qwix.QtProvider):
    """Qwix's provider, quantizing only the dots that multiply by a parameter."""

    def einsum(self, einsum_str, *operands, **kwargs):
      if len(operands) == 2 and has_parameter(operands):
        return super().einsum(einsum_str, *operands, **kwargs)
      return jnp.einsum(einsum_str, *operands, **kwargs)

    def dot_general(self, lhs, rhs, dimension_numbers, *args, **kwargs):
      if has_parameter((lhs, rhs)):
        return super().dot_general(lhs, rhs, dimension_numbers, *args, **kwargs)
      return jax.lax.dot_general(lhs, rhs, dimension_numbers, *args, **kwargs)

  return ParameterDotsProvider


def rules(cfg) -> list:
  """The Qwix rules (`qwix.QtRule`) of a quantization node (none: no rule)."""
  if cfg.kind not in QTYPES:
    return []
  import qwix  # pylint: disable=import-outside-toplevel
  forward, backward = QTYPES[cfg.kind]
  return [qwix.QtRule(module_path=LAYER_PATHS, weight_qtype=forward, act_qtype=forward,
                      bwd_qtype=backward if cfg.backward else None,
                      op_names=("einsum", "dot_general"))]


def quantizer(cfg) -> Callable[[Any], Any]:
  """model -> the model with its `__call__` under Qwix's quantized training (or unchanged)."""
  found = rules(cfg)
  if not found:
    return lambda model: model
  import qwix  # pylint: disable=import-outside-toplevel
  return lambda model: qwix.quantize_model(model, _provider_class()(found))


for _kind, _cls in (("none", NoQuantizationConfig), ("int8", Int8Config), ("fp8", Fp8Config)):
  QUANTIZATION.register(_kind, _cls)(quantizer)


def check_hardware(cfg, hardware, *, mesh: str) -> None:
  """Refuses fp8 on a chip without fp8 matmul units, where XLA would upcast each dot and run
  slower than bf16: a TPU (before v7 its MXUs multiply bf16 and int8) or a GPU row without an
  fp8 peak (A100). int8 dots run on every TPU, GPU and CPU; fp8 on a CPU is emulated (tests).
  `mesh`: the mesh entry's name, for the message."""
  if cfg.kind != "fp8" or hardware.platform not in ("tpu", "gpu") or hardware.peak_fp8_flops:
    return
  raise ConfigError(f"model.quantization.kind=fp8: the chips of mesh {mesh} have no fp8 matmul "
                    "units (XLA would upcast each dot); use int8, or fp8 on H100 and later")


def emulation_note(cfg, *, platform: str) -> str | None:
  """What to say when fp8 trains on a CPU, which has no fp8 units: XLA emulates its dots
  (check_hardware lets it, for tests)."""
  if cfg.kind != "fp8" or platform != "cpu":
    return None
  return ("model.quantization.kind=fp8 on cpu: the CPU has no fp8 matmul units, so XLA emulates "
          "the fp8 dots (fp8's rounding, at float speed or slower: for tests); they run in fp8 "
          "on H100 and later")
