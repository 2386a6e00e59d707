#!/bin/bash
# Round 24, fifth call: gate_calls.py at 8 and 32 sequences with the planner timed and adaflash without the drafter's
# features (what planning costs apart from the drafter's context).
export PYTHONPATH=python_backend:build:clients:tests PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../../.." || exit 1
for c in 8 32; do
timeout 75 python3 docs/gpu/h200-round24/gate_calls.py --device cuda --dtype float32 --eval-data .gpudata/data \
    --prompts $c --concurrency $c --json $OUT/gate-calls-c$c.json 2>&1 | grep -v USDT | cut -c1-140
done
echo done
