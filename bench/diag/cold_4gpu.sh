#!/usr/bin/env bash
# Cold decisions on a lent 4-GPU machine (issue 38, item 2): the dry run as long as its figures
# need (dryrun.precision, the default) against its fixed counts (precision 0), one script after
# the other, each pair back to back, empty caches (bench/cold_decision.py makes them).
set -u
. "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
python3 bench/cold_decision.py --scripts "${SCRIPTS:-hf-style-b32,bn-convnet-b64,gpt-1b-b4}" \
  --conditions "${CONDITIONS:-nvlink}" --which throughput-fixed,throughput --timeout 120 \
  --out "$OUT/cold-4gpu.md" --json "$OUT/cold-4gpu.json"
