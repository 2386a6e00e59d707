#!/bin/bash
export PYTHONPATH=python_backend:build:clients:tests PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.." || exit 1
ADAFLASH_GPU_CHECK=1 timeout 80 python3 -m pytest -v -p no:cacheprovider tests/test_gpu.py -k "graphs or every_mode or every_tensor" 2>&1 | grep -v USDT > $OUT/tests.txt; grep -E "PASS|FAIL|passed|failed" $OUT/tests.txt | tail -12
timeout 150 python3 clients/bench_graphs.py --eval-data .gpudata/data --device cuda --dtype float32 --concurrency 1,8,32 --passes 2 --json $OUT/graphs-f32.json 2>&1 | grep -v USDT > $OUT/graphs.log; grep -E "concurrency|Error" $OUT/graphs.log | cut -c1-400
echo done
