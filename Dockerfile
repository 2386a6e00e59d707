# syntax=docker/dockerfile:1
# Two images, both built with the README's own commands (`make venv`, then `adaflash serve` as `make serve` runs it,
# bound to every interface so that a published port reaches it); tests/deploy/test_deploy.py holds them to that.
#   docker build -t adaflash:cpu .                  the default (last) stage: CPU, Python 3.11, models/default inside
#   docker build --target gpu -t adaflash:gpu .     on NVIDIA's Triton TensorRT-LLM image, for `--device cuda`
# docker-compose.yml builds and runs both; README.md "Containers" and docs/architecture.md "Deployment" say how.

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

FROM python:3.11.13-slim-bookworm AS cpu
# gcc builds the few-row fp32 products (python_backend/adaflash/models/native) on their first use; without it the
# image serves on torch's slower products. libc6-dev must match the image's libc6, whose security updates the
# archive replaces, so it is not pinned.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends make=4.3-4.1 gcc=4:12.2.0-3 libc6-dev \
    && rm -rf /var/lib/apt/lists/*
# torch's CPU build (2.13.0+cpu wins over PyPI's 2.13.0, which brings CUDA libraries a CPU image never loads).
ENV PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
WORKDIR /app
COPY . .
RUN --mount=type=cache,target=/root/.cache/pip make venv
EXPOSE 8000 8001 8002 9000
CMD [".venv/bin/adaflash", "serve", "--host", "0.0.0.0"]
