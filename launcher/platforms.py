"""JAX's backend choice on a machine without accelerators, with libtpu installed.

libtpu (the `tpu` extra, for `axtrain plan`) makes JAX try a TPU backend on every start; on a
machine with no TPU that prints libtpu's initialisation warnings and costs time. When the
user has not chosen (`JAX_PLATFORMS` unset) and the machine shows no TPU, NVIDIA GPU, AMD GPU
or Neuron device, the CPU backend is the only one JAX could pick: choose it outright.
"""

from __future__ import annotations

import glob
import os


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
