"""Tau of a drafter on the held-out prompts, per domain: what each stage of a training run bought.

The drafter alone decides (mode dflash, full blocks, greedy), so the figure moves with the drafter's weights and
nothing else; tau is tokens committed per target forward over all of a domain's decode steps. Training and the
evaluation package stay independent (the project's import contract), so this is the few lines it takes, not
`adaflash evaluate`.
"""

from __future__ import annotations

from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request, context_length
from adaflash.models.drafter import DFlashDrafter
from adaflash.models.target import Transformer
from adaflash.training.generation import UNREAD_COSTS


def heldout_tau(target: Transformer, drafter: DFlashDrafter, prompts: list[tuple[str, list[int]]], max_tokens: int,
                batch: int = 16) -> dict[str, float | None]:
    """Tau per domain and over all prompts (`all`), greedy, mode dflash; None where no step drafted."""
    if not prompts:
        return {}
    engine = Engine(target, drafter, num_slots=batch, cost_model=UNREAD_COSTS,
                    max_len=context_length([len(p) for _, p in prompts], max_tokens, drafter.config.block_size))
    seqs = engine.generate([Request(p, max_tokens, mode="dflash") for _, p in prompts], concurrency=batch)
    committed: dict[str, list[int]] = {}
    for (domain, _), seq in zip(prompts, seqs):
        for key in (domain, "all"):
            total = committed.setdefault(key, [0, 0])
            total[0] += sum(st.committed for st in seq.steps)
            total[1] += len(seq.steps)
    return {k: (round(c / n, 4) if n else None) for k, (c, n) in sorted(committed.items())}
