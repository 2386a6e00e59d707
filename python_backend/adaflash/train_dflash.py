"""DFlash drafter training, the published recipe.

Random anchors in a response; each block is [anchor, mask x (B-1)] and position k predicts
token anchor+k. A block sees the target features of positions strictly before its anchor,
attends bidirectionally inside itself and never sees other blocks. Cross-entropy is
weighted by exp(-(k-1)/gamma): early positions decide acceptance, so they matter most.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from adaflash.drafter import DFlashDrafter
from adaflash.target import Transformer

PUBLISHED_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


def default_gamma(block_size: int) -> float:
    return PUBLISHED_GAMMA.get(block_size, 7.0 * block_size / 16)


def target_features(target: Transformer, tokens: list[int], layer_ids: list[int]) -> Tensor:
    """Hidden states of the drafter's target layers for every position of `tokens`, [L, n_layers * D].

    Uses a fresh one-slot cache on the target: build engines after training, not before.
    """
    target.allocate_cache(1, len(tokens))
    hidden = target.forward([0], [tokens], logit_rows=torch.tensor([0]), capture_layers=layer_ids).hidden
    return hidden.clone()  # outside inference mode: a normal tensor that autograd may save


def sample_anchors(first: int, length: int, count: int, generator: torch.Generator) -> Tensor:
    """Anchors in [first, length - 2]: each has at least one token after it to predict."""
    high = length - 1
    if high <= first:
        return torch.empty(0, dtype=torch.long)
    count = min(count, high - first)
    return first + torch.randperm(high - first, generator=generator)[:count]


def dflash_loss(
    drafter: DFlashDrafter, target: Transformer, tokens: Tensor, features: Tensor, anchors: Tensor, gamma: float
) -> Tensor:
    """Decayed cross-entropy of all blocks anchored in one sequence (tokens [L], features [L, F])."""
    b = drafter.config.block_size
    ctx_kv = drafter.context_kv(features)
    ctx_mask = torch.arange(tokens.shape[0])[None, :] < anchors[:, None]
    hidden = drafter.block_hidden(target, drafter.block_ids(tokens[anchors]), anchors, ctx_kv, ctx_mask)
    logits = target.lm_head(hidden[:, 1:])  # [n, B-1, V]
    label_pos = anchors[:, None] + torch.arange(1, b)[None, :]
    valid = label_pos < tokens.shape[0]
    labels = torch.where(valid, tokens[label_pos.clamp(max=tokens.shape[0] - 1)], -100)
    weights = torch.exp(-(torch.arange(1, b, dtype=torch.float) - 1) / gamma)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none").view(labels.shape)
    w = weights[None, :] * valid
    return (ce * w).sum() / w.sum()


def fit_drafter(
    drafter: DFlashDrafter,
    target: Transformer,
    sequences: list[tuple[list[int], int]],
    steps: int,
    lr: float = 3e-3,
    anchors_per_seq: int = 16,
    seed: int = 0,
) -> list[float]:
    """Train on (tokens, response_start) pairs with AdamW and cosine decay; returns the loss curve."""
    g = torch.Generator().manual_seed(seed)
    ids = drafter.config.target_layer_ids
    data = [(torch.tensor(t), target_features(target, t, ids), start) for t, start in sequences]
    for p in target.parameters():
        p.requires_grad_(False)
    drafter.train()
    opt = torch.optim.AdamW(drafter.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for step in range(steps):
        tokens, feats, start = data[step % len(data)]
        anchors = sample_anchors(max(start - 1, 0), tokens.shape[0], anchors_per_seq, g)
        if anchors.numel() == 0:
            continue
        for group in opt.param_groups:
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        loss = dflash_loss(drafter, target, tokens, feats, anchors, default_gamma(drafter.config.block_size))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    drafter.eval()
    return losses
