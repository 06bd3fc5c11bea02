"""Several axtrain command lines in one process: `python -m tests.cli_batch` (conftest.cli_batch).

Reads a JSON list of argument lists on stdin, runs each through launcher.main.main with its
stdout and stderr captured at the file descriptors (as a subprocess's would be, C++ and absl
output included), and prints a JSON list of {"code", "stdout", "stderr"}. For tests that need
a fresh process only for what must be set before jax is imported (fake device counts): one
process start and one jax import for all of their commands.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback


def run_captured(argv: list[str]) -> dict:
  from launcher import main as main_lib  # pylint: disable=import-outside-toplevel
  files = [tempfile.TemporaryFile() for _ in range(2)]
  sys.stdout.flush()
  sys.stderr.flush()
  saved = [os.dup(1), os.dup(2)]
  os.dup2(files[0].fileno(), 1)
  os.dup2(files[1].fileno(), 2)
  try:
    code = main_lib.main(["axtrain", *argv])
  except SystemExit as e:  # --help
    code = e.code if isinstance(e.code, int) else 1
  except BaseException:  # pylint: disable=broad-except  (a traceback, as the CLI would print)
    traceback.print_exc()
    code = 1
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, copy in zip((1, 2), saved):
      os.dup2(copy, fd)
      os.close(copy)
  out = []
  for f in files:
    f.seek(0)
    out.append(f.read().decode(errors="replace"))
    f.close()
  return {"code": code, "stdout": out[0], "stderr": out[1]}


def main() -> None:
  results = [run_captured(argv) for argv in json.load(sys.stdin)]
  json.dump(results, sys.stdout)


if __name__ == "__main__":
  main()
