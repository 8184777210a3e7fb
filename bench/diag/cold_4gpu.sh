#!/usr/bin/env bash
# Cold decisions on a lent 4-GPU machine (issue 38, item 2): the dry run as long as its figures
# need (dryrun.precision, the default) against its fixed counts (precision 0), one script after
# the other, each pair back to back, empty caches (bench/cold_decision.py makes them).
set -u
: "${OUT:?OUT must name the output folder}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "install failed"
PATH="$(dirname "$(command -v python3)"):$PATH"
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
python3 bench/cold_decision.py --scripts "${SCRIPTS:-hf-style-b32,bn-convnet-b64,gpt-1b-b4}" \
  --conditions "${CONDITIONS:-nvlink}" --which throughput-fixed,throughput --timeout 120 \
  --out "$OUT/cold-4gpu.md" --json "$OUT/cold-4gpu.json"
