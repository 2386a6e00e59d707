#!/bin/bash
# The GPU check, in the order that says most if it is cut short: the GPU tests, where a step's time goes
# (bench_step: the forward's device time against the host's own work, per-operator device time; bench_graph_ceiling:
# what the same layers cost replayed as a CUDA graph; bench_graphs: the engine with graphed steps against eager), the
# plan gate's benchmark on the evaluation sets (EVAL_DATA) (adaflash against the best fixed mode, fp32, outputs equal to ar's up to
# near-ties), then `adaflash bench` in bf16 on the tiny models. Each part is bounded (seconds in *_S) and writes
# under OUT as it goes; a part that fails does not stop the next.
#   make gpu-check                       (the project's venv; OUT=bench-out/gpu)
#   PYTHON=python3 benchmarks/gpu_check.sh OUT   (an interpreter that has torch with CUDA and the core's packages)
set -u
OUT=${1:-bench-out/gpu}
PYTHON=${PYTHON:-.venv/bin/python}
EVAL_DATA=${EVAL_DATA:-python_backend/adaflash/data}  # the packaged sample (16 rows a set); a data folder for more
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH=python_backend:build:clients:tests${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
{ nvidia-smi -L; nproc; $PYTHON -c "import torch, numpy; print(torch.__version__, torch.version.cuda, numpy.__version__, torch.cuda.get_device_name(0))"; } 2>&1 | tee "$OUT/env.txt"
ADAFLASH_GPU_CHECK=1 timeout "${TESTS_S:-300}" $PYTHON -m pytest -v -p no:cacheprovider tests/unit/test_gpu.py tests/integration/test_gpu_served.py 2>&1 | tee "$OUT/tests.txt" | tail -15
for c in 1 8; do
  timeout "${STEP_S:-120}" $PYTHON benchmarks/bench_step.py --device cuda --dtype float32 --eval-data "$EVAL_DATA" \
    --modes ar,ngram,adaflash --concurrency $c --prompts 16 --max-tokens 64 --repeats 2 --profile-steps 16 \
    --json "$OUT/step-c$c.json" 2>&1 | grep -v USDT | tail -4
done
timeout "${GRAPH_S:-90}" $PYTHON benchmarks/bench_graph_ceiling.py "$OUT/graph-ceiling.json" 2>&1 | grep -v USDT | tail -6
timeout "${GRAPHS_S:-150}" $PYTHON benchmarks/bench_graphs.py --eval-data "$EVAL_DATA" --device cuda --dtype float32 \
  --concurrency 1,8,32 --passes 2 --json "$OUT/graphs.json" 2>&1 | grep -v USDT | tail -12
# GATE_ARGS narrows the gate benchmark where time is short (one set at a few loads with more rounds says more than
# every set at two rounds: a GPU cell's rounds ranged 0.61-1.57 in round 22), e.g. "--domains code --concurrency 1,8
# --repeats 4".
timeout "${GATE_S:-900}" $PYTHON benchmarks/bench_gate.py --model-dir models/default --eval-data "$EVAL_DATA" \
  --device cuda --dtype float32 --tie-tolerance 1e-3 --repeats 2 --max-tokens 64 --concurrency 1,8,32,64 \
  ${GATE_ARGS:-} --json "$OUT/gate.json" 2>&1 | tee "$OUT/gate.log" | tail -25
timeout "${TINY_S:-120}" $PYTHON -m adaflash.cli bench --tiny-random --device cuda --dtype bfloat16 --tie-tolerance 0.03 \
  --modes ar,ngram,dflash,adaflash --concurrency 1,8,32 --max-tokens 64 --json "$OUT/bench-tiny.json" 2>&1 | tail -14
if [ -n "${ADAFLASH_GPU_MODEL_DIR:-}" ]; then
  timeout "${REAL_S:-1800}" $PYTHON -m adaflash.cli bench --model-dir "$ADAFLASH_GPU_MODEL_DIR" --device cuda \
    --dtype bfloat16 --tie-tolerance 0.03 --chat --modes ar,ngram,dflash,adaflash --concurrency 1,8,32 \
    --max-tokens 128 --json "$OUT/bench-real.json" 2>&1 | tail -14
fi
