#!/usr/bin/env bash
# The cold decision before and after the Session rewrite, on the same lent machine, one
# command at a time: bench/cold_decision.py per script, the old code (a snapshot of the
# package in $OLD, run by PYTHONPATH) and the new one alternating. Also checks that the
# torch-free torchrun parser equals torch's on this machine's torch. Output under $OUT.
#   OLD=bench/_ab_old SCRIPTS="hf-style-b32 embbag-b4096 gpt-1b-b4" bash bench/diag/session_ab.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PATH=$(dirname "$(command -v python3)"):$PATH
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 9
python3 - > $OUT/parser-check.txt 2>&1 <<'PY'
import torch
from torch.distributed.run import get_args_parser
from smartlaunch.cli import _torchrun_parser_from_source
f = lambda p: [(tuple(a.option_strings), a.dest, repr(a.default), a.nargs, repr(a.const),
                tuple(a.choices or ()), getattr(a.type, "__name__", None), a.required, a.help)
               for a in p._actions]
print("torch", torch.__version__, "parser from source == torch's:", f(_torchrun_parser_from_source()) == f(get_args_parser()))
PY
NEW=$PWD
for s in ${SCRIPTS:-hf-style-b32 embbag-b4096}; do
  for v in new old; do
    pp=$NEW; [ $v = old ] && pp=$NEW/$OLD
    CUDA_VISIBLE_DEVICES=${AB_GPUS:-0,1} PYTHONPATH=$pp timeout 400 python3 bench/cold_decision.py --scripts $s --conditions nvlink \
      --which ${WHICH:-trials,throughput} --json $OUT/cold-$s-$v.json --out $OUT/cold-$s-$v.md \
      > $OUT/log-$s-$v.txt 2>&1
    rc=$?
    left=$(pgrep -fc "smartlaunch\.(profile|warm)" || true)
    echo "$s $v rc=$rc left=$left" >> $OUT/summary.txt
  done
done
# The DataLoader pattern that once hung the warm path (6 persistent pinned workers), new code,
# through the early-start path (default on a node with cores to spare), then what is left.
rm -rf /tmp/h; mkdir -p /tmp/h
t0=$(date +%s.%N)
CUDA_VISIBLE_DEVICES=${AB_GPUS:-0,1} HOME=/tmp/h XDG_CACHE_HOME=/tmp/h/.cache timeout 170 smartlaunch --explain=json \
  bench/diag/loader_train.py --batch 128 --workers 6 --steps 200 > $OUT/loader6-plan.json 2> $OUT/loader6-err.txt
rc=$?; t1=$(date +%s.%N)
echo "loader6 rc=$rc wall=$(python3 -c "print(round($t1 - $t0, 1))") left=$(pgrep -fc 'smartlaunch\.profile|loader_train' || true)" >> $OUT/summary.txt
# Derived all-reduce curves against measured ones on every GPU of the node
if [ -n "${DERIVE:-}" ]; then
  PYTHONPATH=$NEW timeout 120 python3 bench/comm_derive.py --ns 2,3,4 --conditions nvlink,host \
    --out $OUT/comm-derive > $OUT/comm-derive.log 2>&1
  echo "comm_derive rc=$?" >> $OUT/summary.txt
fi
cat $OUT/summary.txt $OUT/parser-check.txt
