"""The layer library. Importing it registers every component."""

from modules import attention, block, decoder, embedding, mlp, moe, norms, position  # noqa: F401
from modules.decoder import MODELS
from core.registry import ConfigError, registry

__all__ = ["MODELS", "ConfigError", "registry"]
