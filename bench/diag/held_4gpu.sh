#!/usr/bin/env bash
# Cold decisions with held trials on every GPU of the machine (issue 38; NPROC overrides): the small CNN over host memory,
# the default policy twice and the throughput policy once, each with an empty cache; every trial
# in order (started early, for it, or held) from the debug log. Outputs: $OUT/<policy><k>.json
# (--explain=json), $OUT/<policy><k>.err; the trial lines and timings printed.
set -u
. "$(dirname "$0")/device_setup.sh"
export NCCL_P2P_DISABLE=1
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
for run in default1 default2 throughput1; do
  h=$(mktemp -d)
  pol=(); [ "${run%1}" = throughput ] && pol=(--policy bench/policy-throughput.yaml)
  SECONDS=0
  HOME=$h XDG_CACHE_HOME=$h/cache SMARTLAUNCH_LEASE_DIR=$h/leases SMARTLAUNCH_LOG_LEVEL=debug \
    timeout 200 smartlaunch "${pol[@]}" --explain=json --nproc-per-node "${NPROC:-gpu}" bench/suite/cnn.py \
    --batch-size 128 --warmup 20 --steps 100000 > "$OUT/$run.json" 2> "$OUT/$run.err"
  rc=$?
  echo "== $run rc=$rc wall=${SECONDS} s"
  grep -E "trial .* steps, mean" "$OUT/$run.err" | sed 's/.*trial /trial /' | cut -c1-160
  python3 - "$OUT/$run.json" <<'PY'
import json, sys
try:
    p = json.load(open(sys.argv[1]))
except Exception as e:
    print("no plan:", e); sys.exit()
print("choice:", p.get("strategy"), p.get("nproc_per_node"), "timings:",
      {k: v for k, v in (p.get("timings") or {}).items() if k.startswith(("trials", "total", "profile"))})
for r in p.get("reasons", []):
    t = r.get("text", "") if isinstance(r, dict) else str(r)
    if "again" in t or "DDP×" in t[:12]:
        print("  ", t[:300])
PY
  rm -rf "$h"
done
