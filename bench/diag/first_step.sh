#!/usr/bin/env bash
# Where a launch's time to its first step goes, torchrun against smartlaunch --strategy ddp, on a
# lent GPU machine: each launcher twice (alternating), the script stamping its first step, and
# smartlaunch's --log-level debug timeline; then the worker hook's imports alone.
set -u
. "$(dirname "$0")/device_setup.sh"
S="bench/suite/deep_mlp.py --steps 50 --warmup 5"
for r in 1 2; do
  for k in tr sl; do
    t0=$(date +%s.%N)
    if [ $k = tr ]; then python3 -m torch.distributed.run --standalone --nproc-per-node 2 $S > "$OUT/$k$r.out" 2> "$OUT/$k$r.err"
    else smartlaunch --log-level debug --strategy ddp --nproc-per-node 2 $S > "$OUT/$k$r.out" 2> "$OUT/$k$r.err"; fi
    first=$(grep -o 'first_step_unix=[0-9.]*' "$OUT/$k$r.out" | cut -d= -f2)
    echo "$k round $r: first step $(python3 -c "print(round($first - $t0, 2))") s after launch (t0 $t0)"
  done
done
grep "smartlaunch\[" "$OUT/sl2.err" | head -30
echo pass > /tmp/nop.py
SMARTLAUNCH_RUN_DIR=$(mktemp -d) python3 -X importtime -m smartlaunch.launch.worker /tmp/nop.py 2>&1 | sort -t'|' -k2 -n | tail -8
python3 -c "
import time; t=time.perf_counter(); from smartlaunch.topology import discover; d=discover(); print('discover', round(time.perf_counter()-t,3), len(d.gpus))"
