#!/bin/bash
# Round 27, prepared for the next device session (no device was lent in rounds 26 and 27, so this has not run):
# the gate's exploration on graphed steps, round 26's fixed steps against round 27's regret budget (chat and code at
# 1, 8 and 32 sequences), then round 26's preference A/B and round 25's call split (docs/gpu/h200-round26/run1.sh).
export PYTHONPATH=python_backend:build:clients:tests PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi -L > $OUT/env.txt 2>&1
timeout 200 python3 docs/engine-speed/round27/explore_regret_ab.py --device cuda --dtype float32 \
  --eval-data .gpudata/data --warmup 1 --repeats 2 --max-tokens 64 --cells code:1,code:8,code:32,chat:8,chat:32 \
  --json $OUT/explore-regret-ab.json 2>&1 | grep -v USDT > $OUT/explore-regret-ab.log
tail -6 $OUT/explore-regret-ab.log | cut -c1-300
bash docs/gpu/h200-round26/run1.sh
echo done
