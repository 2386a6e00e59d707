# Two commands a new machine needs: `make test` and (later) `make serve`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test bench serve sweep models models-smoke evaluate clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,serve,load]'
	touch $(STAMP)

# Serves models/default (or, until it exists, the tiny random models) on 127.0.0.1:8001.
serve: venv
	$(BIN)/adaflash serve

# The default models, trained from scratch on ../shared/data (hours on CPU; resumable: rerun to continue):
# target, DFlash drafter (drafter-dflash/), and the served drafter/ = that drafter with its length heads.
models: venv
	$(BIN)/adaflash-pretrain all --data ../shared/data --work work/pretrain --out models/default/target
	$(BIN)/adaflash-train-drafter --model-dir models/default --data ../shared/data --out drafter-dflash
	$(BIN)/adaflash-train-heads --model-dir models/default --drafter drafter-dflash --out drafter

# Per-domain perplexity, repetition and tau of models/default on ../shared/data/eval; rewrites its
# section of docs/results.md and bench-out/evaluate.json.
evaluate: venv
	$(BIN)/adaflash evaluate --model-dir models/default --data ../shared/data --drafter drafter-dflash

# The same pipeline at toy scale on the committed corpus fixture (tests/test_pretrain.py runs it too).
models-smoke: venv
	$(BIN)/adaflash-pretrain all --data tests/fixtures/corpus --work work/smoke --out work/smoke/target \
		--vocab-size 400 --config tests/fixtures/pretrain-toy.json

test: venv
	$(BIN)/python -m pytest tests

# Benchmarks write JSON under bench-out/; speed claims live here, never in tests.
bench: venv
	mkdir -p bench-out
	test ! -d models/default/drafter || $(BIN)/adaflash bench --model-dir models/default --eval-data ../shared/data \
		--modes ar,ngram,dflash,adaflash,adaflash-published --concurrency 1,32 --max-tokens 128 --json bench-out/engine-default.json
	$(BIN)/adaflash bench --tiny-random --modes ar,ngram,dflash,adaflash,adaflash-published --concurrency 1,4,16 --json bench-out/engine-tiny.json
	$(BIN)/python clients/bench_runner.py --json bench-out/runner-vs-transformers.json

# Capacity sweep: Locust per spec_mode and concurrency against a server it starts (models/default, else
# the tiny random models); CSVs, plots and report.md in bench-out/sweep/. SWEEP_ARGS adds options, e.g.
#   make sweep SWEEP_ARGS="--url 127.0.0.1:8001 --modes ar,adaflash --duration 60 --ttft-slo-ms 500 --itl-slo-ms 50"
SWEEP_ARGS ?=
sweep: venv
	$(BIN)/adaflash sweep --out bench-out/sweep $(SWEEP_ARGS)

clean:
	rm -rf $(VENV) bench-out .serve work
