"""The parameter layouts a checkpoint may hold of one model, and the message that names the
setting that reads one written in the other: layers stacked (`model.scan_layers`) or one set
per layer; projections fused (`attention.fused_qkv`, `mlp.fused_gate_up`) or separate. The
names are Orbax's ("params.layers.block.attention.q"); trainer/checkpoint.py:
check_params_compatible calls `check` before it compares parameters one by one."""

from __future__ import annotations

import re

from core.registry import ConfigError
from modules import attention, mlp


def check(saved: dict, want: dict, *, field: str, where: str) -> None:
  """ConfigError naming the setting that reads `saved` (the checkpoint's parameter names) when
  its layout and `want`'s (this model's) differ; `field`: what the message names first."""
  check_stacking(saved, want, field=field, where=where)
  check_fusion(saved, want, field=field, where=where)


_UNROLLED = re.compile(r"^params\.layers_\d+\.")  # one subtree per layer
_SCANNED = re.compile(r"^params\.layers\.")  # one stacked array per parameter (a layer axis)


def check_stacking(saved: dict, want: dict, *, field: str, where: str) -> None:
  """ConfigError naming model.scan_layers when the checkpoint's layers and this model's are
  stacked differently: the same weights, held as one array per layer or one array per stack."""
  def scanned(names):
    return (any(_SCANNED.match(n) for n in names), any(_UNROLLED.match(n) for n in names))
  (saved_scan, saved_unrolled), (want_scan, want_unrolled) = scanned(saved), scanned(want)
  if saved_scan and not saved_unrolled and want_unrolled and not want_scan:
    have, need = "scanned (one stacked array per parameter)", "true"
  elif saved_unrolled and not saved_scan and want_scan and not want_unrolled:
    have, need = "unrolled (one set of arrays per layer)", "false"
  else:
    return
  raise ConfigError(f"{field}: {where} holds its layers {have}, and this model's are the other "
                    f"way; set --config.model.scan_layers={need} to read it")


# (a fused kernel's name, a separate projection's name, the option) of each fused layout
_FUSIONS = ((f"attention.{attention.QKV}", "attention.q", "block.attention.fused_qkv"),
            (f"ffn.{mlp.WI_WU}", "ffn.wi", "block.ffn.fused_gate_up"))


def check_fusion(saved: dict, want: dict, *, field: str, where: str) -> None:
  """ConfigError naming model.block.attention.fused_qkv (mlp's fused_gate_up) when the
  checkpoint's projections and this model's are laid out differently: q, k, v separate or one
  kernel."""
  def holds(names, leaf):
    return any(n.endswith("." + leaf) for n in names)
  for fused, separate, option in _FUSIONS:
    if holds(saved, separate) and holds(want, fused) and not holds(want, separate):
      have, need = f"separate projections ({separate})", "false"
    elif holds(saved, fused) and holds(want, separate) and not holds(want, fused):
      have, need = f"fused projections ({fused})", "true"
    else:
      continue
    raise ConfigError(f"{field}: {where} holds {have}, and this model's are the other way; set "
                      f"--config.model.{option}={need} to read it")
