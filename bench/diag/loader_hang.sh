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
S=bench/diag/loader_train.py; ARGS="--batch 128 --workers 6 --steps 200"
WATCH_S=${WATCH_S:-45}
timeout 120 torchrun --standalone --nproc-per-node 1 $S $ARGS 2>&1 | grep done
timeout 120 torchrun --standalone --nproc-per-node 2 $S $ARGS 2>&1 | grep done
export PYTHONFAULTHANDLER=1 HOME=/tmp/h XDG_CACHE_HOME=/tmp/h/.cache
mkdir -p /tmp/h
( sleep $WATCH_S
  ps -eo pid,ppid,pgid,stat,wchan:24,pcpu,etimes,args --forest > $OUT/ps.txt
  for f in /tmp/smartlaunch-trial-*/trial.log /tmp/smartlaunch-dryrun-*/*.log; do
    [ -f "$f" ] && { echo "== $f"; tail -c 20000 "$f"; }; done > $OUT/logs-before.txt 2>&1
  for p in $(pgrep -f "smartlaunch.warm|smartlaunch.profile.trial"); do kill -ABRT $p; done
  sleep 3
  for f in /tmp/smartlaunch-trial-*/trial.log; do
    [ -f "$f" ] && { echo "== $f"; tail -c 60000 "$f"; }; done > $OUT/logs-after.txt 2>&1
) &
W=$!
( time timeout 100 smartlaunch --explain $S $ARGS ) > $OUT/explain.txt 2>&1
echo "explain rc $?"
wait $W
tail -30 $OUT/explain.txt
