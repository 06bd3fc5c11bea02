"""How far each attention implementation may be from `xla` on a TPU chip, and the script that
measures it there.

    bash .chip/on_chip.sh python3 -m tests.tpu_tolerances      # on the chip: prints JSON

measures, on whatever JAX runs on, each implementation against `xla` (modules/attn_xla.py):
`splash_kernel`, the splash function on tests/test_modules.py's case (256 tokens, blocks of 128;
the Pallas kernel, native on a TPU), `pallas_hd64_kernel` and `pallas_hd64_padded_kernel`,
ours in each form of its products on tests/test_attn_pallas_hd64.py's case (512 tokens, blocks
of 256 by 128, a window), and every other implementation through the attention layer on tests/test_attention_impls.py's case; plain and packed rows; the value (a scalar loss of the
output) and its gradients; at JAX's default matmul precision (on a TPU, a float32 matmul is one
bfloat16 pass) and at `highest`.

An error is |got - want| / |want| for the value, and for the gradients the largest over their
arrays of max|got - want| / max|want|: a difference on the array's own scale, which elements
near zero cannot inflate. The constants below bound groups of these errors (`group` names the
one for an error); the script prints each group's largest error beside its constant, and the
value `suggested` from it.
tests/test_tpu_attention.py holds the chip's errors to them, and tests/test_modules.py and
tests/test_attention_impls.py use the `highest` ones when they run on a TPU.

A constant is measured when it is set from the chip's own largest error (the figure in its
comment): twice it, rounded up to two digits (`suggested`), so that a compiler update may move
the errors a little. Before the first chip run the constants were the rounding bound `eps * sqrt(REDUCTION)`
(BF16_BOUND, F32_BOUND), kept below for what they say about the measured ones. (On CPU, where every matmul is float32, the script
measures at most 6.1e-7, splash in interpret mode included: 2026-12-05, jax 0.10.2.)
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import re

import jax
import numpy as np

BF16_EPS = 2.0 ** -7  # jnp.finfo(jnp.bfloat16).eps: bfloat16 keeps 8 significant bits
F32_EPS = 2.0 ** -23  # jnp.finfo(jnp.float32).eps
# The longest sum in the measured cases: 256 keys per query in the kernel's case, and the
# 2 x 128 tokens that a projection's gradient sums over in the layer's.
REDUCTION = 256
# The rounding error of a sum of REDUCTION products of random sign, each rounded to eps, grows as
# eps * sqrt(REDUCTION) (Higham and Mary's probabilistic bound): 0.125 where a matmul takes
# bfloat16 passes, 1.9e-6 where it is float32.
BF16_BOUND = BF16_EPS * math.sqrt(REDUCTION)
F32_BOUND = F32_EPS * math.sqrt(REDUCTION)

# Measured on one TPU v5e chip (`python3 -m tests.tpu_tolerances` through on_chip.sh, 2026-12-05,
# jax 0.10.2, libtpu 0.0.42.1, splash native): each constant is twice the chip's largest error
# of its group, rounded up to two digits (the script's `suggested`); the script's whole output is
# tests/testdata/tpu_tolerances_v5e.json.
# splash: the Pallas kernel computes its matmuls itself, at a precision that JAX's default
# precision does not set, so it is off xla by more than float32 rounding even at `highest`.
SPLASH_VALUE_HIGHEST = 4e-07  # measured 2e-07
SPLASH_GRAD_HIGHEST = 0.00011  # measured 5.5e-05
SPLASH_VALUE_DEFAULT = 0.00018  # measured 8.6e-05
SPLASH_GRAD_DEFAULT = 0.012  # measured 0.0057
# pallas_hd64 (modules/attn_pallas_hd64.py): a Pallas kernel like splash, that computes its
# matmuls itself. Not yet run on a chip: splash's constants until the lane measures its own
# (it prints this group's largest errors and the constants suggested from them).
PALLAS_HD64_VALUE_HIGHEST = SPLASH_VALUE_HIGHEST
PALLAS_HD64_GRAD_HIGHEST = SPLASH_GRAD_HIGHEST
PALLAS_HD64_VALUE_DEFAULT = SPLASH_VALUE_DEFAULT
PALLAS_HD64_GRAD_DEFAULT = SPLASH_GRAD_DEFAULT
# The implementations that XLA compiles (dot_product, chunked): xla's matmuls, split or fused
# differently; float32 at `highest`, one bfloat16 pass at the default.
XLA_VALUE_HIGHEST = 2e-07  # measured 9.9e-08
XLA_GRAD_HIGHEST = 3.7e-07  # measured 1.8e-07
XLA_VALUE_DEFAULT = 0.0022  # measured 0.0011
XLA_GRAD_DEFAULT = 0.01  # measured 0.005

TOLERANCES = {name: value for name, value in globals().items()
              if re.fullmatch(r"(SPLASH|PALLAS_HD64|XLA)_(VALUE|GRAD)_(HIGHEST|DEFAULT)", name)}
# The Pallas kernels, each with its own constants (a case whose name starts with the kernel's);
# the other implementations are XLA's.
KERNELS = ("splash", "pallas_hd64")
# The kernels' own cases (`<case>/<rows>/...`), each measured by a function of `packed` in
# tests/test_modules.py or tests/test_attn_pallas_hd64.py.
KERNEL_CASES = ("splash_kernel", "pallas_hd64_kernel", "pallas_hd64_padded_kernel")
PRECISIONS = ("default", "highest")
ROWS = ("plain", "packed")


def on_tpu() -> bool:
  """Whether this process computes on a TPU (a test in the pytest process, on the chip)."""
  return jax.default_backend() == "tpu"


def family(case: str) -> str:
  """The constants of a case (an implementation's name, or a kernel's `<name>_kernel`)."""
  return next((k.upper() for k in KERNELS if case.startswith(k)), "XLA")


def group(key: str) -> str:
  """The constant that bounds the error `key` (`case/rows/value|grad/precision`)."""
  case, _, what, precision = key.split("/")
  return f"{family(case)}_{what.upper()}_{precision.upper()}"


def keys() -> list[str]:
  """Every error the script measures: the kernels' own cases, then each implementation's through
  the layer (packed rows where it declares them), at both precisions."""
  from modules.attn_registry import IMPLEMENTATIONS, REFERENCE  # pylint: disable=import-outside-toplevel
  cases = [(case, True) for case in KERNEL_CASES] + [(name, IMPLEMENTATIONS.get(name).supports.segments)
                                       for name in IMPLEMENTATIONS.names() if name != REFERENCE]
  return [f"{case}/{rows}/{what}/{precision}" for case, segments in cases
          for rows in (ROWS if segments else ROWS[:1]) for what in ("value", "grad")
          for precision in PRECISIONS]


def errors(got, want) -> dict:
  """{"value": ..., "grad": ...} errors (module docstring) and "value_abs", "grad_abs", the
  largest absolute differences, of two (loss, gradients) results of jax.value_and_grad."""
  value_abs = float(abs(np.float64(got[0]) - np.float64(want[0])))
  pairs = [(np.asarray(a, np.float64), np.asarray(b, np.float64))
           for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1]), strict=True)]
  grad_abs = [float(np.max(np.abs(a - b))) for a, b in pairs]
  return {"value": value_abs / abs(float(want[0])), "value_abs": value_abs,
          "grad": max(d / float(np.max(np.abs(b))) for d, (_, b) in zip(grad_abs, pairs)),
          "grad_abs": max(grad_abs)}


def assert_within(got, want, *, case: str, precision: str = "highest") -> None:
  """Two (loss, gradients) results agree within the chip's tolerances of `case` (an
  implementation's name: a Pallas kernel's own, else those of the implementations XLA
  compiles), at `precision`."""
  measured = errors(got, want)
  for what in ("value", "grad"):
    name = f"{family(case)}_{what.upper()}_{precision.upper()}"
    assert measured[what] <= TOLERANCES[name], (
        f"{what} off by {measured[what]:.3g} (largest absolute {measured[what + '_abs']:.3g}), "
        f"over {name}={TOLERANCES[name]:.3g} (tests/tpu_tolerances.py)")


def _kernel_errors(precision: str) -> dict:
  # pylint: disable=import-outside-toplevel
  from tests.test_attn_pallas_hd64 import kernel_against_xla
  from tests.test_modules import splash_against_xla
  against = {"splash_kernel": splash_against_xla, "pallas_hd64_kernel": kernel_against_xla,
             "pallas_hd64_padded_kernel": lambda packed: kernel_against_xla(
                 packed, products="padded")}
  out = {}
  for case in KERNEL_CASES:
    for rows in ROWS:
      # Set explicitly, `default` too: JAX_DEFAULT_MATMUL_PRECISION may be set in the
      # environment.
      with jax.default_matmul_precision(precision):
        got, want = against[case](rows == "packed")
      out[f"{case}/{rows}"] = errors(got, want)
  return out


def _layer_errors(precision: str) -> dict:
  # pylint: disable=import-outside-toplevel,protected-access
  from modules.attention import Attention
  from modules.attn_registry import IMPLEMENTATIONS, REFERENCE
  from tests import test_attention_impls as impls
  x, pos, seg = impls._inputs()
  ref = Attention(impls._cfg(REFERENCE), dim=32)
  params = {"params": impls.random_params(ref, x, pos, None)}
  out = {}
  for name in IMPLEMENTATIONS.names():
    if name == REFERENCE:
      continue
    layer = Attention(impls._cfg(name), dim=32)
    for rows in ROWS if IMPLEMENTATIONS.get(name).supports.segments else ROWS[:1]:
      segments = seg if rows == "packed" else None
      with jax.default_matmul_precision(precision):
        got = impls._value_and_grad(layer, params, x, pos, segments)
        want = impls._value_and_grad(ref, params, x, pos, segments)
      out[f"{name}/{rows}"] = errors(got, want)
  return out


def _native() -> dict:
  """{kernel: whether it compiles to its Pallas TPU kernel (a `tpu_custom_call`), not to
  interpret mode}."""
  # pylint: disable=import-outside-toplevel
  from modules.attn_pallas_hd64 import pallas_hd64_attention
  from modules.attn_splash import splash_attention
  from modules.masks import Mask
  from tests.test_modules import _attention_cfg, _splash_case
  q, k, v, seg = _splash_case(True)
  mask, cfg = Mask(segment_ids_BxL=seg), _attention_cfg(splash_block_size=128,
                                                        pallas_block_q=128, pallas_block_kv=128)
  return {name: "tpu_custom_call" in jax.jit(lambda q, k, v: attend(q, k, v, mask, cfg)).lower(
      q, k, v).as_text() for name, attend in (("splash", splash_attention),
                                               ("pallas_hd64", pallas_hd64_attention))}


def suggested(largest: float) -> float:
  """A tolerance set from a group's largest error on the chip: twice it, rounded up to two
  significant digits (module docstring)."""
  if largest <= 0:
    return 0.0
  scale = 10.0 ** (math.floor(math.log10(2 * largest)) - 1)
  return float(f"{math.ceil(2 * largest / scale) * scale:.2g}")


def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def measure() -> dict:
  """Every error of `keys()` on this process's devices, with what they ran on, each group's
  largest error, the constant that bounds it and the value `suggested` from it."""
  flat, absolute = {}, {}
  for precision in PRECISIONS:
    for case, found in {**_kernel_errors(precision), **_layer_errors(precision)}.items():
      for what in ("value", "grad"):
        flat[f"{case}/{what}/{precision}"] = found[what]
        absolute[f"{case}/{what}/{precision}"] = found[f"{what}_abs"]
  largest = {name: max(e for k, e in flat.items() if group(k) == name) for name in TOLERANCES}
  device = jax.devices()[0]
  return {"platform": device.platform, "device_kind": device.device_kind,
          "jax": jax.__version__, "libtpu": _version("libtpu"), "native": _native(),
          "largest": largest, "tolerances": TOLERANCES,
          "suggested": {name: suggested(e) for name, e in largest.items()},
          "errors": flat, "max_abs": absolute}


if __name__ == "__main__":
  print(json.dumps(measure()))
