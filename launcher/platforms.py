"""JAX's backend choice on a machine without accelerators, with libtpu installed.

libtpu (the `tpu` extra, for `axtrain plan`) makes JAX try a TPU backend on every start; on a
machine with no TPU that prints libtpu's initialisation warnings and costs time. When the
user has not chosen (`JAX_PLATFORMS` unset) and the machine shows no TPU, NVIDIA GPU, AMD GPU
or Neuron device, the CPU backend is the only one JAX could pick: choose it outright.
When the user has chosen a backend this machine cannot start (`JAX_PLATFORMS=cuda` without a
GPU), `check_backend` says so in one line.
"""

from __future__ import annotations

import glob
import os

from launcher.errors import UserError


def cpu_when_no_accelerator() -> None:
  """Call before anything initialises a JAX backend."""
  if os.environ.get("JAX_PLATFORMS") is not None:
    return
  import jax  # pylint: disable=import-outside-toplevel
  from jax._src import hardware_utils  # pylint: disable=import-outside-toplevel
  if (hardware_utils.num_available_tpu_chips_and_device_id()[0]
      or hardware_utils.has_visible_nvidia_gpu()
      or glob.glob("/dev/neuron*") or os.path.exists("/dev/kfd")):
    return
  jax.config.update("jax_platforms", "cpu")


def check_backend() -> None:
  """Starts JAX's backends; UserError when the ones JAX_PLATFORMS names cannot start here.

  Call after jax.distributed.initialize (multi-process runs), which must come first."""
  import jax  # pylint: disable=import-outside-toplevel
  try:
    jax.devices()
  except (RuntimeError, AssertionError) as e:
    chosen = os.environ.get("JAX_PLATFORMS")
    reason = " ".join(str(e).split())[:200] or "none of its devices is visible"
    if chosen is None:
      raise
    raise UserError(f"JAX_PLATFORMS={chosen}: JAX cannot start that backend on this machine "
                    f"({reason}); unset JAX_PLATFORMS to use what it has, or set it to cpu") \
        from None
