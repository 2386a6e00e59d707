#!/bin/bash
# Round 25, third call: graphed prefills. The GPU tests of the graphs (the padded prefill recorded and replayed
# against the eager forward) and of every mode; then the gate benchmark at 8 and 32 sequences on code, with prefills
# graphed and, in a second process on the same machine, with them eager (PREFILL_TOKENS = 0, as before).
export PYTHONPATH=python_backend:build:clients:tests PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi -L > $OUT/env.txt 2>&1
ADAFLASH_GPU_CHECK=1 timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "graphs or every_mode" 2>&1 | grep -v USDT > $OUT/tests.txt; tail -3 $OUT/tests.txt
ARGS="--model-dir models/default --eval-data .gpudata/data --device cuda --dtype float32 --tie-tolerance 1e-3
      --warmup 1 --repeats 2 --max-tokens 64 --concurrency 8,32 --domains code"
for prefill in 1024 0; do
timeout 120 python3 -c "
import sys, runpy
import adaflash.models.graphs as g
g.PREFILL_TOKENS = $prefill
sys.argv = ['bench_gate.py'] + sys.argv[1:]
runpy.run_path('clients/bench_gate.py', run_name='__main__')" $ARGS --json $OUT/gate-prefill$prefill.json 2>&1 \
  | grep -v USDT > $OUT/gate-prefill$prefill.log; echo "prefill graphs up to $prefill"; tail -2 $OUT/gate-prefill$prefill.log | cut -c1-300
done
echo done
