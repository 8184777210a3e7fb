#!/usr/bin/env bash
# One device call (2 GPUs), issue 35: the decided launch (sl-auto) read 0.953 of torchrun on the
# small CNN over host memory where --strategy ddp reads ~0.985. (1) What each launch's ranks run
# with and what runs beside them: one launch of each, solo, snapshots of every process of the
# script (argv, environment, Threads, Cpus_allowed_list) and the process tree every 2 s.
# (2) SESSIONS baton sessions of torchrun against sl-auto (one launch pair each, so the spread
# over launch pairs shows).  SESSIONS=3 PAIRS=40 bash bench/diag/auto_vs_ddp.sh
set -u
. "$(dirname "$0")/device_setup.sh"
res="$OUT/res"; mkdir -p "$res"
export NCCL_P2P_DISABLE=1 PYTHONPATH=$PWD
S=(bench/suite/cnn.py --batch-size 128 --warmup 20 --steps ${STEPS:-4000} --chunks 4)
SL=(python3 -c "import sys; from smartlaunch.cli import main; sys.argv[0] = 'smartlaunch'; sys.exit(main())")
snap() {   # $1: label; while the job runs, every 2 s
    local i=0
    while kill -0 "$2" 2>/dev/null && [ $i -lt 20 ]; do
        i=$((i + 1)); sleep 2
        d="$res/snap-$1/$i"; mkdir -p "$d"
        ps -eo pid,ppid,pgid,pcpu,nlwp,rss,args --forest > "$d/ps.txt"
        for p in $(pgrep -f "bench/suite/cnn.py"); do
            tr '\0' '\n' < /proc/$p/environ 2>/dev/null | sort > "$d/$p.env"
            tr '\0' ' ' < /proc/$p/cmdline > "$d/$p.cmd" 2>/dev/null
            grep -E "^(Threads|Cpus_allowed_list|Mems_allowed_list|voluntary|nonvoluntary)" /proc/$p/status > "$d/$p.status" 2>/dev/null
            ls /proc/$p/task 2>/dev/null | while read t; do cat /proc/$p/task/$t/comm; done | sort | uniq -c > "$d/$p.threads"
        done
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv > "$d/apps.txt" 2>&1
    done
}
timeout 100 "${SL[@]}" --policy bench/policy-throughput.yaml --nproc-per-node 2 --explain "${S[@]}" > "$res/cold.out" 2> "$res/cold.err"
tail -2 "$res/cold.err"
for kind in auto ddp; do
    extra=(); [ $kind = ddp ] && extra=(--strategy ddp)
    timeout 90 "${SL[@]}" --policy bench/policy-throughput.yaml "${extra[@]}" --standalone --nproc-per-node 2 "${S[@]}" > "$res/$kind.out" 2> "$res/$kind.err" &
    pid=$!; snap $kind $pid; wait $pid; echo "$kind rc $? $(grep -m1 -E 'samples/s' "$res/$kind.out" | cut -c1-120)"
done
for s in $(seq "${SESSIONS:-3}"); do    # none started past BUDGET seconds (default 330)
    [ $SECONDS -gt "${BUDGET:-330}" ] && break
    timeout 170 python3 bench/job_overhead.py --conditions host --kinds torchrun sl-auto \
        --scripts cnn-small --baton "${PAIRS:-40}" --window-s 0.3 --out "$res/auto-$s" \
        2>>"$res/baton.log" | grep "^| host"
done
tar -C "$OUT" -czf "$OUT/auto-vs-ddp.tar.gz" res && rm -rf "$res"
