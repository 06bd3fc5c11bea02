#!/usr/bin/env bash
# Puts tokamax, pinned (benchmarks/attention.py: TOKAMAX), and the packages it imports that the chip machine's own
# index may lack into .chip/tokamax, for benchmarks/attention_on_chip.sh (docs/chip.md, "Attention kernels at
# head_dim 64"). Run from the project root after ../shared/chip/wheels.sh, which makes .chip/ and keeps it out of
# git. Versions: those tested with tokamax 0.0.12 and jax 0.10.2 (pydantic's are the project's .venv's).
set -euo pipefail
[ -d .chip ] || { echo "tokamax_wheels.sh: run ../shared/chip/wheels.sh first (it makes .chip/)"; exit 2; }
mkdir -p .chip/tokamax
.venv/bin/pip download -q --no-deps --only-binary=:all: --python-version 3.11 --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 -d .chip/tokamax tokamax==0.0.12 einshape==1.0 jaxtyping==0.3.11 \
  wadler-lindig==0.1.8 typeguard==2.13.3 immutabledict==4.3.1 pydantic==2.14.4 pydantic-core==2.50.5 \
  annotated-types==0.8.0 typing-inspection==0.4.5 tqdm==4.70.1 2>&1 | grep -v "^WARNING" || true
echo "tokamax_wheels.sh: $(ls .chip/tokamax | wc -l) wheels in .chip/tokamax"
