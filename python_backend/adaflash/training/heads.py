"""Length heads for a trained drafter, from its measured acceptance against the target.

Labels: on the target's own greedy text (the regenerated training data), every block the
drafter proposes is compared with the tokens the target actually produced; a drafted token
is accepted exactly when it equals them and all before it were accepted. Two heads learn
from that, the drafter frozen:
- the published head (`thresh_head_two_model`): the accepted fraction (accepted + 1) / B;
- the per-position head (`position_head`): P(position j accepted | 1..j-1 accepted), trained
  only where position j was reached, which is what a cost-aware length choice needs.
Calibration (predicted against observed, per position and per domain) is measured on
held-out sequences and written next to the drafter.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from adaflash.cli_args import DEFAULT_MODEL_DIR
from adaflash.models.drafter import DFlashDrafter, LengthHead, PositionHead
from adaflash.models.target import Transformer
from adaflash.training.dflash import anchored_blocks, sample_anchors, target_features


@dataclass
class Blocks:
    """Drafted blocks with what the target made of them."""

    hidden: Tensor  # [N, B, D] drafter block hidden states
    confidence: Tensor  # [N, B-1, 2] drafter confidence per position
    correct: Tensor  # [N, B-1] drafted token == the target's token (and the position exists)
    domains: list[str]  # per block

    @property
    def reached(self) -> Tensor:
        """[N, B-1]: position j was verified, i.e. 1..j-1 were all accepted."""
        ok = self.correct.float().cumprod(dim=1)
        return torch.cat([torch.ones_like(ok[:, :1]), ok[:, :-1]], dim=1).bool()

    @property
    def accepted(self) -> Tensor:
        return self.correct.float().cumprod(dim=1).sum(dim=1)

    def select(self, rows: Tensor) -> "Blocks":
        return Blocks(self.hidden[rows], self.confidence[rows], self.correct[rows],
                      [self.domains[i] for i in rows.tolist()])


@torch.no_grad()
def collect_blocks(drafter: DFlashDrafter, target: Transformer, sequences: list[tuple[list[int], int]],
                   domains: list[str], anchors_per_seq: int, seed: int, progress: bool = False) -> Blocks:
    """Blocks at random anchors of each response (the tokens after `start`), drafted as in serving."""
    g = torch.Generator().manual_seed(seed)
    parts: list[tuple[Tensor, Tensor, Tensor]] = []
    tags: list[str] = []
    for (tokens, start), domain in tqdm(list(zip(sequences, domains)), disable=not progress, desc="blocks"):
        t = torch.tensor(tokens)
        anchors = sample_anchors(max(start - 1, 0), t.shape[0], anchors_per_seq, g)
        if anchors.numel() == 0:
            continue
        feats = target_features(target, tokens, drafter.config.target_layer_ids)
        hidden, labels, valid = anchored_blocks(drafter, target, t, feats, anchors)
        logits = target.lm_head(hidden[:, 1:])
        parts.append((hidden, PositionHead.confidence(logits), (logits.argmax(-1) == labels) & valid))
        tags += [domain] * anchors.numel()
    return Blocks(*(torch.cat([p[i] for p in parts]) for i in range(3)), tags)


def with_heads(drafter: DFlashDrafter, head_dim: int = 64, seed: int = 0) -> DFlashDrafter:
    """The drafter with fresh published and per-position heads (its own weights untouched)."""
    cfg = dataclasses.replace(drafter.config, length_head=True, length_head_dim=head_dim, position_head=True,
                              position_head_dim=head_dim)
    out = DFlashDrafter(cfg)
    out.load_state_dict(drafter.state_dict(), strict=False)
    torch.manual_seed(seed)
    out.thresh_head_two_model = LengthHead(cfg.hidden_size, head_dim)
    out.position_head = PositionHead(cfg.hidden_size, head_dim, cfg.block_size - 1)
    return out.eval()


def head_losses(drafter: DFlashDrafter, blocks: Blocks) -> tuple[Tensor, Tensor]:
    """Binary cross-entropy of the published head (soft label (a+1)/B) and of the position head
    over reached positions."""
    b = drafter.config.block_size
    ratio = drafter.thresh_head_two_model(blocks.hidden)
    published = F.binary_cross_entropy(ratio, (blocks.accepted + 1) / b)
    rates = drafter.position_head(blocks.hidden, blocks.confidence)
    reached = blocks.reached
    position = F.binary_cross_entropy(rates[reached], blocks.correct[reached].float())
    return published, position


def fit_heads(drafter: DFlashDrafter, blocks: Blocks, steps: int, batch: int = 512, lr: float = 2e-3,
              seed: int = 0, progress: bool = False) -> list[float]:
    """Train both heads on minibatches of blocks; the drafter's own weights stay frozen."""
    for p in drafter.parameters():
        p.requires_grad_(False)
    params = [*drafter.thresh_head_two_model.parameters(), *drafter.position_head.parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(seed)
    losses = []
    n = blocks.hidden.shape[0]
    for step in tqdm(range(steps), disable=not progress, desc="heads"):
        for group in opt.param_groups:
            group["lr"] = lr * (1 - step / steps)
        published, position = head_losses(drafter, blocks.select(torch.randint(0, n, (min(batch, n),), generator=g)))
        loss = published + position
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    drafter.eval()
    return losses


@torch.no_grad()
def calibration(drafter: DFlashDrafter, blocks: Blocks) -> dict:
    """Predicted against observed acceptance: per position (conditional rate where reached) and per
    domain (accepted tokens per block: the position head's expectation, the published head's
    (ratio x B) - 1, and the observed mean)."""
    b = drafter.config.block_size
    rates = drafter.position_head(blocks.hidden, blocks.confidence)
    ratio = drafter.thresh_head_two_model(blocks.hidden)
    reached, correct = blocks.reached, blocks.correct.float()
    per_position = []
    for j in range(b - 1):
        m = reached[:, j]
        per_position.append({"position": j + 1, "reached": int(m.sum()),
                             "observed": _mean(correct[m, j]), "predicted": _mean(rates[m, j])})
    expected = rates.cumprod(dim=1).sum(dim=1)
    per_domain = {}
    for d in sorted(set(blocks.domains)):
        m = torch.tensor([x == d for x in blocks.domains])
        per_domain[d] = {"blocks": int(m.sum()), "observed_accepted": _mean(blocks.accepted[m]),
                         "position_head_accepted": _mean(expected[m]),
                         "published_head_accepted": _mean(ratio[m] * b - 1)}
    return {"per_position": per_position, "per_domain": per_domain,
            "position_head_accepted_mae": _mean((expected - blocks.accepted).abs()),
            "published_head_accepted_mae": _mean((ratio * b - 1 - blocks.accepted).abs())}


def _mean(x: Tensor) -> float | None:
    return round(float(x.float().mean()), 4) if x.numel() else None


def split(n: int, holdout: float, seed: int) -> tuple[list[int], list[int]]:
    """Sequence indices for training and for calibration, disjoint."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    cut = max(1, round(n * holdout))
    return order[cut:], order[:cut]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="adaflash-train-heads", description=__doc__)
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    p.add_argument("--drafter", default="drafter-dflash", help="drafter folder to add heads to")
    p.add_argument("--out", help="folder name for the drafter with heads (default: <drafter>-heads)")
    p.add_argument("--regenerated", type=Path, help="JSON lines of domain/prompt/response (default: work/<drafter>/regenerated.jsonl)")
    p.add_argument("--anchors", type=int, default=16, help="blocks per sequence")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--holdout", type=float, default=0.1, help="share of sequences kept for calibration")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    out = args.out or f"{args.drafter}-heads"
    regenerated = args.regenerated or Path("work") / args.drafter / "regenerated.jsonl"
    rows = [json.loads(line) for line in regenerated.read_text().splitlines()]
    target = Transformer.from_pretrained(args.model_dir / "target")
    drafter = with_heads(DFlashDrafter.from_pretrained(args.model_dir / args.drafter), args.head_dim, args.seed)
    train_idx, held_idx = split(len(rows), args.holdout, args.seed)

    def blocks(idx: list[int]) -> Blocks:
        seqs = [(rows[i]["prompt"] + rows[i]["response"], len(rows[i]["prompt"])) for i in idx]
        return collect_blocks(drafter, target, seqs, [rows[i]["domain"] for i in idx], args.anchors, args.seed, True)

    losses = fit_heads(drafter, blocks(train_idx), args.steps, seed=args.seed, progress=True)
    report = {"drafter": args.drafter, "sequences": {"train": len(train_idx), "holdout": len(held_idx)},
              "last_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4), **calibration(drafter, blocks(held_idx))}
    drafter.save_pretrained(args.model_dir / out, dtype=torch.float16)
    (args.model_dir / out / "calibration.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("drafter", "sequences", "last_loss", "position_head_accepted_mae",
                                             "published_head_accepted_mae")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
