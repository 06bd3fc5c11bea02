"""User mistakes: printed as one `axtrain: error: ...` line with exit code 2."""

from core.registry import ConfigError, suggest

EXIT_USAGE = 2


class UserError(ConfigError):
  """A mistake in the command line or on disk that the user can fix."""


__all__ = ["EXIT_USAGE", "ConfigError", "UserError", "suggest"]
