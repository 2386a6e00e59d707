#!/bin/bash
export PYTHONPATH=python_backend:build:clients:tests PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.." || exit 1
ADAFLASH_GPU_CHECK=1 timeout 110 python3 -m pytest -v -p no:cacheprovider tests/test_gpu.py -k "graphs or every_mode or every_tensor or heads_plan" 2>&1 | tail -25 | tee $OUT/tests.txt
timeout 200 python3 clients/bench_graphs.py --eval-data .gpudata/data --device cuda --dtype float32 --concurrency 1,8,32 --passes 2 --json $OUT/graphs-f32.json 2>&1 | grep -v USDT | tail -14 | tee $OUT/graphs.log
echo done
