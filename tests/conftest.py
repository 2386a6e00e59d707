"""Shared fixtures: a tiny random target with a drafter trained briefly on the target's own outputs."""

from __future__ import annotations

import os

# The suite's references are fp32 on the CPU: GPUs are hidden from it (and from the servers it starts), so that
# `device auto` means the CPU here; `make gpu-check` sets ADAFLASH_GPU_CHECK=1 and runs tests/test_gpu.py on one.
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


@pytest.fixture(scope="session")
def trained_tiny() -> Bundle:
    """tiny_random_bundle(seed=0) whose drafter was fitted for 300 steps on the target's greedy outputs."""
    torch.manual_seed(0)
    bundle = tiny_random_bundle(seed=0)
    prompts = random_prompts(64, seed=1234)
    data = self_generated(bundle.target, prompts, max_tokens=96)
    fit_drafter(bundle.drafter, bundle.target, data, steps=300)
    return bundle
