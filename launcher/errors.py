"""User mistakes: printed as one `axtrain: error: ...` line with exit code 2; a disk without room
(trainer/disk.py:NoSpace) is one such line too, with exit code 74."""

import sys

from core.registry import ConfigError, suggest

EXIT_USAGE = 2
# EX_IOERR from sysexits.h: a write found its disk full (or over quota). Not retryable as it is:
# free space, then run the same command again (a training run resumes from its last checkpoint).
EXIT_NO_SPACE = 74


class UserError(ConfigError):
  """A mistake in the command line or on disk that the user can fix."""


__all__ = ["EXIT_NO_SPACE", "EXIT_USAGE", "ConfigError", "UserError", "suggest"]


def warn(text: str) -> None:
  """One `axtrain: warning:` line on stderr, flushed (beside a run's progress lines)."""
  print(f"axtrain: warning: {text}", file=sys.stderr, flush=True)
