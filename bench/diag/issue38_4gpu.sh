#!/usr/bin/env bash
# Issue 38's 4-GPU leftovers in one device call, most wanted first, each step started only
# while the call has time for it (LIMIT seconds in all, default 570):
#   1. a compiled script's cold decision against its compile time (cold_decision.py, the
#      throughput policy and one forcing trials, torch.compile's cache absent and existing);
#   2. the one node kept of two 2-GPU "nodes" (multinode_gpu.py, wide MLP over host memory);
#   3. comm_derive: the all-reduce curve derived from another group size against measured;
#   4. trial_bias --nproc 4 (the trial against torchrun's own timer at ×4).
# Everything goes to $OUT/issue38.tar.gz (one file back).
set -u
t0=$SECONDS
LIMIT=${LIMIT:-570}
. "$(dirname "$0")/device_setup.sh"
D=$OUT/issue38
mkdir -p "$D"
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | tee "$D/gpus.txt"
left() { echo $(( LIMIT - (SECONDS - t0) - 15 )); }
step() {    # step NAME ESTIMATE_S COMMAND...: run it under what is left, or skip it
    local name=$1 est=$2; shift 2
    local l; l=$(left)
    if [ "$l" -lt "$est" ]; then echo "== $name: skipped ($l s left, needs ~$est)"; return; fi
    echo "== $name (up to $l s)"
    local s=$SECONDS
    timeout -k 5 "$l" "$@" >"$D/$name.log" 2>&1
    echo "== $name: rc $? after $(( SECONDS - s )) s"; tail -n 15 "$D/$name.log"
}
step compile 200 python3 bench/cold_decision.py --scripts "${COMPILE_SCRIPTS:-bn-convnet-compile-b64}" \
    --conditions nvlink --which throughput,trials --inductor absent,exists --compile-alone 1 \
    --timeout 150 --out "$D/compile.md" --json "$D/compile.json"
step kept-node 150 python3 bench/multinode_gpu.py --scripts wide-mlp-b16 --out "$D/kept-node"
step comm-derive 70 python3 bench/comm_derive.py --out "$D/comm-derive"
step trial-bias 120 python3 bench/trial_bias.py --scripts cnn-small-b128 --nproc 4 \
    --condition host --out "$D/trial-bias.json"
tar czf "$OUT/issue38.tar.gz" -C "$OUT" issue38 && rm -rf "$D"
echo "wrote $OUT/issue38.tar.gz after $(( SECONDS - t0 )) s"
