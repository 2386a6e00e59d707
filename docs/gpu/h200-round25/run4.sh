#!/bin/bash
# Round 25, fourth call: this round's code whole (the gate's copy arm, its longer blocks at low load and shared
# exploration; graphed prefills). The GPU tests of the graphs and every mode, then the gate benchmark as in the
# first call.
export PYTHONPATH=python_backend:build:clients:tests PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi -L > $OUT/env.txt 2>&1
ADAFLASH_GPU_CHECK=1 timeout 70 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "graphs or every_mode" 2>&1 | grep -v USDT > $OUT/tests.txt; tail -2 $OUT/tests.txt
timeout 250 python3 clients/bench_gate.py --model-dir models/default --eval-data .gpudata/data \
  --device cuda --dtype float32 --tie-tolerance 1e-3 --warmup 1 --repeats 2 --max-tokens 64 --concurrency 1,8,32 \
  --domains code,chat --json $OUT/gate.json 2>&1 | grep -v USDT > $OUT/gate.log; tail -6 $OUT/gate.log | cut -c1-300
echo done
