"""Shared fixtures: a tiny random target with a drafter trained briefly on the target's own outputs. And each test's
kind from its folder: tests/unit (no server, no subprocess), tests/integration (servers and the project's commands in
subprocesses), tests/deploy (the containers, the Helm chart, the balancer) mark their tests `unit`, `integration`
and `deploy`, so that `pytest -m unit` runs what `pytest tests/unit` runs."""

from __future__ import annotations

import os
from pathlib import Path

# The suite's references are fp32 on the CPU: GPUs are hidden from it (and from the servers it starts), so that
# `device auto` means the CPU here; `make gpu-check` sets ADAFLASH_GPU_CHECK=1 and runs the GPU tests on one
# (tests/unit/test_gpu.py, tests/integration/test_gpu_served.py).
if os.environ.get("ADAFLASH_GPU_CHECK") != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import random_prompts, self_generated

from adaflash.models.bundle import Bundle, tiny_random_bundle
from adaflash.training.dflash import fit_drafter

# The models here are tiny: intra-op threads buy nothing, and on a shared 2-core machine they make
# every forward wait on busy cores (training slows down several times over). One thread keeps runs steady.
torch.set_num_threads(1)

TESTS = Path(__file__).parent
KINDS = ("unit", "integration", "deploy")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        kind = item.path.relative_to(TESTS).parts[0] if item.path.is_relative_to(TESTS) else None
        if kind in KINDS:
            item.add_marker(kind)


@pytest.fixture(scope="session")
def trained_tiny() -> Bundle:
    """tiny_random_bundle(seed=0) whose drafter was fitted for 300 steps on the target's greedy outputs."""
    torch.manual_seed(0)
    bundle = tiny_random_bundle(seed=0)
    prompts = random_prompts(64, seed=1234)
    data = self_generated(bundle.target, prompts, max_tokens=96)
    fit_drafter(bundle.drafter, bundle.target, data, steps=300)
    return bundle
