#!/usr/bin/env bash
# DDP×N against the cost model on a lent 4-GPU machine (issue 38, item 1): bench/scaling.py
# over SCRIPTS, both links, sizes 1,2,4 in one launch per row, within BUDGET seconds.
set -u
: "${OUT:?OUT must name the output folder}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "install failed"
PATH="$(dirname "$(command -v python3)"):$PATH"
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
python3 -c "import torchvision" 2>/dev/null && echo "torchvision: yes" || echo "torchvision: no"
python3 bench/scaling.py --scripts "${SCRIPTS:?SCRIPTS}" --conditions "${CONDITIONS:-host,nvlink}" \
  --ns "${NS:-1,2,4}" --rounds "${ROUNDS:-2}" --window-s "${WINDOW_S:-0.8}" \
  --budget "${BUDGET:-520}" --run "${RUN:-scaling}" --out "$OUT/scaling" \
  ${SKIP_CURVES:+--skip-curves} --report-to "$OUT/scaling/report.md"
