#!/usr/bin/env bash
# One device call, issue 35: what a rank runs with under torchrun and under smartlaunch
# (KINDS: torchrun, sl-ddp = --strategy ddp, sl-auto = the decided launch, warm: decided once
# first, not looked at), NPROC ranks (2), solo, the deep MLP over NVLink (COND, SCRIPT_ARGS):
# per rank process every 2 s, its environment, argv, /proc status (threads, CPU and memory
# lists, context switches), scheduling class and nice, NUMA policy of its mappings, cgroup,
# limits and open files. Baton sessions in the same call: run bench/diag/baton_launches.sh after it.
#   bash bench/diag/rank_state.sh; ROWS="host:cnn-small:sl-auto" bash bench/diag/baton_launches.sh
#   NPROC=1 KINDS="torchrun sl-auto" bash bench/diag/rank_state.sh
set -u
. "$(dirname "$0")/device_setup.sh"
res="$OUT/res"; mkdir -p "$res"
export PYTHONPATH=$PWD
[ "${COND:-nvlink}" = host ] && export NCCL_P2P_DISABLE=1
S=(bench/suite/deep_mlp.py ${SCRIPT_ARGS:---batch-size 256 --warmup 20 --steps 4000 --chunks 4})
N=${NPROC:-2}
SL=(python3 -c "import sys; from smartlaunch.cli import main; sys.argv[0] = 'smartlaunch'; sys.exit(main())")
snap() {   # $1: label, $2: the launch's pid; 6 looks, 2 s apart, from the first step on
    for _ in $(seq 1 120); do      # the harness prints first_step_unix= after rank 0's first step
        grep -q first_step_unix "$res/$1.out" 2>/dev/null && break
        kill -0 "$2" 2>/dev/null || break; sleep 0.5
    done
    for i in 1 2 3 4 5 6; do
        sleep 2; kill -0 "$2" 2>/dev/null || break
        d="$res/snap-$1/$i"; mkdir -p "$d"
        ps -eo pid,ppid,pgid,cls,ni,pri,pcpu,nlwp,rss,args --forest > "$d/ps.txt"
        for p in $(pgrep -f "${S[0]}"); do
            grep -q LOCAL_RANK /proc/$p/environ 2>/dev/null || continue
            tr '\0' '\n' < /proc/$p/environ 2>/dev/null | sort > "$d/$p.env"
            tr '\0' ' ' < /proc/$p/cmdline > "$d/$p.cmd" 2>/dev/null
            cat /proc/$p/status > "$d/$p.status" 2>/dev/null
            cat /proc/$p/cgroup /proc/$p/limits > "$d/$p.cg" 2>/dev/null
            awk '{print $2}' /proc/$p/numa_maps 2>/dev/null | sort | uniq -c > "$d/$p.numa"
            ls -l /proc/$p/fd 2>/dev/null | awk '{print $9, $10, $11}' > "$d/$p.fd"
            for t in /proc/$p/task/*; do
                echo "$(cat $t/comm) $(awk '{print $39, $18, $19}' $t/stat) $(cat $t/sched 2>/dev/null | awk '/nr_switches|nr_voluntary|nr_involuntary/{printf "%s=%s ", $1, $3}')"
            done > "$d/$p.tasks"
        done
    done
}
for kind in ${KINDS:-torchrun sl-ddp}; do
    case $kind in
    torchrun) cmd=(python3 -m torch.distributed.run --standalone --nproc-per-node "$N" "${S[@]}") ;;
    sl-ddp) cmd=("${SL[@]}" --strategy ddp --standalone --nproc-per-node "$N" "${S[@]}") ;;
    sl-auto) cmd=("${SL[@]}" --policy bench/policy-throughput.yaml --standalone --nproc-per-node "$N" "${S[@]}")
        timeout 120 "${cmd[@]}" > "$res/$kind-cold.out" 2> "$res/$kind-cold.err" ;;
    *) echo "unknown kind $kind"; continue ;;
    esac
    timeout 60 "${cmd[@]}" > "$res/$kind.out" 2> "$res/$kind.err" &
    pid=$!; snap $kind $pid; wait $pid
    echo "$kind rc $? $(grep -m1 -E 'samples/s' "$res/$kind.out" | cut -c1-100)"
done
tar -C "$OUT" -czf "$OUT/rank-state.tar.gz" res && rm -rf "$res"
