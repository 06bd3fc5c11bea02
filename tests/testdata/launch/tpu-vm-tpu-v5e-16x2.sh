#!/bin/bash
# Cloud TPU VM commands of `axtrain launch --backend=tpu-vm`: run axtrain on every worker; docs/launch.md.
# Written by: axtrain launch --dry_run --nocheck_fit --job_name=llm-1b --backend=tpu-vm --tpu_name=my-tpu --zone=us-west4-a --project=my-project --workdir=/home/me/axtrain --record_dir=launches/llm-1b -- --config=configs/llm_1b.py --output_dir=/runs/llm_1b --mesh=tpu-v5e-16x2
# Run directory: /runs/llm_1b
# Layout: 8 processes: 8 hosts in 2 slices x 1 process each, 4 tpu devices per process (--mesh=tpu-v5e-16x2)
set -euo pipefail
# 2 slices of 4 workers (v5e:4x4 each), joined over the data-center network by the MEGASCALE variables;
# the coordinator is worker 0 of my-tpu-0.
coordinator=$(gcloud compute tpus tpu-vm describe my-tpu-0 --zone=us-west4-a --project=my-project --format='value(networkEndpoints[0].ipAddress)')
pids=()
gcloud compute tpus tpu-vm ssh my-tpu-0 --zone=us-west4-a --project=my-project --worker=all --command='cd /home/me/axtrain && MEGASCALE_COORDINATOR_ADDRESS='"$coordinator"':8080 MEGASCALE_NUM_SLICES=2 MEGASCALE_SLICE_ID=0 MEGASCALE_PORT=8080 .venv/bin/axtrain --config=configs/llm_1b.py --output_dir=/runs/llm_1b --mesh=tpu-v5e-16x2 --distributed=tpu' &
pids+=($!)
gcloud compute tpus tpu-vm ssh my-tpu-1 --zone=us-west4-a --project=my-project --worker=all --command='cd /home/me/axtrain && MEGASCALE_COORDINATOR_ADDRESS='"$coordinator"':8080 MEGASCALE_NUM_SLICES=2 MEGASCALE_SLICE_ID=1 MEGASCALE_PORT=8080 .venv/bin/axtrain --config=configs/llm_1b.py --output_dir=/runs/llm_1b --mesh=tpu-v5e-16x2 --distributed=tpu' &
pids+=($!)
code=0
for pid in "${pids[@]}"; do wait "$pid" || code=$?; done
exit "$code"
