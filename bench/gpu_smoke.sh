#!/usr/bin/env bash
# Short end-to-end check on a lent multi-GPU machine before the long benchmark runs.
set -x
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi topo -m; nvidia-smi topo -p2p n
python3 -c "import torch, torchvision; print(torch.__version__, torchvision.__version__, torch.cuda.device_count(), torch.cuda.nccl.version())"
which numactl py-spy; nproc
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2; which smartlaunch; head -1 $(which smartlaunch)
smartlaunch-node topo
smartlaunch-node topo --json > $OUT/topo.json
python3 bench/topology_bench.py 2>&1 | tail -3
time smartlaunch-node bench-comm 2>&1 | tail -12
for c in "" "NCCL_P2P_DISABLE=1" "NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1"; do
  ( time env $c smartlaunch --explain --nproc-per-node 2 examples/train.py --model large --steps 100000 ) 2>&1 | tail -45
done
time smartlaunch --explain=json --nproc-per-node 2 examples/train.py --model large --steps 100000 > $OUT/plan.json
time smartlaunch --strategy ddp --nproc-per-node 2 examples/train.py --model large --steps 100 2>&1 | tail -5
time smartlaunch --nproc-per-node 2 examples/train.py --model large --steps 100 2>&1 | tail -5
