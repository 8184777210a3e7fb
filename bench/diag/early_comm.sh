#!/usr/bin/env bash
# Issue 15, item 7, on a lent 2x H200 (one call, <= 240 s): the all-reduce curve the early
# sweep measures beside a real dry run (cold caches) against the curve bench-comm measures on
# the idle node right after, 3 rounds, NVLink. Writes $OUT/early-comm.md (the table) and
# $OUT/early-comm.json (every round's plan timings and both curves).
#   SCRIPT=hf-style-b32 bash bench/diag/early_comm.sh       (default embbag-b4096)
# CPU self-check of the same python part:
#   python bench/diag/early_comm.py --fake h200-nv18-pair --cores 16 --rounds 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/early-comm-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PATH=$(python3 -c 'import sys,os;print(os.path.dirname(sys.executable))'):$PATH
{ python3 -c "import torch; print(torch.__version__, torch.cuda.nccl.version())"; nproc
  nvidia-smi --query-gpu=index,name --format=csv; nvidia-smi topo -m; } > "$OUT/env.txt" 2>&1
timeout 225 python3 bench/diag/early_comm.py --script "${SCRIPT:-embbag-b4096}" --rounds 3 \
    --budget 150 --timeout 100 --out "$OUT/early-comm.md" --json "$OUT/early-comm.json"
echo "rc=$?" >> "$OUT/env.txt"
cat "$OUT/early-comm.md"
