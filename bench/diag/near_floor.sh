#!/usr/bin/env bash
# Near the default policy's floor (bench/near_floor.py): torchrun's own DDP×N efficiency, round
# after round, against the default policy's cold decisions and their near-floor draws. One file
# back: $OUT/near-floor.json. SCRIPTS, NPROC, ROUNDS, BUDGET (seconds) override the defaults.
set -u
. "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
python3 bench/near_floor.py --scripts "${SCRIPTS:-cnn-small-b128,bn-convnet-b64}" \
  --condition host --nproc "${NPROC:-2}" --rounds "${ROUNDS:-4}" --budget "${BUDGET:-480}" \
  --out "$OUT/near-floor.json"
