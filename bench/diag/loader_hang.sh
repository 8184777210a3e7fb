#!/usr/bin/env bash
# The DataLoader script of the cold-path hang (6 workers, persistent, pinned), on a lent
# 2-GPU machine: torchrun's one-GPU and DDP x2 rates, then smartlaunch --explain with a
# watcher that records the process tree and, at WATCH_S, every python's stacks (SIGABRT with
# PYTHONFAULTHANDLER=1) and the trial logs. Output under $OUT.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
PY=$(command -v python3)
export PATH=$(dirname "$PY"):$PATH
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 9
python3 -c "import sys, torch, multiprocessing as mp; print(sys.version, torch.__version__, mp.get_start_method(), torch.cuda.device_count())"
START=$(date +%s); S=bench/diag/loader_train.py; ARGS="--batch 128 --workers 6 --steps 200"
export HOME=/tmp/h XDG_CACHE_HOME=/tmp/h/.cache PYTHONPATH=$PWD/bench/diag/stackdump
rm -rf /tmp/h /dev/shm/stacks; mkdir -p /tmp/h
( for t in ${WATCH_AT:-14 21 28 35}; do
    while [ $(( $(date +%s) - START )) -lt $t ]; do sleep 0.2; done
    echo "##### t=$t"
    ps -eo pid,ppid,pgid,stat,wchan:24,pcpu,etimes,args --forest | grep -v "ps -eo\|grep" | grep -A100 "smartlaunch --explain"
    for p in $(pgrep -f "smartlaunch.warm|smartlaunch.profile.trial|multiprocessing"); do kill -USR2 $p 2>/dev/null; done
    sleep 1
    for z in $(ps -eo pid,stat | awk '$2 ~ /^Z/ {print $1}'); do echo "zombie $z exit_code $(awk '{print $NF}' /proc/$z/stat) parent $(awk '{print $4}' /proc/$z/stat)"; done
    ls -la /tmp/smartlaunch-trial-*/result/
    for f in /tmp/smartlaunch-trial-*/result/rank*.json; do [ -f "$f" ] && { echo "== $f"; cat "$f"; echo; }; done
  done > $OUT/watch.txt 2>&1
) &
W=$!
( time timeout 100 smartlaunch --explain --debug $S $ARGS ) > $OUT/explain.txt 2>&1
echo "explain rc $?"
wait $W
for f in /tmp/smartlaunch-trial-*/trial.log; do [ -f "$f" ] && cp "$f" $OUT/; done
tar czf $OUT/stacks.tgz -C /dev/shm stacks 2>/dev/null
tail -30 $OUT/explain.txt
