#!/usr/bin/env bash
# The GPU rows of the script-pattern matrix on a lent 2-GPU machine: each script's cold
# decision (smartlaunch --explain=json, fresh cache) through the warm path (default on a
# node with cores to spare) and the cold path (decision.prestart: false), one after another;
# then torchrun's one-GPU and DDP x2 wall times for reference. Output: $OUT/patterns.jsonl.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PATH=$(dirname "$(command -v python3)"):$PATH HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 9
printf 'decision:\n  prestart: false\n' > /tmp/cold.yaml
D=bench/diag
ROWS=("loader6|$D/loader_train.py --batch 128 --workers 6 --steps 200"
      "loader8|$D/loader_train.py --batch 128 --workers 8 --steps 100000"
      "compile|$D/loader_train.py --batch 128 --workers 4 --steps 100000 --compile"
      "fsdp2|$D/fsdp2_train.py --steps 100000"
      "hf_trainer|$D/hf_trainer_train.py --steps 100000"
      "lightning|$D/lightning_train.py --steps 100000")
for row in "${ROWS[@]}"; do
  name=${row%%|*}; cmd=${row#*|}
  for path in warm cold; do
    pol=(); [ $path = cold ] && pol=(--policy /tmp/cold.yaml)
    rm -rf /tmp/h; mkdir -p /tmp/h
    t0=$(date +%s.%N)
    HOME=/tmp/h XDG_CACHE_HOME=/tmp/h/.cache timeout 170 smartlaunch --explain=json "${pol[@]}" $cmd > /tmp/plan.json 2> /tmp/err.txt
    rc=$?; t1=$(date +%s.%N)
    left=$(pgrep -fc "smartlaunch.warm|smartlaunch.profile|$(basename ${cmd%% *})" || true)
    python3 - "$name" "$path" "$rc" "$(python3 -c "print($t1 - $t0)")" "$left" <<'PY' >> $OUT/patterns.jsonl
import json, sys
name, path, rc, wall, left = sys.argv[1:]
try:
    plan = json.load(open("/tmp/plan.json"))
except Exception:
    plan = {}
cands = [{k: c.get(k) for k in ("strategy", "gpus", "speedup", "measured", "reason")} for c in plan.get("candidates", [])]
err = open("/tmp/err.txt").read()[-1500:]
print(json.dumps({"row": name, "path": path, "rc": int(rc), "wall_s": float(wall), "left": int(left or 0),
                  "strategy": plan.get("strategy"), "gpus": plan.get("gpus"), "timings": plan.get("timings"),
                  "candidates": cands, "stderr_tail": err if int(rc) else err[-300:]}))
PY
    echo "$name $path rc=$rc wall=$(python3 -c "print(round($t1 - $t0, 1))") left=$left"
    pkill -9 -f "smartlaunch.warm|smartlaunch.profile" 2>/dev/null
  done
done
