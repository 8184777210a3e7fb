#!/usr/bin/env bash
# Issue 27 on a 4-GPU node, one device call (<= 10 min). Everything lands in $OUT/multi-n-4gpu/
# (records.jsonl, multi-n-4gpu.jsonl: the runner's records to append to bench/results/, README.md,
# summary.json, log.txt, topo.txt, dmon.txt: clocks/power each second) and
# $OUT/multi-n-4gpu-<call>.tar.gz. Arguments go to bench/multi_n_4gpu.py, e.g.
#   bash bench/diag/multi_n_4gpu.sh --call c1 --rows 1-12 --check
#   bash bench/diag/multi_n_4gpu.sh --call c2 --rows 1-12 --skip-done bench/work/records-c1.jsonl
# MN4_LIMIT: seconds this call may take in all (default 585, under run's 600); the bench gets
# what is left after the install, less a margin for the tar.
set -u
t0=$SECONDS
LIMIT=${MN4_LIMIT:-585}
cd "$(dirname "$0")/../.."
: "${OUT:?OUT must name the output folder}"
D=$OUT/multi-n-4gpu
mkdir -p "$D"
if [ -z "${MN4_NO_INSTALL:-}" ]; then     # MN4_NO_INSTALL=1: CPU tests, keep this venv as it is
    if ! python3 -m pip install -q --no-deps --no-build-isolation -e . >"$D/pip.log" 2>&1; then
        echo "pip install -e . failed; running from PYTHONPATH. Its last lines:"; tail -3 "$D/pip.log"
    fi
fi
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi topo -m >"$D/topo.txt" 2>&1
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,persistence_mode,clocks_throttle_reasons.active --format=csv >"$D/gpus-before.csv" 2>&1
# power, temperature, clocks and utilisation of every GPU each second (the clock-ramp question)
nvidia-smi dmon -s puc -d 1 -o T >"$D/dmon.txt" 2>&1 &
dmon=$!
budget=$(( LIMIT - (SECONDS - t0) - 20 ))
echo "bench budget: ${budget} s"
# through the runner: the records (machine, commit, this command) also go to multi-n-4gpu.jsonl
python3 -m bench run --data "$D/multi-n-4gpu.jsonl" multi-n-4gpu --out "$D" --budget "$budget" "$@" 2>&1 | tee "$D/log.txt"
kill "$dmon" 2>/dev/null
nvidia-smi --query-gpu=index,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv >"$D/gpus-after.csv" 2>&1
call=$(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1]).get('call','x'))" "$D/records.jsonl" 2>/dev/null || echo x)
tar czf "$OUT/multi-n-4gpu-$call.tar.gz" -C "$OUT" multi-n-4gpu
echo "wrote $OUT/multi-n-4gpu-$call.tar.gz after $(( SECONDS - t0 )) s"
tail -n 25 "$D/README.md" 2>/dev/null
