#!/usr/bin/env bash
# Issue 35's warm-cache goal: time to the first step of a decided launch (`smartlaunch
# --nproc-per-node 2 S`, its profile and curve cached by one cold run first) against torchrun's,
# alternating, ROUNDS rounds (default 10). Rank 0 of the script stamps its process's start, the end
# of its imports and its first step (bench/suite/_harness.py), so each launch's time splits into
# the launcher's part (to the rank's process), the rank's imports (smartlaunch's worker hook
# included) and the script's own set-up to its first step; pair differences (smartlaunch −
# torchrun) with a t interval for each. Every launch's output is in $OUT/first-step.tar.gz.
# SL_ARGS: smartlaunch's own options, e.g. "--policy bench/policy-throughput.yaml" (DDP×2 decided).
set -u
. "$(dirname "$0")/device_setup.sh"
FINAL_OUT=$OUT
OUT=$(mktemp -d)
export SMARTLAUNCH_CACHE_DIR=$(mktemp -d)
S="bench/suite/deep_mlp.py --steps 50 --warmup 5"
stamps() {   # $1: name, $2: launch time -> "t0 process imported first" (unix seconds)
  echo "$2 $(for k in process_start imported first_step; do grep -o "^${k}_unix=[0-9.]*" "$OUT/$1.out" | cut -d= -f2; done | tr '\n' ' ')"
}
t0=$(date +%s.%N)
smartlaunch ${SL_ARGS:-} --nproc-per-node 2 $S > "$OUT/cold.out" 2> "$OUT/cold.err"
echo "cold decided launch: rc $? stamps $(stamps cold "$t0")"; head -4 "$OUT/cold.err"
for r in $(seq 1 "${ROUNDS:-10}"); do
  for k in tr sl; do
    t0=$(date +%s.%N)
    if [ $k = tr ]; then python3 -m torch.distributed.run --standalone --nproc-per-node 2 $S > "$OUT/$k$r.out" 2> "$OUT/$k$r.err"
    else smartlaunch ${SL_ARGS:-} --nproc-per-node 2 $S > "$OUT/$k$r.out" 2> "$OUT/$k$r.err"; fi
    echo "$k $r $? $(stamps $k$r "$t0")" | tee -a "$OUT/stamps.txt"
  done
done
head -3 "$OUT/sl1.err"
python3 - "$OUT/stamps.txt" <<'PY' | tee "$OUT/summary.txt"
import statistics as st, sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 7 and f[2] == "0":
        t0, proc, imp, first = map(float, f[3:])
        rows[(f[0], f[1])] = {"to the rank's process": proc - t0, "rank's imports": imp - proc,
                              "set-up to the first step": first - imp, "launch to first step": first - t0}
T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23,
        11: 2.20, 12: 2.18, 14: 2.14, 19: 2.09, 29: 2.05}
pairs = sorted({r for _, r in rows if ("tr", r) in rows and ("sl", r) in rows}, key=int)
print(f"{len(pairs)} pairs; seconds, smartlaunch − torchrun (median torchrun / smartlaunch)")
for part in ("to the rank's process", "rank's imports", "set-up to the first step", "launch to first step"):
    d = [rows[("sl", r)][part] - rows[("tr", r)][part] for r in pairs]
    if len(d) < 2:
        continue
    m, se = st.mean(d), st.stdev(d) / len(d) ** 0.5
    t = T975.get(len(d) - 1, T975[max(k for k in T975 if k <= len(d) - 1)])
    print(f"{part:26s} mean {m:+.3f} (95% {m - t * se:+.3f} to {m + t * se:+.3f}), median {st.median(d):+.3f}"
          f"   [{st.median(rows[('tr', r)][part] for r in pairs):.3f} / {st.median(rows[('sl', r)][part] for r in pairs):.3f}]")
PY
tar czf "$FINAL_OUT/first-step.tar.gz" -C "$OUT" .
