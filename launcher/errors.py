"""User mistakes: printed as one `axtrain: error: ...` line with exit code 2; a disk without room
(trainer/disk.py:NoSpace) is one such line too, with exit code 74."""

from core.registry import ConfigError, suggest

EXIT_USAGE = 2
# EX_IOERR from sysexits.h: a write found its disk full (or over quota). Not retryable as it is:
# free space, then run the same command again (a training run resumes from its last checkpoint).
EXIT_NO_SPACE = 74


class UserError(ConfigError):
  """A mistake in the command line or on disk that the user can fix."""


__all__ = ["EXIT_NO_SPACE", "EXIT_USAGE", "ConfigError", "UserError", "suggest"]
