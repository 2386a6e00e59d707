#!/bin/sh
# Round 41, after verdict.sh: the two cells that missed at 8 sequences after the change, twelve rounds each, alone on
# the machine; then the plan arm's calls at math c=8 (plan_calls.py).
set -e
OUT=docs/engine-speed/round41
export PYTHONPATH=python_backend:build:clients:tests
PY=.venv/bin/python
$PY clients/bench_gate.py --model-dir models/default --domains math --concurrency 8 --repeats 12 \
  --json $OUT/rerun-math-c8-12.json > $OUT/rerun-math-c8-12.log 2>&1
$PY clients/bench_gate.py --model-dir models/default --prompts python_backend/adaflash/data/broad_mix.jsonl \
  --split holdout --domains qa --concurrency 8 --repeats 12 --json $OUT/rerun-broad-qa-c8-12.json \
  > $OUT/rerun-broad-qa-c8-12.log 2>&1
$PY $OUT/plan_calls.py math 8 6 > $OUT/plan-calls-math8.txt 2>&1
