#!/usr/bin/env bash
# One device call (2 GPUs): the --baton design's own control (torchrun against a second torchrun
# job, same start order as smartlaunch's sessions), smartlaunch DDP over NVLink, and the cold
# decision's --explain for the deep MLP over host memory (COLD times, empty caches; TRIAL=1
# forces its DDP trial).
#   CONTROL="deep-mlp gpt-small" NVLINK="deep-mlp gpt-small" bash bench/diag/baton_controls.sh
#   TRIAL=1 HOST="deep-mlp gpt-small" CONTROL=deep-mlp PAIRS=100 bash bench/diag/baton_controls.sh
#   HOOK=deep-mlp (torchrun against torchrun running each rank through the worker hook)
#   BARE=deep-mlp (the same, the hook without a run directory: no per-step hooks)
#   LAUNCHES=8 PAIRS=20 HOOK=cnn-small BARE=cnn-small: K jobs of each launcher per session, one
#     ratio per launch pair (the interval then spans launches: job_overhead.py --launches)
set -u
. "$(dirname "$0")/device_setup.sh"
res="$OUT/res"; mkdir -p "$res"
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv > "$res/gpus.txt"
# TRIAL=1: the throughput policy with a band wide enough that a DDP trial always runs
policy=bench/policy-throughput.yaml
if [ -n "${TRIAL:-}" ]; then
    policy=$(mktemp --suffix=.yaml)
    printf 'decision:\n  min_efficiency: 0.5\n  uncertainty_band: 0.9\n' > "$policy"
fi
for i in $(seq "${COLD:-2}"); do
    SMARTLAUNCH_CACHE_DIR=$(mktemp -d) NCCL_P2P_DISABLE=1 timeout 120 smartlaunch \
        --policy "$policy" --nproc-per-node 2 --explain \
        bench/suite/deep_mlp.py --batch-size 256 --warmup 20 --steps 1500 --chunks 4 \
        > "$res/cold-explain-$i.txt" 2>&1
    tail -3 "$res/cold-explain-$i.txt"
done
[ -n "${CONTROL:-}" ] && python3 bench/job_overhead.py --conditions host --kinds torchrun torchrun-b \
    --scripts $CONTROL --baton "${PAIRS:-130}" --window-s 0.3 --out "$res/baton-control" \
    2>>"$res/baton.log" | grep "^|"
[ -n "${HOOK:-}" ] && python3 bench/job_overhead.py --conditions host --kinds torchrun torchrun-hook \
    --scripts $HOOK --baton "${PAIRS:-130}" --window-s 0.3 ${LAUNCHES:+--launches $LAUNCHES} \
    --out "$res/baton-hook" \
    2>>"$res/baton.log" | grep "^|"
[ -n "${BARE:-}" ] && python3 bench/job_overhead.py --conditions host --kinds torchrun torchrun-hook-bare \
    --scripts $BARE --baton "${PAIRS:-130}" --window-s 0.3 ${LAUNCHES:+--launches $LAUNCHES} \
    --out "$res/baton-bare" \
    2>>"$res/baton.log" | grep "^|"
[ -n "${HOST:-}" ] && python3 bench/job_overhead.py --conditions host --kinds torchrun sl-ddp \
    --scripts $HOST --baton "${PAIRS:-130}" --window-s 0.3 --budget-s "${BUDGET:-200}" \
    --out "$res/baton-host" 2>>"$res/baton.log" | grep "^|"
[ -n "${NVLINK:-}" ] && python3 bench/job_overhead.py --conditions nvlink --kinds torchrun sl-ddp \
    --scripts $NVLINK --baton "${PAIRS:-130}" --window-s 0.3 --budget-s "${BUDGET:-200}" \
    --out "$res/baton-nvlink" 2>>"$res/baton.log" | grep "^|"
tar -C "$OUT" -czf "$OUT/baton-controls.tar.gz" res && rm -rf "$res"
