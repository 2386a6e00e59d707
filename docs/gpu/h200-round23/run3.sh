#!/bin/bash
export PYTHONPATH=python_backend:build:clients:tests PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.." || exit 1
ADAFLASH_GPU_CHECK=1 timeout 90 python3 -m pytest -v -p no:cacheprovider tests/test_gpu.py -k "graphs or every_mode or every_tensor or heads_plan" 2>&1 | tail -25 | tee $OUT/tests.txt
timeout 120 python3 clients/bench_graphs.py --eval-data .gpudata/data --device cuda --dtype float32 --concurrency 1,8,32 --passes 2 --json $OUT/graphs-f32.json 2>&1 | grep -v USDT | tail -14 | tee $OUT/graphs.log
timeout 220 python3 clients/bench_gate.py --model-dir models/default --eval-data .gpudata/data \
  --device cuda --dtype float32 --tie-tolerance 1e-3 --repeats 3 --max-tokens 64 --concurrency 1,8,32 \
  --domains code,chat --json $OUT/gate.json 2>&1 | grep -v USDT > $OUT/gate.log; tail -12 $OUT/gate.log
echo done
