#!/usr/bin/env bash
# One device call (2 GPUs), issue 35: what the launcher's own processes do while the ranks step.
# torchrun and `smartlaunch --strategy ddp` run the small CNN over host memory one after the
# other, solo; over a window of WINDOW_S seconds in the middle of each run, the CPU time of every
# thread of every process of the job (launcher, guard, output copiers, ranks) by thread name and
# id, the libraries the launcher has mapped (an OpenMP runtime, libcuda) and its threads' wait
# channels. Lands in $OUT/launcher-threads.tar.gz.
#   WINDOW_S=10 bash bench/diag/launcher_threads.sh
set -u
. "$(dirname "$0")/device_setup.sh"
res="$OUT/res"; mkdir -p "$res"
export NCCL_P2P_DISABLE=1 PYTHONPATH=$PWD
W=${WINDOW_S:-10}
S=(bench/suite/cnn.py --batch-size 128 --warmup 20 --steps ${STEPS:-6000} --chunks 4)
SL=(python3 -c "import sys; from smartlaunch.cli import main; sys.argv[0] = 'smartlaunch'; sys.exit(main())")
tick() { getconf CLK_TCK; }
threads() {   # $1: out file; every thread of every process whose argv names the script, and the guard's
    for p in $(pgrep -f "bench/suite/cnn.py") $(pgrep -f "smartlaunch.guard"); do
        for t in /proc/$p/task/*; do
            [ -r "$t/stat" ] || continue
            # pid tid comm utime stime (fields 14, 15 of stat; comm may hold spaces: cut after ')')
            s=$(cat "$t/stat" 2>/dev/null) || continue
            rest=${s##*) }
            set -- $rest
            echo "$p ${t##*/} $(tr ' ' '_' < "$t/comm") ${12} ${13} $(cat "$t/wchan" 2>/dev/null)"
        done
    done > "$1"
}
for kind in torchrun sl-ddp; do
    if [ $kind = torchrun ]; then cmd=(python3 -m torch.distributed.run --standalone --nproc-per-node 2 "${S[@]}")
    else cmd=("${SL[@]}" --strategy ddp --standalone --nproc-per-node 2 "${S[@]}"); fi
    timeout 120 "${cmd[@]}" > "$res/$kind.out" 2> "$res/$kind.err" &
    pid=$!
    for i in $(seq 600); do grep -q "^first_step_unix=" "$res/$kind.out" 2>/dev/null && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
    sleep 3                                  # past the first steps' warm-up
    threads "$res/$kind-t0.txt"; date +%s.%N > "$res/$kind-t0.time"
    ps -eo pid,ppid,pgid,sid,pcpu,nlwp,rss,args --forest > "$res/$kind-ps.txt"
    for p in $(pgrep -f "bench/suite/cnn.py") $(pgrep -f "smartlaunch.guard"); do
        grep -oE "[^/ ]+\.so[.0-9]*" /proc/$p/maps 2>/dev/null | sort -u > "$res/$kind-$p.libs"
        tr '\0' ' ' < /proc/$p/cmdline > "$res/$kind-$p.cmd" 2>/dev/null
    done
    sleep "$W"
    threads "$res/$kind-t1.txt"; date +%s.%N > "$res/$kind-t1.time"
    wait $pid; echo "$kind rc $? $(grep -m1 -E 'samples/s' "$res/$kind.out" | cut -c1-100)"
done
echo "CLK_TCK $(tick)" > "$res/clk.txt"
python3 - "$res" <<'PY'
import sys, pathlib
res = pathlib.Path(sys.argv[1]); hz = int((res / "clk.txt").read_text().split()[1])
for kind in ("torchrun", "sl-ddp"):
    try:
        t0 = {(l.split()[0], l.split()[1]): l.split() for l in (res / f"{kind}-t0.txt").read_text().splitlines()}
        t1 = {(l.split()[0], l.split()[1]): l.split() for l in (res / f"{kind}-t1.txt").read_text().splitlines()}
        dt = float((res / f"{kind}-t1.time").read_text()) - float((res / f"{kind}-t0.time").read_text())
    except (OSError, ValueError):
        continue
    cmds = {p.name.split("-")[-1][:-4]: p.read_text()[:90] for p in res.glob(f"{kind}-*.cmd")}
    print(f"## {kind}: CPU seconds a second by thread over {dt:.1f} s")
    rows = []
    for k, b in t1.items():
        a = t0.get(k)
        if a is None:
            continue
        cpu = (int(b[3]) + int(b[4]) - int(a[3]) - int(a[4])) / hz / dt
        rows.append((cpu, k[0], k[1], b[2], b[5] if len(b) > 5 else ""))
    for cpu, p, t, name, wchan in sorted(rows, reverse=True)[:25]:
        print(f"{cpu:7.4f}  pid {p} tid {t} {name} [{wchan}]  {cmds.get(p, '')[:60]}")
PY
tar -C "$OUT" -czf "$OUT/launcher-threads.tar.gz" res && rm -rf "$res"
