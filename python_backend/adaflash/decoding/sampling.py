"""Lossless verification of drafted tokens: greedy prefix matching and speculative sampling.

The draft is deterministic (argmax of the drafter, or copied n-gram tokens), so the
drafter's distribution is a point mass q = 1[x]. Accepting x with probability
min(1, p(x)/q(x)) = p(x) and, on rejection, sampling from (p - q)+ renormalised, which is
p with x removed, yields exactly the target distribution p at every position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def validate(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def target_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """The distribution sampled from: temperature, then top-k, then top-p (nucleus), as in Hugging Face."""
    logits = logits.float() / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass strictly above each token
        sorted_p = sorted_p.masked_fill(before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def verify_greedy(draft: list[int], target_ids: list[int]) -> list[int]:
    """target_ids[j] is the target's argmax after draft[:j]; commit the matching prefix plus the next target token."""
    a = 0
    while a < len(draft) and draft[a] == target_ids[a]:
        a += 1
    return draft[:a] + [target_ids[a]]


def verify_sampled(draft: list[int], probs: Tensor, generator: torch.Generator) -> tuple[list[int], float]:
    """probs: [len(draft) + 1, V]. Speculative sampling with a point-mass draft (see module docstring).

    Also returns the sum of p(x) over the draft tokens that were tried: the expected number of
    acceptances, which a caller can hold the observed count against.
    """
    committed: list[int] = []
    expected = 0.0
    for j, x in enumerate(draft):
        p = probs[j]
        px = p[x].item()
        expected += px
        if torch.rand((), generator=generator).item() < px:
            committed.append(x)
            continue
        residual = p.clone()
        residual[x] = 0.0
        committed.append(sample(residual, generator))
        return committed, expected
    committed.append(sample(probs[len(draft)], generator))
    return committed, expected


def sample(p: Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(p / p.sum(), 1, generator=generator).item())
