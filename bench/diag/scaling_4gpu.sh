#!/usr/bin/env bash
# DDP×N against the cost model on a lent 4-GPU machine (issue 38, item 1): bench/scaling.py
# over SCRIPTS, both links, sizes 1,2,4 in one launch per row, within BUDGET seconds. CALIBRATE=1:
# the node calibration first (per link, ~30 s each), the rows replayed with its constants too.
set -u
. "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
python3 -c "import torchvision" 2>/dev/null && echo "torchvision: yes" || echo "torchvision: no"
python3 bench/scaling.py --scripts "${SCRIPTS:?SCRIPTS}" --conditions "${CONDITIONS:-host,nvlink}" \
  --ns "${NS:-1,2,4}" --rounds "${ROUNDS:-2}" --window-s "${WINDOW_S:-0.8}" \
  --budget "${BUDGET:-520}" --run "${RUN:-scaling}" --out "$OUT/scaling" \
  ${SKIP_CURVES:+--skip-curves} ${CALIBRATE:+--calibrate} --report-to "$OUT/scaling/report.md"
