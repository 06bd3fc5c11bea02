"""Attention implementations: one registry, one signature, and what each declares it supports.

An implementation is a function of one signature,

    attend(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, mask, cfg) -> [B, L, H, K]

queries over G kv heads (kv head g serves query heads g*H/G .. (g+1)*H/G - 1), softmax scale
K**-0.5, the keys each query sees given by `mask` (a modules/masks.py:Mask). `cfg` is the layer's
AttentionConfig (modules/attention.py): every option reaches the kernel in that one node, read
where it is used. Each file `modules/attn_<name>.py` registers one, with its declaration:

    @IMPLEMENTATIONS.register("xla", Supports(segments=True, context=Context.GATHERED,
                                              decode=True, masks=masks.DENSE))
    def xla_attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, mask, cfg): ...

The layer (modules/attention.py:Attention) dispatches through `choose`, which refuses in one
line (ConfigError) what the implementation does not declare: packed documents, context
parallelism, a per-layer option; a decode step of one that does not declare decoding runs
REFERENCE (`xla`) instead, which supports everything. A per-layer option is a field of
AttentionConfig made with `option(default)`, one that changes the attention's math; the others
refuse it when it is set away from its default, when the layer is built
(AttentionConfig.check). An implementation supports an option either by reading `cfg.<name>`
and naming it in `Supports.options` (`logit_softcap`), or, for a mask option (a sliding window:
modules/masks.py, where each is defined once), by attending under `mask` and naming the mask
options its form of the mask expresses in `Supports.masks`: masks.DENSE, every one, for those
that take the mask as an array (`Mask.array`), masks.SPLASH for splash's own masks. Settings of
one implementation (`query_chunk_size`, `splash_block_size`, `logits_dtype`) are plain fields
that the others ignore.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

from core.registry import ConfigError, suggest

_OPTION = "attention_option"
REFERENCE = "xla"  # supports everything; decodes in place of an implementation that cannot


class Context(enum.Enum):
  """How an implementation runs under context parallelism (modules/context.py)."""
  GATHERED = "gathered"  # the layer gathers keys and values (context.attention): explicit masks
  OWN = "own"  # it splits the work over the context axes itself, from segment ids


@dataclasses.dataclass(frozen=True, kw_only=True)
class Supports:
  """What an implementation can do; the layer refuses the rest in one line."""
  segments: bool  # packed documents: a query sees only the keys of its own segment
  context: Context | None  # context parallelism, and how; None: refused
  decode: bool  # a KV cache's explicit mask (generation); False: REFERENCE decodes instead
  options: tuple[str, ...] = ()  # the per-layer options (AttentionConfig `option()` fields)
  # the mask options it attends under (modules/masks.py): masks.DENSE, masks.SPLASH,
  # masks.BLOCKS, or none
  masks: tuple[str, ...] = ()
  # the one platform it is compiled for (a Pallas TPU kernel: "tpu"), run in Pallas interpret
  # mode elsewhere (right, but slow: for tests); None: native everywhere
  native: str | None = None

  def has(self, need: str) -> bool:
    """Whether it supports `need`: "segments", "context", "decode" or an option's name."""
    if need in ("segments", "decode"):
      return getattr(self, need)
    if need == "context":
      return self.context is not None
    return need in self.options or need in self.masks


@dataclasses.dataclass(frozen=True)
class Implementation:
  name: str
  attend: Callable[..., Any]  # (q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, mask, cfg) -> [B, L, H, K]
  supports: Supports
  # (cfg, *, length, count): ConfigError for a context layout it cannot run, checked before
  # tracing (trainer/experiment.py:check_parallel); None: any layout the context split allows.
  check_context: Callable[..., None] | None = None


class Implementations:
  """The registry of attention implementations: short names, duplicates refused, unknown names
  answered with a did-you-mean."""

  def __init__(self):
    self._entries: dict[str, Implementation] = {}

  def register(self, name: str, supports: Supports, *,
               check_context: Callable[..., None] | None = None):
    def decorator(attend):
      if name in self._entries:
        raise ValueError(f"attention implementation {name!r} registered twice")
      self._entries[name] = Implementation(name, attend, supports, check_context)
      return attend
    return decorator

  def names(self) -> list[str]:
    return sorted(self._entries)

  def get(self, name: str) -> Implementation:
    if name not in self._entries:
      raise ConfigError(f"attention.implementation: '{name}' is not one of "
                        f"{', '.join(self.names())}{suggest(name, self._entries)}")
    return self._entries[name]

  def supporting(self, need: str) -> list[str]:
    return [n for n in self.names() if self._entries[n].supports.has(need)]


IMPLEMENTATIONS = Implementations()


def option(default: Any) -> Any:
  """Declares a per-layer option field of AttentionConfig, off at `default`: only the
  implementations that name it in `Supports.options` run with it set."""
  return dataclasses.field(default=default, metadata={_OPTION: True})


def option_names(cfg) -> list[str]:
  """The per-layer option fields of an AttentionConfig (class or instance)."""
  return [f.name for f in dataclasses.fields(cfg) if f.metadata.get(_OPTION)]


def options_set(cfg) -> dict[str, Any]:
  """{name: value} of `cfg`'s option fields that are set away from their defaults."""
  defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
  return {name: getattr(cfg, name) for name in option_names(cfg)
          if getattr(cfg, name) != defaults[name]}


_WHAT = {"segments": "packed documents (segment ids)", "context": "context parallelism",
         "decode": "decoding"}


def choose(cfg, *, segments: bool = False, context: int = 1,
           decode: bool = False) -> Implementation:
  """The implementation that runs a call of the layer: `cfg.implementation`, or REFERENCE for a
  decode step of one that cannot decode. ConfigError (one line) for what it does not support:
  `segments` (packed documents), `context` (shards > 1), an option that `cfg` sets."""
  impl = IMPLEMENTATIONS.get(cfg.implementation)
  if decode and not impl.supports.decode:
    impl = IMPLEMENTATIONS.get(REFERENCE)
  needs = {name: f"attention.{name}={value}" for name, value in options_set(cfg).items()}
  needs |= {need: _WHAT[need] for need, on in (("segments", segments), ("context", context > 1))
            if on}
  for need, what in needs.items():
    if not impl.supports.has(need):
      others = IMPLEMENTATIONS.supporting(need)
      raise ConfigError(f"attention.implementation={impl.name} does not support {what}; " + (
          f"implementations that do: {', '.join(others)}" if others else "none does"))
  return impl


def check_context(cfg, *, length: int, count: int) -> None:
  """ConfigError unless `cfg`'s implementation runs context parallelism over `count` shards of
  sequences of `length` positions (before tracing: trainer/experiment.py:check_parallel)."""
  impl = choose(cfg, context=count)
  if impl.check_context is not None:
    impl.check_context(cfg, length=length, count=count)
