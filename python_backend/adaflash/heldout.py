"""The target's held-out loss per domain: what pretraining reports when it ends and `adaflash evaluate` tabulates.

Beside training/ and evaluation/ rather than in either, so that both use it and neither imports the other.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from adaflash.corpus import DOMAINS
from adaflash.models.placement import place_of

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from adaflash.models.target import Transformer


def heldout_loss(model: Transformer, tokenizer: Tokenizer, data_dir: str | Path, max_rows: int = 50,
                 context: int = 512) -> dict[str, float]:
    """Mean next-token loss (nats) on the reference continuations of eval/heldout_<domain>.jsonl, taken in fp32
    whatever the model's dtype, on its device."""
    device = place_of(model).device
    out = {}
    for domain in DOMAINS:
        rows = [json.loads(x) for x in (Path(data_dir) / "eval" / f"heldout_{domain}.jsonl").read_text().splitlines()]
        total, count = 0.0, 0
        for r in rows[:max_rows]:
            prompt = tokenizer.encode(r["prompt"]).ids[-context // 2:]
            ref = tokenizer.encode(r["reference"]).ids[: context - len(prompt)]
            if not ref:
                continue
            ids = torch.tensor([prompt + ref], device=device)
            with torch.no_grad():
                logits = model.train_logits(ids[:, :-1])[0, len(prompt) - 1 :].float()
            total += F.cross_entropy(logits, ids[0, len(prompt) :], reduction="sum").item()
            count += len(ref)
        out[domain] = round(total / max(count, 1), 4)
    return out
