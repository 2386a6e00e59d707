#!/bin/bash
# Round 24, second call: the padded policy (commit in env.txt) against call 1's figures, measured alike.
export PYTHONPATH=python_backend:build:clients:tests PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../../.." || exit 1
{ nvidia-smi -L; git log -1 --format=%h; } 2>&1 | tee $OUT/env.txt
for c in 1 8; do
timeout 60 python3 clients/bench_step.py --device cuda --dtype float32 --eval-data .gpudata/data \
    --modes ngram,adaflash --concurrency $c --prompts 16 --max-tokens 64 --repeats 1 --profile-steps 8 \
    --json $OUT/step-c$c.json 2>&1 | grep -v USDT | grep -E "^(ar|ngram|dflash|adaflash) |Error" | cut -c1-400
done
timeout 200 python3 clients/bench_gate.py --model-dir models/default --eval-data .gpudata/data \
  --device cuda --dtype float32 --tie-tolerance 1e-3 --warmup 1 --repeats 2 --max-tokens 64 --concurrency 1,8,32 \
  --domains code,chat --json $OUT/gate.json 2>&1 | grep -v USDT > $OUT/gate.log; tail -8 $OUT/gate.log
ADAFLASH_GPU_CHECK=1 timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "graphs or every_mode" 2>&1 | grep -v USDT > $OUT/tests.txt; tail -3 $OUT/tests.txt
echo done
