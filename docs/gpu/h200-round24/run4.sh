#!/bin/bash
# Round 24, fourth call: gate_calls.py at 32 and 8 sequences (where adaflash trails ar / ngram most).
export PYTHONPATH=python_backend:build:clients:tests PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../../.." || exit 1
for c in 32 8; do
timeout 75 python3 docs/gpu/h200-round24/gate_calls.py --device cuda --dtype float32 --eval-data .gpudata/data \
    --prompts $c --concurrency $c --json $OUT/gate-calls-c$c.json 2>&1 | grep -v USDT | cut -c1-200
done
echo done
