#!/bin/bash
# One device call: the GPU tests, then the engine's gate benchmark on CUDA (fp32, default models, shared sets),
# then the bf16 bench of `make gpu-check` on the tiny models. Every step bounded; logs under $OUT.
export PYTHONPATH=python_backend:build:clients:tests PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.." || exit 1
{ nvidia-smi -L; nproc; python3 -c "import torch, numpy; print(torch.__version__, torch.version.cuda, numpy.__version__, torch.cuda.get_device_name(0))"; } 2>&1 | tee $OUT/env.txt
ADAFLASH_GPU_CHECK=1 timeout 150 python3 -m pytest -v -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -25 | tee $OUT/tests.txt
timeout ${GATE_S:-270} python3 clients/bench_gate.py --model-dir models/default --eval-data .gpudata/data \
  --device cuda --dtype float32 --tie-tolerance 1e-3 --repeats 2 --max-tokens 64 --concurrency 1,8,32,64 \
  --json $OUT/gate-cuda-f32.json 2>&1 | tee $OUT/gate.log | tail -30
timeout 80 python3 -m adaflash.cli bench --tiny-random --device cuda --dtype bfloat16 --tie-tolerance 0.03 \
  --modes ar,ngram,dflash,adaflash --concurrency 1,8,32 --max-tokens 64 --json $OUT/bench-tiny-bf16.json 2>&1 | tail -20 | tee $OUT/tiny.log
echo done
