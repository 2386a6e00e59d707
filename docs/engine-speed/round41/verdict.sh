#!/bin/sh
# Round 41's verdict on one commit, every cell of the issue's bar in one sitting, alone on the machine:
# the shared sets and the broad mix's held-out prompts at 1 and 8 sequences (each domain a cell), the shared sets at 32
# and 64, and the broad mix's held-out prompts pooled at 32 and 64 (72 prompts: 12 a domain is too few for a cell).
# Run from the repository root; each part writes its own JSON, so a cut run keeps what finished.
set -e
OUT=docs/engine-speed/round41
export PYTHONPATH=python_backend:build:clients
PY=.venv/bin/python
MIX=python_backend/adaflash/data/broad_mix.jsonl
git rev-parse HEAD > $OUT/verdict-commit.txt
$PY clients/bench_gate.py --model-dir models/default --concurrency 1,8 --repeats 4 \
  --json $OUT/verdict-shared-low.json > $OUT/verdict-shared-low.log 2>&1
$PY clients/bench_gate.py --model-dir models/default --prompts $MIX --split holdout --concurrency 1,8 --repeats 4 \
  --json $OUT/verdict-broad-low.json > $OUT/verdict-broad-low.log 2>&1
$PY clients/bench_gate.py --model-dir models/default --concurrency 32,64 --repeats 6 \
  --json $OUT/verdict-shared-high.json > $OUT/verdict-shared-high.log 2>&1
$PY clients/bench_gate.py --model-dir models/default --prompts $MIX --split holdout --pooled --concurrency 32,64 \
  --repeats 6 --json $OUT/verdict-broad-pooled.json > $OUT/verdict-broad-pooled.log 2>&1
date -u > $OUT/verdict-done.txt
