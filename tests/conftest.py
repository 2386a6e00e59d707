"""Shared fixtures: a tiny random target with a drafter trained briefly on the target's own outputs."""

from __future__ import annotations

import pytest
import torch

from adaflash.models.bundle import Bundle, tiny_random_bundle
from adaflash.decoding.engine import Engine, Request
from adaflash.decoding.policy import CostModel
from adaflash.decoding.sampling import SamplingParams
from adaflash.models.target import Transformer
from adaflash.training.dflash import fit_drafter

# The models here are tiny: intra-op threads buy nothing, and on a shared 2-core machine they make
# every forward wait on busy cores (training then runs ten times slower). One thread keeps runs steady.
torch.set_num_threads(1)


def random_prompts(n: int, seed: int, vocab: int = 256, min_len: int = 4, max_len: int = 30) -> list[list[int]]:
    """`n` seeded random prompts of ids < `vocab`, lengths in [min_len, max_len]."""
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(n):
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        prompts.append(torch.randint(0, vocab, (length,), generator=g).tolist())
    return prompts


def self_generated(target: Transformer, prompts: list[list[int]], max_tokens: int,
                   sampling: SamplingParams = SamplingParams(), concurrency: int = 16) -> list[tuple[list[int], int]]:
    """(tokens, response_start) pairs of the target's own `ar` continuations, for drafter training."""
    engine = Engine(target, None, num_slots=concurrency, max_len=max(len(p) for p in prompts) + max_tokens + 32)
    reqs = [Request(prompt_ids=p, max_tokens=max_tokens, mode="ar", sampling=sampling) for p in prompts]
    seqs = engine.generate(reqs, concurrency=concurrency)
    return [(seq.tokens, len(p)) for seq, p in zip(seqs, prompts)]


def fixed_costs(num_slots: int = 16) -> CostModel:
    """A deterministic cost model shaped like the CPU measurements: a fixed forward overhead plus a small
    per-token cost, and a full-block drafter forward about half a verify, cheaper for shorter blocks.
    Keeps the adaflash choices reproducible."""
    sizes = [b for b in (1, 2, 4, 8, 16) if b <= num_slots]
    verify = {b: [(b * k, 2.0 + 0.012 * b * k) for k in (1, 2, 4, 8, 16)] for b in sizes}
    draft = {b: [(n, 0.5 + (0.7 + 0.1 * b) * n / 16) for n in (2, 4, 8, 16)] for b in sizes}
    return CostModel(verify=verify, draft=draft)


def clone_target(target: Transformer) -> Transformer:
    """A separate target with the same weights (its own cache), for independent references."""
    twin = Transformer(target.config)
    twin.load_state_dict(target.state_dict())
    return twin.eval()


@pytest.fixture(scope="session")
def trained_tiny() -> Bundle:
    """tiny_random_bundle(seed=0) whose drafter was fitted for 300 steps on the target's greedy outputs.

    Training reallocates the target cache: build engines after this fixture, never before.
    """
    torch.manual_seed(0)
    bundle = tiny_random_bundle(seed=0)
    prompts = random_prompts(64, seed=1234)
    data = self_generated(bundle.target, prompts, max_tokens=96)
    fit_drafter(bundle.drafter, bundle.target, data, steps=300)
    return bundle
