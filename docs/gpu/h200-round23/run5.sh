#!/bin/bash
export PYTHONPATH=python_backend:build:clients:tests PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.." || exit 1
for c in 1 8; do
timeout 85 python3 clients/bench_step.py --device cuda --dtype float32 --eval-data .gpudata/data \
    --modes ar,ngram,adaflash --concurrency $c --prompts 16 --max-tokens 64 --repeats 1 --profile-steps 8 \
    --json $OUT/step-graphs-c$c.json 2>&1 | grep -v USDT | grep -E "^(ar|ngram|adaflash) " | cut -c1-330
done
echo done
