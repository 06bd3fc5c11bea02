"""benchmarks/chip.py run's arguments: a bare `--profile` profiles every setting and takes none
of them as its value."""

from __future__ import annotations

import pytest

from benchmarks import chip


def _parse(*argv: str):
  return chip.run_parser().parse_args(chip.profile_alone(["--out=/tmp/x", *argv]))


@pytest.mark.parametrize("argv, profile, settings", [
    # The command that lost 125m-b4 on the chip: both settings run, both profiled.
    (("--profile", "125m-b4", "125m-b4:--config.model.quantization.kind=int8"), "all",
     ["125m-b4", "125m-b4:--config.model.quantization.kind=int8"]),
    (("125m", "--profile"), "all", ["125m"]),
    (("--profile=125m-b4", "125m-b4", "125m"), "125m-b4", ["125m-b4", "125m"]),
    (("125m",), "", ["125m"]),
])
def test_a_bare_profile_flag_profiles_every_setting_and_swallows_none(argv, profile, settings):
  args = _parse(*argv)
  assert args.profile == profile and args.settings == settings
