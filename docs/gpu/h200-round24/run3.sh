#!/bin/bash
# Round 24, third call: the gate's calls by arm at one sequence (gate_calls.py), the padded policy with its lookups
# kept (bench_step c=1), and the gate benchmark with three rounds.
export PYTHONPATH=python_backend:build:clients:tests PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi -L > $OUT/env.txt 2>&1
timeout 60 python3 docs/gpu/h200-round24/gate_calls.py --device cuda --dtype float32 --eval-data .gpudata/data \
    --prompts 16 --json $OUT/gate-calls.json 2>&1 | grep -v USDT | cut -c1-700
timeout 40 python3 clients/bench_step.py --device cuda --dtype float32 --eval-data .gpudata/data \
    --modes ngram,adaflash --concurrency 1 --prompts 16 --max-tokens 64 --repeats 1 --profile-steps 8 \
    --json $OUT/step-c1.json 2>&1 | grep -v USDT | grep -E "^(ngram|adaflash) |Error" | cut -c1-400
timeout 200 python3 clients/bench_gate.py --model-dir models/default --eval-data .gpudata/data \
  --device cuda --dtype float32 --tie-tolerance 1e-3 --warmup 1 --repeats 3 --max-tokens 64 --concurrency 1,8,32 \
  --domains code,chat --json $OUT/gate.json 2>&1 | grep -v USDT > $OUT/gate.log; tail -7 $OUT/gate.log
echo done
