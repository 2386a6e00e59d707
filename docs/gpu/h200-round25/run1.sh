#!/bin/bash
# Round 25, first call: the gate with its copy arm (prompt lookup's steps) and blocks of 32 sequence steps. Calls by
# arm and load at 1 and 8 sequences (round 24's gate_calls.py), then the gate benchmark on graphed steps after a
# warm-up round, then the GPU tests of every mode. Every step bounded; logs under $OUT.
export PYTHONPATH=python_backend:build:clients:tests PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../../.." || exit 1
{ nvidia-smi -L; python3 -c "import torch, numpy; print(torch.__version__, torch.version.cuda, numpy.__version__)"; } 2>&1 | tee $OUT/env.txt
for c in 1 8; do
timeout 70 python3 docs/gpu/h200-round24/gate_calls.py --device cuda --dtype float32 --eval-data .gpudata/data \
    --prompts 16 --concurrency $c --json $OUT/gate-calls-c$c.json 2>&1 | grep -v USDT | cut -c1-900
done
timeout 230 python3 clients/bench_gate.py --model-dir models/default --eval-data .gpudata/data \
  --device cuda --dtype float32 --tie-tolerance 1e-3 --warmup 1 --repeats 2 --max-tokens 64 --concurrency 1,8,32 \
  --domains code,chat --json $OUT/gate.json 2>&1 | grep -v USDT > $OUT/gate.log; tail -8 $OUT/gate.log
ADAFLASH_GPU_CHECK=1 timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "every_mode" 2>&1 | grep -v USDT > $OUT/tests.txt; tail -3 $OUT/tests.txt
echo done
