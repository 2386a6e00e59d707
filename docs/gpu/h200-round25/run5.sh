#!/bin/bash
# Round 25, fifth call: where adaflash's time goes beside ngram's at 8 and 32 sequences over 64 prompts
# (step_kinds.py: calls that admit, calls that record a graph, and each arm's steps), then the gate benchmark at
# 8 sequences with three rounds.
export PYTHONPATH=python_backend:build:clients:tests PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi -L > $OUT/env.txt 2>&1
for c in 8 32; do
timeout 60 python3 docs/gpu/h200-round25/step_kinds.py --device cuda --dtype float32 --eval-data .gpudata/data \
    --prompts 64 --concurrency $c --json $OUT/step-kinds-c$c.json 2>&1 | grep -v USDT | cut -c1-900
done
timeout 110 python3 clients/bench_gate.py --model-dir models/default --eval-data .gpudata/data \
  --device cuda --dtype float32 --tie-tolerance 1e-3 --warmup 1 --repeats 3 --max-tokens 64 --concurrency 8 \
  --domains code,chat --json $OUT/gate.json 2>&1 | grep -v USDT > $OUT/gate.log; tail -2 $OUT/gate.log | cut -c1-300
echo done
