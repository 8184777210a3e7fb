#!/usr/bin/env bash
# Issue 18 on a lent 2-GPU machine (one call): straggler by extra matmuls, overhead of the work
# timer, a skipped all-reduce, and torch's Flight Recorder variable names. Writes to $OUT.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
W=/tmp/d18out; mkdir -p $W
export SMARTLAUNCH_LOG_DIR=$W/runs SMARTLAUNCH_CACHE_DIR=/tmp/slcache
D=bench/diag
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
export PATH=$(python3 -c 'import sys,os;print(os.path.dirname(sys.executable))'):$PATH
python3 -c "import torch; print(torch.__version__, torch.cuda.nccl.version())" > $W/env.txt
nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,temperature.gpu,power.draw >> $W/env.txt
python3 - > $W/torch_fr_vars.txt <<'PY'
import mmap, os, re, torch
lib = os.path.join(os.path.dirname(torch.__file__), "lib")
names = set()
for so in ("libtorch_cuda.so", "libtorch_cpu.so"):
    with open(os.path.join(lib, so), "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        names |= {x.decode() for x in re.findall(rb"TORCH_(?:FR|NCCL)_(?:BUFFER|TRACE|DUMP|DEBUG_INFO)[A-Z_]*", m)}
print("\n".join(sorted(names)))
PY
python3 $D/hook_overhead.py 10 150 > $W/hook_overhead.log 2>&1
# 1. straggler: rank 1 does one extra 4096^3 fp32 matmul per step
( time timeout 90 smartlaunch --policy $D/policy.yaml --strategy ddp --nproc-per-node 2 $D/straggler_train.py --slow-rank 1 --extra 1 --batch 512 --seconds 30 ) 2>&1 | python3 $D/stamp.py > $W/straggler.log
# 2. the same without a slow rank: under smartlaunch (work timer on) and torchrun (off)
( time timeout 60 smartlaunch --policy $D/policy.yaml --strategy ddp --nproc-per-node 2 $D/straggler_train.py --slow-rank -1 --batch 512 --seconds 12 ) 2>&1 | python3 $D/stamp.py > $W/balanced-smartlaunch.log
( time timeout 60 torchrun --nproc-per-node 2 $D/straggler_train.py --slow-rank -1 --batch 512 --seconds 12 ) 2>&1 | python3 $D/stamp.py > $W/balanced-torchrun.log
# 3. a rank that skips one all-reduce
( time timeout 90 smartlaunch --policy $D/policy.yaml --strategy ddp --nproc-per-node 2 $D/skip_allreduce.py --skip-step 200; echo "exit $?" ) 2>&1 | python3 $D/stamp.py > $W/skip.log
# torch releases that make the dump pipe only under the older buffer variable: try it once
if grep -q "no Flight Recorder pipe" $W/skip.log; then
  ( time TORCH_NCCL_TRACE_BUFFER_SIZE=2000 timeout 90 smartlaunch --policy $D/policy.yaml --strategy ddp --nproc-per-node 2 $D/skip_allreduce.py --skip-step 200; echo "exit $?" ) 2>&1 | python3 $D/stamp.py > $W/skip-oldname.log
fi
ls -laR $W/runs > $W/runs-listing.txt
tar czf $OUT/d18-all.tgz -C $W .
cp $W/*.log $W/torch_fr_vars.txt $OUT/
tail -4 $W/*.log; cat $W/torch_fr_vars.txt $W/env.txt
