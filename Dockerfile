# Two images (docs/deployment.md); tests/deploy/test_deploy.py holds both to `adaflash serve --host 0.0.0.0` (what
# `make serve` runs, bound to every interface so that a published port reaches it).
#   DOCKER_BUILDKIT=1 docker build -t adaflash:cpu .            the default (last) stage: CPU, models/default inside
#   DOCKER_BUILDKIT=1 docker build --target gpu -t adaflash:gpu .   on NVIDIA's Triton TensorRT-LLM image (unverified)
# Both need BuildKit (RUN --mount); a Docker with buildx uses it by default. The CPU image's build takes:
#   --build-arg TORCH_INDEX_URL=...   where torch's CPU build comes from (default: PyTorch's CPU index)
#   --build-arg PIP_INDEX_URL=...     every other package (default: PyPI)
#   --secret id=pip_ca,src=FILE       a CA bundle for a proxy that re-signs TLS (optional; never stored in a layer)
# `make image-check` builds, runs and tears down the CPU image (tools/adaflash_tools/image_check.py).

# 26.07 is the newest Triton release with a TensorRT-LLM image; it ships TensorRT-LLM 1.2.1, which has no DFlash
# (docs/architecture.md, Deployment). Raise it to the first release whose image carries a TensorRT-LLM with DFlash.
ARG TRITON_TRTLLM_TAG=26.07

FROM nvcr.io/nvidia/tritonserver:${TRITON_TRTLLM_TAG}-trtllm-python-py3 AS gpu
# The image's Python is 3.12 and the project's is 3.11 (pyproject.toml); libpython3.11 is what the bundled Triton's
# Python backend stub links. The deadsnakes archive drops superseded builds, so its packages cannot be pinned.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends make software-properties-common \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get install -y --no-install-recommends libpython3.11 python3.11 python3.11-venv \
    && rm -rf /var/lib/apt/lists/*
# The venv installs its own torch (CUDA build from PyPI); a constraint file of the base image must not pin it.
ENV PIP_CONSTRAINT=""
WORKDIR /app
COPY . .
RUN --mount=type=cache,target=/root/.cache/pip make venv
EXPOSE 8000 8001 8002 9000
CMD [".venv/bin/adaflash", "serve", "--host", "0.0.0.0"]

# The CPU image in two stages: the venv is built beside a compiler, then copied into an image without one.
# Debian's Python 3.11 on bookworm-slim (the Makefile's PY); its packages follow the archive's security updates,
# so they are not pinned.
FROM debian:bookworm-slim AS cpu-build
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev python3.11 python3.11-venv \
    && rm -rf /var/lib/apt/lists/*
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_INDEX_URL=https://pypi.org/simple
# The native kernels (python_backend/adaflash/models/native) are compiled here into ADAFLASH_CACHE_DIR; CC is part
# of the built library's name, so the final image, which has no compiler, finds and loads the same file.
ENV ADAFLASH_CACHE_DIR=/app/.cache/adaflash CC=gcc
WORKDIR /app
# `make venv`'s steps without the dev extra (tests, linters, transformers: ~400 MB the server never imports).
# torch first, in a layer of its own: its CPU build (2.13.0+cpu wins over PyPI's 2.13.0, which brings CUDA
# libraries a CPU image never loads).
RUN --mount=type=secret,id=pip_ca --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi \
    && python3.11 -m venv .venv \
    && .venv/bin/pip install -q --extra-index-url "$TORCH_INDEX_URL" torch==2.13.0
COPY . .
RUN --mount=type=secret,id=pip_ca --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi \
    && .venv/bin/pip install -q -e '.[serve,load]' \
    && .venv/bin/python -c 'from adaflash.models import native; print("native kernels:", native.available())'

FROM debian:bookworm-slim AS cpu
# libpython3.11: the Triton Python backend's stub links it; libgomp1: the native kernels' OpenMP runtime.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 libpython3.11 python3.11 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 --user-group adaflash \
    && install -d -o adaflash -g adaflash /app  # `adaflash serve` writes its state in .serve/
ENV ADAFLASH_CACHE_DIR=/app/.cache/adaflash CC=gcc
WORKDIR /app
COPY --from=cpu-build --chown=10001:10001 /app /app
USER 10001:10001
EXPOSE 8000 8001 8002 9000
# Ready once the model serves (models loaded, costs measured): a minute or more on a CPU. docker-compose.yml's
# healthcheck is the same command.
HEALTHCHECK --interval=10s --timeout=5s --start-period=600s --retries=3 \
    CMD [".venv/bin/python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=2)"]
CMD [".venv/bin/adaflash", "serve", "--host", "0.0.0.0"]
