#!/usr/bin/env bash
# On the chip, through .chip/on_chip.sh (docs/chip.md, "Attention kernels at head_dim 64"): installs tokamax from
# .chip/tokamax (benchmarks/tokamax_wheels.sh) into /tmp/tokamax once per machine where those wheels came along,
# then runs `python3 -m benchmarks.attention` with the arguments given (without them, benchmarks.attention skips
# tokamax's kernels with a line that says why).
set -uo pipefail
if [ -d .chip/tokamax ] && [ ! -f /tmp/tokamax/.done ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/tokamax .chip/tokamax/*.whl > /tmp/tokamax.log 2>&1 \
    && touch /tmp/tokamax/.done || { echo "attention_on_chip.sh: tokamax not installed:"; tail -3 /tmp/tokamax.log; }
fi
export PYTHONPATH="${PYTHONPATH:-}:/tmp/tokamax"
exec python3 -m benchmarks.attention "$@"
