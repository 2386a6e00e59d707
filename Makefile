# Two commands a new machine needs: `make test` and (later) `make serve`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test test-unit test-integration test-deploy gpu-check bench serve sweep soak models corpus models-smoke evaluate clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	rm -rf adaflash.egg-info  # an older layout's metadata: from the repository root it would hide the entry points
	$(BIN)/pip install -q -e '.[dev,serve,load]'
	$(BIN)/python -c 'from adaflash.models import native; native.available()'  # built now, not at a server's start
	touch $(STAMP)

# Serves models/default (or, until it exists, the tiny random models) on 127.0.0.1:8001.
serve: venv
	$(BIN)/adaflash serve

# The default models, trained from scratch on a corpus folder (hours on CPU; resumable: rerun to continue):
#   make models DATA=<folder>    (its layout: python_backend/adaflash/data/README.md, "Training corpus")
# the target; then `adaflash train` (docs/training.md), the recipe any target takes: the DFlash drafter's first
# stage (drafter-dflash-stage1/, the start of the rest), then regeneration, DFlash (drafter-dflash/), on-policy
# distillation with reverse KL (drafter-adaflash/) and the length heads: the served drafter/. Beside them, the OSD
# baseline (forward KL, drafter-osd/) that `make evaluate` compares.
DATA ?=
models: corpus venv
	$(BIN)/adaflash-pretrain all --data $(DATA) --work work/pretrain --out models/default/target
	$(BIN)/adaflash train --target models/default/target --data $(DATA) --out models/default/drafter-dflash-stage1 \
		--work work/train-stage1 --stages dflash --prompts-per-domain 200 --dflash-steps 3000 --dflash-lr 1e-3
	$(BIN)/adaflash train --target models/default/target --data $(DATA) --out models/default/drafter \
		--work work/train --init models/default/drafter-dflash-stage1 --stage-drafters models/default
	$(BIN)/adaflash-train-opd --model-dir models/default --data $(DATA) --kind forward --out drafter-osd $(OPD_ARGS)
OPD_ARGS ?= --rounds 2 --prompts-per-domain 40 --steps 300

# `make models` stops here without a corpus, saying what to give it.
corpus:
	@if [ -z "$(DATA)" ] || [ ! -d "$(DATA)/train" ]; then \
		echo "make models trains the default models from a corpus folder: make models DATA=<folder>"; \
		[ -z "$(DATA)" ] || echo "($(DATA)/train does not exist)"; \
		echo "<folder>/train/<domain>.jsonl.gz for each of chat, code, math, multilingual, prose (gzip JSON lines:"; \
		echo '  {"text": ...} or {"prompt": ..., "response": ...}) and <folder>/eval/heldout_<domain>.jsonl (prompt,'; \
		echo "  reference: the held-out loss); layout, record formats and the project's own corpus:"; \
		echo "  python_backend/adaflash/data/README.md. make models-smoke runs the recipe's first stage at toy scale"; \
		echo "  on the committed fixture (tests/fixtures/corpus)."; \
		exit 2; \
	fi

# Per-domain perplexity, repetition, tau of every drafter and greedy throughput per mode of models/default
# on EVAL_DATA/eval: the packaged sample (the first 16 rows of each evaluation set: python_backend/adaflash/data/
# README.md) unless EVAL_DATA names a full data folder; writes EVAL_JSON (with its command, machine, commit and
# date). The committed record is the run on the full sets: `make evaluate EVAL_DATA=<data folder>
# EVAL_JSON=benchmarks/results/quality.json`, then `make results`. `make bench` reads the same prompts.
EVAL_DATA ?= python_backend/adaflash/data
EVAL_JSON ?= bench-out/evaluate.json
evaluate: venv
	$(BIN)/adaflash evaluate --model-dir models/default --data $(EVAL_DATA) --per-domain 8 --concurrency 8 \
		--variants ngram,dflash:drafter-dflash,dflash:drafter-dflash@8,dflash:drafter-osd,dflash:drafter \
		--throughput-variants ngram,dflash:drafter-dflash,adaflash-published:drafter,adaflash:drafter \
		--json $(EVAL_JSON)

# docs/results.md from the benchmark records in benchmarks/results/*.json (standard library only: no venv needed).
# A rerun replaces a record (`python3 benchmarks/results.py stamp ...` adds its meta), then `make results`.
.PHONY: results
results:
	$(PY) benchmarks/results.py

# The same pipeline at toy scale on the committed corpus fixture (tests/unit/test_pretrain.py runs it too).
models-smoke: venv
	$(BIN)/adaflash-pretrain all --data tests/fixtures/corpus --work work/smoke --out work/smoke/target \
		--vocab-size 400 --config tests/fixtures/pretrain-toy.json

# Everything: the unit tests on every core, then the tests that start servers one at a time (a server's tests
# share the machine with nothing else).
test: test-unit $(VENV)/.chart
	$(BIN)/python -m pytest tests/integration tests/deploy

# The suite by kind (tests/conftest.py marks each by its folder): unit (no server, no subprocess; about a minute on
# two cores), integration (real servers, the project's commands in subprocesses), deploy (containers, chart).
test-unit: venv $(VENV)/.onnx
	$(BIN)/python -m pytest -n auto tests/unit

test-integration: venv
	$(BIN)/python -m pytest tests/integration

test-deploy: venv $(VENV)/.chart
	$(BIN)/python -m pytest tests/deploy

$(VENV)/.chart: pyproject.toml | venv
	$(BIN)/pip install -q -e '.[chart]'
	touch $@

# The ONNX drafter backend's parity tests (tests/unit/test_onnx_drafter.py); `--drafter-backend onnx` needs the same extra.
$(VENV)/.onnx: pyproject.toml | venv
	$(BIN)/pip install -q -e '.[onnx]'
	touch $@

# On a host with an NVIDIA GPU (docs/gpu.md): the GPU tests, a step profile, the plan gate's benchmark in fp32
# and `adaflash bench` in bf16 (real checkpoints too when ADAFLASH_GPU_MODEL_DIR names a model folder), each part
# bounded; benchmarks/gpu_check.sh says what and in which order. Output under bench-out/gpu/.
gpu-check: venv
	PYTHON=$(BIN)/python benchmarks/gpu_check.sh bench-out/gpu

# Benchmarks write JSON under bench-out/; speed claims live here, never in tests.
bench: venv
	mkdir -p bench-out
	test ! -d models/default/drafter || $(BIN)/adaflash bench --model-dir models/default --eval-data $(EVAL_DATA) \
		--per-domain 16 --modes ar,ngram,dflash,adaflash-published,adaflash --concurrency 1,8,32,64 \
		--max-tokens 128 --json bench-out/engine-copy.json
	$(BIN)/adaflash bench --tiny-random --modes ar,ngram,dflash,adaflash,adaflash-published --concurrency 1,4,16 --json bench-out/engine-tiny.json
	$(BIN)/python benchmarks/bench_runner.py --json bench-out/runner-vs-transformers.json

# Peer rows next to ours (ar, ngram, dflash, adaflash): transformers' generate (greedy, prompt lookup) and
# llama.cpp (f32 and f16: plain, prompt lookup, DFlash with drafter-dflash) on models/default and 16 code
# prompts, 2 threads; the first run downloads llama-cpp-python's source and builds llama.cpp under
# bench-out/peers (minutes). Not part of `make test`; run it with the machine to itself.
PEERS_STAMP := $(VENV)/.installed-peers
$(PEERS_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[dev,serve,load,peers]'
	touch $(PEERS_STAMP)

.PHONY: bench-peers
bench-peers: $(PEERS_STAMP)
	$(BIN)/python benchmarks/bench_peers.py --json bench-out/peers.json

# The engine at Qwen3-0.6B's size (random weights: benchmarks/scale_fixture.py writes it under bench-out/scale/, 2.4 GB)
# beside llama.cpp f32 on the same folder: prefill and decode per prompt length (128, 2,048, 8,192) and load, every
# mode against ar, peak memory against plan-memory (benchmarks/bench_scale.py). The machine to itself; about an hour.
.PHONY: bench-scale
bench-scale: $(PEERS_STAMP)
	$(BIN)/python benchmarks/bench_scale.py --json bench-out/scale.json

# Capacity sweep: Locust per spec_mode and concurrency against a server it starts (models/default, else
# the tiny random models); CSVs, plots and report.md in bench-out/sweep/. SWEEP_ARGS adds options, e.g.
#   make sweep SWEEP_ARGS="--url 127.0.0.1:8001 --modes ar,adaflash --duration 60 --ttft-slo-ms 500 --itl-slo-ms 50"
SWEEP_ARGS ?=
sweep: venv
	$(BIN)/adaflash sweep --out bench-out/sweep $(SWEEP_ARGS)

# The reliability suite at full scale (about 80 minutes, the machine to itself; docs/reliability.md): the malformed-
# input corpus, 6,000 fuzzed requests, huge bodies, 1,000 cancellations, 4x overload for 60 s, a 30-minute soak,
# SIGKILL of each model process under load, and 30 minutes of random kills under a mixed load (chaos); the tiny
# random models unless SOAK_ARGS="--model-dir models/default". `make test` runs its short scale.
SOAK_ARGS ?=
soak: venv
	$(BIN)/python -m adaflash_tools.reliability --json bench-out/reliability.json $(SOAK_ARGS)

# The containers for real (tools/adaflash_tools/image_check.py; docs/deployment.md): a Docker daemon of its own when
# none answers (root, Debian's docker.io), debian:bookworm-slim from debootstrap when it cannot be pulled, the CPU
# image built (time and size printed), run until healthy, a gRPC (adaflash-client) and an OpenAI SDK completion,
# everything it started removed. compose-check adds docker-compose.yml's server, loadtest and fleet, one replica
# killed under load. Not in `make test` (minutes to tens of minutes); reports in bench-out/.
.PHONY: image-check compose-check
image-check: venv
	$(BIN)/python -m adaflash_tools.image_check --json bench-out/image-check.json

compose-check: venv
	$(BIN)/python -m adaflash_tools.image_check --compose --json bench-out/compose-check.json

clean:
	rm -rf $(VENV) bench-out .serve work
