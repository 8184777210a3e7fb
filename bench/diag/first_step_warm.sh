#!/usr/bin/env bash
# Issue 35's warm-cache goal: time to the first step of a decided launch (`smartlaunch
# --nproc-per-node 2 S`, its profile and curve cached by one cold run first) against torchrun's,
# alternating, ROUNDS rounds; the script stamps its first step (first_step_unix=). The cold run's
# own time is printed too. Each launch's plan is in its stderr; every launch's output is in
# $OUT/first-step.tar.gz (one file: a device call returns only so many).
set -u
. "$(dirname "$0")/device_setup.sh"
FINAL_OUT=$OUT
OUT=$(mktemp -d)
export SMARTLAUNCH_CACHE_DIR=$(mktemp -d)
S="bench/suite/deep_mlp.py --steps 50 --warmup 5"
first() {   # $1: name, $2: start time
  f=$(grep -o 'first_step_unix=[0-9.]*' "$OUT/$1.out" | cut -d= -f2)
  python3 -c "print(round($f - $2, 3))" 2>/dev/null || echo "none"
}
t0=$(date +%s.%N)
smartlaunch --nproc-per-node 2 $S > "$OUT/cold.out" 2> "$OUT/cold.err"
echo "cold decided launch: rc $? first step $(first cold "$t0") s"; head -4 "$OUT/cold.err"
for r in $(seq 1 "${ROUNDS:-5}"); do
  for k in tr sl; do
    t0=$(date +%s.%N)
    if [ $k = tr ]; then python3 -m torch.distributed.run --standalone --nproc-per-node 2 $S > "$OUT/$k$r.out" 2> "$OUT/$k$r.err"
    else smartlaunch --nproc-per-node 2 $S > "$OUT/$k$r.out" 2> "$OUT/$k$r.err"; fi
    echo "$k round $r: rc $? first step $(first $k$r "$t0") s"
  done
done
head -5 "$OUT/sl1.err"
tar czf "$FINAL_OUT/first-step.tar.gz" -C "$OUT" .
