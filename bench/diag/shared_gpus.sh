#!/usr/bin/env bash
# A launch alone keeps its rate and says nothing; the same launch with a torchrun job started
# on its GPUs mid-run says it shared them and keeps none (real NVML process lists, torch's agent's
# ranks counted as the launch's own).
set -u
. "$(dirname "$0")/device_setup.sh"
export SMARTLAUNCH_CACHE_DIR=$(mktemp -d)
S="bench/suite/deep_mlp.py --batch-size 256 --warmup 20 --chunks 4"
timeout 90 smartlaunch --standalone --strategy ddp --nproc-per-node 2 $S --steps 3000 > "$OUT/alone.out" 2> "$OUT/alone.err"
echo "alone: rc $? shared-lines $(grep -c 'shared its GPUs' "$OUT/alone.err") kept $(ls "$SMARTLAUNCH_CACHE_DIR"/launches 2>/dev/null | wc -l)"
rm -rf "$SMARTLAUNCH_CACHE_DIR"/launches
timeout 90 smartlaunch --standalone --strategy ddp --nproc-per-node 2 $S --steps 6000 > "$OUT/beside.out" 2> "$OUT/beside.err" &
sl=$!
sleep 12
timeout 60 python3 -m torch.distributed.run --standalone --nproc-per-node 2 $S --steps 1500 > "$OUT/tr.out" 2>&1
wait $sl
echo "beside: rc $? kept $(ls "$SMARTLAUNCH_CACHE_DIR"/launches 2>/dev/null | wc -l)"
grep 'shared its GPUs\|summary' "$OUT/beside.err"
