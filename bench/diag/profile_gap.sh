#!/usr/bin/env bash
# Issue 15 on a lent 2-GPU machine (one call): why the dry run's step time is above the
# scripts' own (many-tensors +31%, HF-style +8.6%, BN VGG +7%), and what DDP adds per
# gradient tensor when the step is host-bound. Writes $OUT/profile-gap.tar.gz.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
W=/tmp/gap; rm -rf $W; mkdir -p $W
export SMARTLAUNCH_LOG_DIR=$W/runs SMARTLAUNCH_CACHE_DIR=$W/cache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PATH=$(python3 -c 'import sys,os;print(os.path.dirname(sys.executable))'):$PATH
S=bench/suite
{ python3 -c "import torch; print(torch.__version__, torch.cuda.nccl.version())"; nproc
  lscpu | grep -i "model name"; nvidia-smi --query-gpu=index,name,clocks.sm --format=csv; } > $W/env.txt 2>&1
one() {  # name, then the command; output and seconds to $W/name.log
  local name=$1; shift
  local t0=$(date +%s.%N)
  timeout 120 "$@" > $W/$name.log 2>&1
  echo "rc=$? wall=$(echo "$(date +%s.%N) - $t0" | bc)" >> $W/$name.log
}
g0() { CUDA_VISIBLE_DEVICES=0 "$@"; }
for s in many_tensors hf_style bn_convnet; do
  g0 one $s-own python3 $S/$s.py --steps 100 --warmup 20
  g0 one $s-bare python3 bench/diag/bare_steps.py 20 $S/$s.py --steps 100 --warmup 20
  g0 one $s-dry5 python3 -m smartlaunch.profile.dryrun --out $W/$s-dry5.json --warmup 5 --measure 50 --min-seconds 3 $S/$s.py --steps 400 --warmup 0
  g0 one $s-dry30 python3 -m smartlaunch.profile.dryrun --out $W/$s-dry30.json --warmup 30 --measure 50 --min-seconds 3 $S/$s.py --steps 400 --warmup 0
  g0 one $s-explain smartlaunch --explain=json --reprofile $S/$s.py
done
# per-tensor cost of DDP on a host-bound step: blocks x batch, single then DDP x2 (NVLink)
for cfg in "100 256" "300 256" "600 256" "300 4096"; do
  set -- $cfg
  g0 one mt-b$1-n$2-single python3 $S/many_tensors.py --blocks $1 --batch-size $2 --steps 60 --warmup 20
  one mt-b$1-n$2-ddp torchrun --standalone --nproc-per-node 2 $S/many_tensors.py --blocks $1 --batch-size $2 --steps 60 --warmup 20
done
g0 one mt-single-again python3 $S/many_tensors.py --steps 100 --warmup 20
tar czf $OUT/profile-gap.tar.gz -C /tmp gap
