#!/usr/bin/env bash
# One device call: baton sessions of K launches a side (bench/job_overhead.py --baton --launches),
# one per ROWS entry "condition:script:kind", each cut at EACH_S seconds; results under $OUT, one tar.
#   ROWS="nvlink:deep-mlp:torchrun-hook host:cnn-small:sl-auto" LAUNCHES=10 PAIRS=12 \
#     bash bench/diag/baton_launches.sh
# The launch pairs take turns over which job starts first (--alternate-first; ALT=0: smartlaunch's
# job first in every pair, as before 2026-11-29).
set -u
. "$(dirname "$0")/device_setup.sh"
res="$OUT/res"; mkdir -p "$res"
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv > "$res/gpus.txt"
nproc > "$res/nproc.txt"; git rev-parse HEAD > "$res/commit.txt" 2>/dev/null
for row in ${ROWS:?ROWS names the sessions}; do
    IFS=: read -r cond script kind <<< "$row"
    timeout "${EACH_S:-185}" python3 bench/job_overhead.py --nproc "${NPROC:-2}" \
        --conditions "$cond" --kinds torchrun "$kind" --scripts "$script" \
        --baton "${PAIRS:-12}" --window-s "${WINDOW_S:-0.3}" --launches "${LAUNCHES:-10}" \
        ${PIN---pin} $([ "${ALT:-1}" = 0 ] || echo --alternate-first) --out "$res/$cond-$script-$kind" 2>>"$res/baton.log" | grep "^|" | tail -1
done
tar -C "$OUT" -czf "$OUT/baton-launches.tar.gz" res && rm -rf "$res"
