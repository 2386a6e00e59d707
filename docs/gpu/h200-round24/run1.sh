#!/bin/bash
# Round 24, first call: where a drafting step's time goes on the GPU (bench_step with the draft clock and the
# cumulative host profile, c=1 and c=8), then the gate benchmark on graphed steps after a warm-up round, then the
# GPU tests of the graphs. Every step bounded; logs under $OUT.
export PYTHONPATH=python_backend:build:clients:tests PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../../.." || exit 1
{ nvidia-smi -L; python3 -c "import torch, numpy; print(torch.__version__, torch.version.cuda, numpy.__version__)"; git log -1 --format=%h; } 2>&1 | tee $OUT/env.txt
for c in 1 8; do
timeout 75 python3 clients/bench_step.py --device cuda --dtype float32 --eval-data .gpudata/data \
    --modes ar,ngram,dflash,adaflash --concurrency $c --prompts 16 --max-tokens 64 --repeats 1 --profile-steps 8 \
    --json $OUT/step-c$c.json 2>&1 | grep -v USDT | grep -E "^(ar|ngram|dflash|adaflash) |Error" | cut -c1-400
done
timeout 230 python3 clients/bench_gate.py --model-dir models/default --eval-data .gpudata/data \
  --device cuda --dtype float32 --tie-tolerance 1e-3 --warmup 1 --repeats 2 --max-tokens 64 --concurrency 1,8,32 \
  --domains code,chat --json $OUT/gate.json 2>&1 | grep -v USDT > $OUT/gate.log; tail -8 $OUT/gate.log
ADAFLASH_GPU_CHECK=1 timeout 80 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "graphs or every_mode" 2>&1 | grep -v USDT > $OUT/tests.txt; tail -3 $OUT/tests.txt
echo done
