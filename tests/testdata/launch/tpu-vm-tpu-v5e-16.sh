#!/bin/bash
# Cloud TPU VM commands of `axtrain launch --backend=tpu-vm`: run axtrain on every worker; docs/launch.md.
# Written by: axtrain launch --dry_run --nocheck_fit --job_name=llm-1b --backend=tpu-vm --tpu_name=my-tpu --zone=us-west4-a --workdir=/home/me/axtrain --record_dir=launches/llm-1b -- --config=configs/llm_1b.py --output_dir=/runs/llm_1b --mesh=tpu-v5e-16
# Run directory: /runs/llm_1b
# Layout: 4 processes: 4 hosts x 1 process each, 4 tpu devices per process (--mesh=tpu-v5e-16)
set -euo pipefail
# 4 worker(s) of my-tpu (v5e:4x4).
gcloud compute tpus tpu-vm ssh my-tpu --zone=us-west4-a --worker=all --command='cd /home/me/axtrain && .venv/bin/axtrain --config=configs/llm_1b.py --output_dir=/runs/llm_1b --mesh=tpu-v5e-16 --distributed=tpu'
