#!/bin/sh
# Round 41, after rerun_c8.sh: the three high-load cells that missed in verdict.sh, twelve rounds each, alone on the
# machine; then the plan arm's calls at math c=8 again (plan_calls.py, its summary fixed).
set -e
OUT=docs/engine-speed/round41
export PYTHONPATH=python_backend:build:clients:tests
PY=.venv/bin/python
$PY clients/bench_gate.py --model-dir models/default --domains chat --concurrency 32,64 --repeats 12 \
  --json $OUT/rerun-chat-high-12.json > $OUT/rerun-chat-high-12.log 2>&1
$PY clients/bench_gate.py --model-dir models/default --domains code --concurrency 64 --repeats 12 \
  --json $OUT/rerun-code-c64-12.json > $OUT/rerun-code-c64-12.log 2>&1
$PY $OUT/plan_calls.py math 8 6 > $OUT/plan-calls-math8.txt 2>&1
