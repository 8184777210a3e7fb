#!/usr/bin/env bash
# Where smartlaunch's DDP launch loses to torchrun on a launch-bound script (2x H100, small CNN
# over host memory: 0.894 over 3 ABAB rounds of bench/ddp_overhead.py). One torchrun each,
# in rounds, one job at a time: A the script; B the script under the worker hook with its step
# and work-time hooks (SMARTLAUNCH_RUN_DIR set, as a launch gives it); C the hook without them;
# D the script with the Flight Recorder variables a launch adds (flightrec.recorder_env). The
# only other differences in a rank's environment are smartlaunch's own names and the tee of its
# output (checked on the CPU, 2026-11-26). Then the launch itself: E `smartlaunch --strategy
# ddp`; F the same with the watchdog's NVML sample (a whole topology read, ~0.07 s, every
# launch.gpu_sample_s = 5 s) once an hour.
#   ROUNDS=2 SCRIPT="bench/suite/cnn.py --steps 600 --warmup 20" bash bench/diag/worker_cost.sh
set -u
: "${OUT:?OUT must name the output folder}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_P2P_DISABLE=${NCCL_P2P_DISABLE-1} PYTHONPATH=$PWD
SCRIPT=${SCRIPT:-bench/suite/cnn.py --steps 600 --warmup 20}
NPROC=${NPROC:-2}
run() {  # label, then what follows torchrun's options
    local label=$1; shift
    local line
    line=$(timeout 120 python3 -m torch.distributed.run --standalone --nproc-per-node "$NPROC" \
        "$@" 2>&1 | grep '^throughput:' | tail -1)
    echo "$label $line" | tee -a "$OUT/worker-cost.txt"
}
sl() {   # label, then smartlaunch's arguments
    local label=$1; shift
    local line
    line=$(timeout 180 python3 -c "import sys; from smartlaunch.cli import main; sys.argv[0] = 'smartlaunch'; sys.exit(main())" \
        "$@" 2>&1 | grep '^throughput:' | tail -1)
    echo "$label $line" | tee -a "$OUT/worker-cost.txt"
}
for r in $(seq "${ROUNDS:-2}"); do
    run A $SCRIPT
    rd=$(mktemp -d)
    SMARTLAUNCH_RUN_DIR=$rd SMARTLAUNCH_RUN_ID=wc$r run B -m smartlaunch.launch.worker $SCRIPT
    rm -rf "$rd"
    run C -m smartlaunch.launch.worker $SCRIPT
    fr=$(mktemp -d)
    TORCH_FR_BUFFER_SIZE=2000 TORCH_FR_DUMP_TEMP_FILE=$fr/rank TORCH_NCCL_DEBUG_INFO_PIPE_FILE=$fr/pipe \
        run D $SCRIPT
    rm -rf "$fr"
    sl E --strategy ddp --nproc-per-node "$NPROC" $SCRIPT
    pol=$(mktemp --suffix=.yaml)
    printf 'launch:\n  gpu_sample_s: 3600\n' > "$pol"
    sl F --policy "$pol" --strategy ddp --nproc-per-node "$NPROC" $SCRIPT
    rm -f "$pol"
done
