"""`python -m launcher ...` is `axtrain ...`."""

from launcher.main import run

run()
