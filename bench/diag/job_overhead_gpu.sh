#!/usr/bin/env bash
# bench/job_overhead.py on a lent GPU machine, one phase per device call (each well under the
# 10-minute limit); results under $OUT, one tar.
#   PHASE=toggle  bash bench/diag/job_overhead_gpu.sh   # the hooks on/off in one job, 2 and 4 ranks
#   PHASE=toggle  NPROCS=1 CONDS=nvlink PART=faulthandler bash bench/diag/job_overhead_gpu.sh
#   PHASE=rounds  BUDGET=420 NPROC=2 CONDS="host nvlink" bash bench/diag/job_overhead_gpu.sh
#   PHASE=baton   PAIRS=130 CONDS=host KINDS="torchrun sl-ddp" bash bench/diag/job_overhead_gpu.sh
set -u
. "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv | tee "$OUT/gpus.txt"
ngpu=$(nvidia-smi -L | wc -l)
res="$OUT/res"; mkdir -p "$res"
case "${PHASE:-toggle}" in
toggle)
    for n in ${NPROCS:-2 4}; do
        [ "$n" -le "$ngpu" ] || continue
        python3 bench/job_overhead.py --nproc "$n" --conditions ${CONDS:-host nvlink} \
            --scripts ${SCRIPTS:-deep-mlp cnn-small gpt-small} --toggle-part "${PART:-hooks}" \
            --toggle-windows "${WINDOWS:-40}" --steps "${STEPS:-4000}" \
            --out "$res/toggle-${n}gpu-${PART:-hooks}" 2>>"$res/toggle.log" | tail -12
    done ;;
rounds)
    python3 bench/job_overhead.py --nproc "${NPROC:-2}" --conditions ${CONDS:-host} \
        --kinds ${KINDS:-torchrun sl-ddp sl-auto} --rounds "${ROUNDS:-20}" \
        --budget-s "${BUDGET:-420}" --steps "${STEPS:-600}" \
        --out "$res/rounds-${NPROC:-2}gpu-${TAG:-a}" 2>>"$res/rounds.log" | tail -20 ;;
baton)
    python3 bench/job_overhead.py --nproc "${NPROC:-2}" --conditions ${CONDS:-host} \
        --kinds ${KINDS:-torchrun sl-ddp} --scripts ${SCRIPTS:-deep-mlp cnn-small gpt-small} \
        --baton "${PAIRS:-130}" --window-s "${WINDOW_S:-0.3}" --budget-s "${BUDGET:-420}" ${EXTRA:-} \
        --out "$res/baton-${NPROC:-2}gpu-${TAG:-a}" 2>>"$res/baton.log" | tail -20 ;;
esac
tar -C "$OUT" -czf "$OUT/job-overhead-${PHASE:-toggle}${TAG:+-$TAG}.tar.gz" res && rm -rf "$res"
