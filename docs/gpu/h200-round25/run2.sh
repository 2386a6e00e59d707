#!/bin/bash
# Round 25, second call: the gate benchmark at 8 and 32 sequences with the calls each arm ran per cell
# (bench_gate's `arms`), to see where the gated runs that trail prompt lookup or plain decoding spend their calls.
export PYTHONPATH=python_backend:build:clients:tests PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi -L > $OUT/env.txt 2>&1
timeout 220 python3 clients/bench_gate.py --model-dir models/default --eval-data .gpudata/data \
  --device cuda --dtype float32 --tie-tolerance 1e-3 --warmup 1 --repeats 2 --max-tokens 64 --concurrency 8,32 \
  --domains code,chat --json $OUT/gate.json 2>&1 | grep -v USDT > $OUT/gate.log; tail -4 $OUT/gate.log | cut -c1-300
echo done
