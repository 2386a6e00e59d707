#!/bin/bash
export PYTHONPATH=python_backend:build:clients:tests PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.." || exit 1
{ nvidia-smi -L; nproc; python3 -c "import torch, numpy; print(torch.__version__, torch.version.cuda, numpy.__version__, torch.cuda.get_device_name(0))"; } 2>&1 | tee $OUT/env.txt
ADAFLASH_GPU_CHECK=1 timeout 100 python3 -m pytest -v -p no:cacheprovider tests/test_gpu.py tests/test_placement.py 2>&1 | tail -30 | tee $OUT/tests.txt
timeout 75 python3 clients/bench_graph_ceiling.py $OUT/graph-ceiling.json 2>&1 | grep -v USDT | tail -8 | tee $OUT/graph.log
timeout 70 python3 clients/bench_step.py --device cuda --dtype float32 --eval-data .gpudata/data \
    --modes ar,ngram,adaflash --concurrency 8 --prompts 16 --max-tokens 64 --repeats 2 --profile-steps 16 \
    --json $OUT/step-c8.json 2>&1 | grep -v USDT | tail -6 | tee $OUT/step.log
echo done
