"""What a checkpoint save of a train state in host memory adds to host RAM: a bounded batch.

Orbax (0.12) copies every array of a save to host RAM before `save` returns and holds the
copies until all are written: on a TPU v5e host a state of 6.07 GB in pinned host memory
(trainer.state_memory=host) took 9.8 GB more during its save, and llm_1b's (15.2 GB) ran the
40 GiB machine out of memory. Its `save_device_host_concurrent_gb` option bounds the copies
only for arrays that its ArrayHandler's callback calls deprioritized, which no handler that
Orbax builds does; `Transfers` is that callback and `StateHandler` the handler that uses it.
`python -m benchmarks.checkpoint_memory` measures it (docs/offload.md).
"""

from __future__ import annotations

import jax
import orbax.checkpoint as ocp
# Not exported by orbax.checkpoint 0.12: the order of a save's copies to host RAM (Transfers).
from orbax.checkpoint._src.metadata.array_metadata_store import Store as ArrayMetadataStore
from orbax.checkpoint._src.serialization.types import (DefaultSerializationStatusCallback,
                                                       TransferPriority)

from trainer.checkpoint_files import DATA, STATE

# GB (10**9 bytes) of a state in host memory that a save copies off and writes at once
# (save_device_host_concurrent_gb); a larger array is copied and written alone.
HOST_STATE_SAVE_GB = 0.25


class Transfers(DefaultSerializationStatusCallback):
  """When Orbax copies a save's arrays to host RAM, set by Checkpointer.save for each save.

  Default: every array before `save` returns, the copies held until all are written (about
  1.6x a host-memory state on top of it on a TPU v5e host). `bounded`: in batches of at most
  HOST_STATE_SAVE_GB, each written before the next is copied, in Orbax's background thread;
  the train step donates the state, so such a save finishes before `save` returns.
  """

  def __init__(self):
    self.bounded = False

  def key_priority(self, _) -> TransferPriority:
    return (TransferPriority.ASYNCHRONOUS_DEPRIORITIZED if self.bounded
            else TransferPriority.SYNCHRONOUS)


class StateHandler(ocp.StandardCheckpointHandler):
  """StandardSave/StandardRestore's handler (the same files and checks), whose jax.Array
  copies follow `transfers`: its PyTreeCheckpointHandler (`_impl`, which Orbax's own
  constructor makes without these options) gets save_device_host_concurrent_gb and an
  ArrayHandler that asks `transfers`."""

  def __init__(self, transfers: Transfers):
    super().__init__()
    arrays = ocp.type_handlers.ArrayHandler(array_metadata_store=ArrayMetadataStore(),
                                            callback=transfers)
    registry = ocp.type_handlers.create_type_handler_registry(
        *[(ty, arrays if ty is jax.Array else ocp.type_handlers.get_type_handler(ty))
          for ty in ocp.type_handlers.supported_types()])
    self._impl = ocp.PyTreeCheckpointHandler(
        save_concurrent_gb=96, restore_concurrent_gb=96,  # StandardCheckpointHandler's
        save_device_host_concurrent_gb=HOST_STATE_SAVE_GB, type_handler_registry=registry)


def in_host_memory(state) -> bool:
  """Whether any array of `state` lives in host memory (trainer.state_memory=host)."""
  return any(getattr(getattr(leaf, "sharding", None), "memory_kind", None) == "pinned_host"
             for leaf in jax.tree.leaves(state))


def handlers(transfers: Transfers) -> ocp.handlers.DefaultCheckpointHandlerRegistry:
  """A Checkpointer's items: the state (StandardSave/StandardRestore, StateHandler) and the
  data iterator's state (JsonSave/JsonRestore)."""
  registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
  state, data = StateHandler(transfers), ocp.JsonCheckpointHandler()
  for args in (ocp.args.StandardSave, ocp.args.StandardRestore):
    registry.add(STATE, args, state)
  for args in (ocp.args.JsonSave, ocp.args.JsonRestore):
    registry.add(DATA, args, data)
  return registry
