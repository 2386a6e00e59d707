#!/bin/bash
# Round 26, prepared for the next device session (no device was lent in round 26, so this has not run):
# round 25's split of adaflash's calls beside ngram's at 8 sequences (step_kinds.py), then the gate's preference for
# plain decoding on graphed steps (0 against round 26's 0.1), chat and code at 1, 8 and 32 sequences.
export PYTHONPATH=python_backend:build:clients:tests PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi -L > $OUT/env.txt 2>&1
timeout 60 python3 docs/gpu/h200-round25/step_kinds.py --device cuda --dtype float32 --eval-data .gpudata/data \
    --prompts 64 --concurrency 8 --json $OUT/step-kinds-c8.json 2>&1 | grep -v USDT | cut -c1-900
timeout 200 python3 docs/engine-speed/round26/preference_ab.py --device cuda --dtype float32 \
  --eval-data .gpudata/data --warmup 1 --repeats 2 --max-tokens 64 --concurrency 1,8,32 --domains code,chat \
  --preferences 0,0.1 --json $OUT/preference-ab.json 2>&1 | grep -v USDT > $OUT/preference-ab.log
tail -6 $OUT/preference-ab.log | cut -c1-300
echo done
