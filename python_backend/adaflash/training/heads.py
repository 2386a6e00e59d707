"""Length heads for a trained drafter, from its measured acceptance against the target.

Labels: on the target's own greedy text (the regenerated training data), every block the
drafter proposes is compared with the tokens the target actually produced; a drafted token
is accepted exactly when it equals them and all before it were accepted. Two heads learn
from that, the drafter frozen:
- the published head (`thresh_head_two_model`, direct length): AdaFlash's label (a + 1) / B,
  the block positions the target must verify (a accepted tokens and a lookahead of one),
  squared error, on blocks that lie wholly inside the text, as published;
- the per-position head (`position_head`): P(position j accepted | 1..j-1 accepted), trained
  only where position j was reached, which is what a cost-aware length choice needs.
Either head can be refitted alone, the other kept as it is. Calibration (predicted against
observed, per position and per domain) is measured on held-out sequences and written next to
the drafter.
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

from adaflash.cli_args import DEFAULT_MODEL_DIR, add_placement_args, csv_list
from adaflash.models.drafter import DFlashDrafter, LengthHead, PositionHead
from adaflash.models.target import Transformer
from adaflash.models.placement import move_to, placement
from adaflash.training.dflash import anchored_blocks, block_logits, sample_anchors, target_features
from adaflash.training.precision import master_place

HEADS = {"published": "thresh_head_two_model.", "position": "position_head."}  # head -> its tensors' prefix


@dataclass
class Blocks:
    """Drafted blocks with what the target made of them."""

    hidden: Tensor  # [N, B, D] drafter block hidden states
    confidence: Tensor  # [N, B-1, 2] drafter confidence per position
    correct: Tensor  # [N, B-1] drafted token == the target's token (and the position exists)
    complete: Tensor  # [N] every position of the block exists in the text (else its tail is unlabelled)
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
        return Blocks(self.hidden[rows], self.confidence[rows], self.correct[rows], self.complete[rows],
                      [self.domains[i] for i in rows.tolist()])


@torch.no_grad()
def collect_blocks(drafter: DFlashDrafter, target: Transformer, sequences: list[tuple[list[int], int]],
                   domains: list[str], anchors_per_seq: int, seed: int, progress: bool = False) -> Blocks:
    """Blocks at random anchors of each response (the tokens after `start`), drafted as in serving."""
    g = torch.Generator().manual_seed(seed)
    parts: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
    tags: list[str] = []
    for (tokens, start), domain in tqdm(list(zip(sequences, domains)), disable=not progress, desc="blocks"):
        t = torch.tensor(tokens)
        anchors = sample_anchors(max(start - 1, 0), t.shape[0], anchors_per_seq, g)
        if anchors.numel() == 0:
            continue
        feats = target_features(target, tokens, drafter.config.target_layer_ids)
        hidden, labels, valid = anchored_blocks(drafter, target, t, feats, anchors)
        logits = block_logits(target, hidden)
        parts.append((hidden, PositionHead.confidence(logits), (logits.argmax(-1) == labels) & valid, valid.all(dim=1)))
        tags += [domain] * anchors.numel()
    return Blocks(*(torch.cat([p[i] for p in parts]) for i in range(4)), tags)


def with_heads(drafter: DFlashDrafter, head_dim: int = 64, seed: int = 0,
               heads: tuple[str, ...] = tuple(HEADS)) -> DFlashDrafter:
    """The drafter with fresh heads of the kinds in `heads`; its own weights and its other heads untouched."""
    changes = {}
    if "published" in heads:
        changes.update(length_head=True, length_head_dim=head_dim)
    if "position" in heads:
        changes.update(position_head=True, position_head_dim=head_dim)
    out = DFlashDrafter(dataclasses.replace(drafter.config, **changes))
    fresh = tuple(HEADS[h] for h in heads)
    kept = {k: v for k, v in drafter.state_dict().items() if not k.startswith(fresh)}
    missing, unexpected = out.load_state_dict(kept, strict=False)
    if unexpected or any(not k.startswith(fresh) for k in missing):
        raise ValueError(f"drafter does not fit its heads: missing {missing}, unexpected {unexpected}")
    torch.manual_seed(seed)
    cfg = out.config
    if "published" in heads:
        out.thresh_head_two_model = LengthHead(cfg.hidden_size, head_dim)
    if "position" in heads:
        out.position_head = PositionHead(cfg.hidden_size, head_dim, cfg.block_size - 1)
    return out.eval()


def published_loss(drafter: DFlashDrafter, blocks: Blocks) -> Tensor:
    """Squared error of the published head against (a + 1) / B, averaged over the complete blocks (a block
    running past the end of the text has unlabelled positions; AdaFlash draws only anchors whose block fits)."""
    label = (blocks.accepted + 1) / drafter.config.block_size
    weight = blocks.complete.float()
    error = (drafter.thresh_head_two_model(blocks.hidden) - label) ** 2
    return (error * weight).sum() / weight.sum().clamp(min=1.0)


def position_loss(drafter: DFlashDrafter, blocks: Blocks) -> Tensor:
    """Binary cross-entropy of the position head over the positions verification reached."""
    rates = drafter.position_head(blocks.hidden, blocks.confidence)
    reached = blocks.reached
    return F.binary_cross_entropy(rates[reached], blocks.correct[reached].float())


def head_losses(drafter: DFlashDrafter, blocks: Blocks, heads: tuple[str, ...] = tuple(HEADS)) -> dict[str, Tensor]:
    """The loss of each head in `heads`."""
    losses = {"published": published_loss, "position": position_loss}
    return {h: losses[h](drafter, blocks) for h in heads}


def fit_heads(drafter: DFlashDrafter, blocks: Blocks, steps: int, batch: int = 512, lr: float = 2e-3,
              seed: int = 0, progress: bool = False, heads: tuple[str, ...] = tuple(HEADS)) -> list[float]:
    """Train the heads in `heads` on minibatches of blocks; the drafter's own weights and its other heads stay
    frozen."""
    for p in drafter.parameters():
        p.requires_grad_(False)
    params = [p for name, p in drafter.named_parameters() if name.startswith(tuple(HEADS[h] for h in heads))]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(seed)
    losses = []
    n = blocks.hidden.shape[0]
    for step in tqdm(range(steps), disable=not progress, desc="heads"):
        for group in opt.param_groups:
            group["lr"] = lr * (1 - step / steps)
        minibatch = blocks.select(torch.randint(0, n, (min(batch, n),), generator=g))
        loss = sum(head_losses(drafter, minibatch, heads).values())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    drafter.eval()
    return losses


@torch.no_grad()
def calibration(drafter: DFlashDrafter, blocks: Blocks) -> dict:
    """Predicted against observed acceptance on the complete blocks, for each head the drafter has: per position
    (the position head's conditional rate where reached) and per domain (accepted tokens per block: the position
    head's expectation, the published head's ratio x B - 1, and the observed mean)."""
    blocks = blocks.select(blocks.complete.nonzero().squeeze(1))
    expected, report = {}, {}
    if drafter.config.position_head:
        rates = drafter.position_head(blocks.hidden, blocks.confidence)
        report["per_position"] = per_position(rates, blocks)
        expected["position_head"] = rates.cumprod(dim=1).sum(dim=1)
    if drafter.config.length_head:
        expected["published_head"] = drafter.thresh_head_two_model(blocks.hidden) * drafter.config.block_size - 1
    per_domain = {}
    for d in sorted(set(blocks.domains)):
        m = torch.tensor([x == d for x in blocks.domains])
        per_domain[d] = {"blocks": int(m.sum()), "observed_accepted": _mean(blocks.accepted[m]),
                         **{f"{name}_accepted": _mean(acc[m]) for name, acc in expected.items()}}
    report["per_domain"] = per_domain
    report.update({f"{name}_accepted_mae": _mean((acc - blocks.accepted).abs()) for name, acc in expected.items()})
    return report


def per_position(rates: Tensor, blocks: Blocks) -> list[dict]:
    """For each draft position: how often verification reached it, the observed and the predicted rate there."""
    reached, correct = blocks.reached, blocks.correct.float()
    out = []
    for j in range(rates.shape[1]):
        m = reached[:, j]
        out.append({"position": j + 1, "reached": int(m.sum()), "observed": _mean(correct[m, j]),
                    "predicted": _mean(rates[m, j])})
    return out


def _mean(x: Tensor) -> float | None:
    return round(float(x.float().mean()), 4) if x.numel() else None


def split(n: int, holdout: float, seed: int) -> tuple[list[int], list[int]]:
    """Sequence indices for training and for calibration, disjoint."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    cut = max(1, round(n * holdout))
    return order[cut:], order[:cut]


@dataclass(frozen=True)
class HeadsSchedule:
    """How the heads are fitted: steps, blocks drawn per sequence, the share of sequences kept for calibration."""

    steps: int = 600
    anchors: int = 16
    holdout: float = 0.1


def train_heads(drafter: DFlashDrafter, target: Transformer, rows: list[dict], schedule: HeadsSchedule, seed: int,
                heads: tuple[str, ...] = tuple(HEADS), progress: bool = False) -> tuple[dict, list[float]]:
    """Fit the heads in `heads` (already added to `drafter`, `with_heads`) on blocks of the target's text `rows`
    (domain, prompt, response), measure their calibration on sequences kept out; returns the report
    (`calibration.json`) and the loss curve."""
    train_idx, held_idx = split(len(rows), schedule.holdout, seed)

    def blocks(idx: list[int]) -> Blocks:
        seqs = [(rows[i]["prompt"] + rows[i]["response"], len(rows[i]["prompt"])) for i in idx]
        return collect_blocks(drafter, target, seqs, [rows[i]["domain"] for i in idx], schedule.anchors, seed,
                              progress)

    losses = fit_heads(drafter, blocks(train_idx), schedule.steps, seed=seed, progress=progress, heads=heads)
    report = {"fitted": list(heads), "sequences": {"train": len(train_idx), "holdout": len(held_idx)},
              "last_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4), **calibration(drafter, blocks(held_idx))}
    return report, losses


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="adaflash-train-heads", description=__doc__)
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    p.add_argument("--drafter", default="drafter-dflash", help="drafter folder to add heads to")
    p.add_argument("--out", help="folder name for the drafter with heads (default: <drafter>-heads)")
    p.add_argument("--regenerated", type=Path, help="JSON lines of domain/prompt/response (default: work/<drafter>/regenerated.jsonl)")
    p.add_argument("--heads", type=csv_list(str, tuple(HEADS)), default=list(HEADS),
                   help="heads to fit afresh, the drafter's others kept (default: published,position)")
    p.add_argument("--anchors", type=int, default=16, help="blocks per sequence")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--holdout", type=float, default=0.1, help="share of sequences kept for calibration")
    p.add_argument("--seed", type=int, default=0)
    add_placement_args(p)
    args = p.parse_args(argv)
    try:
        place = placement(args.device, args.dtype)
    except ValueError as exc:
        p.error(f"--{exc}")
    heads = tuple(args.heads)
    out = args.out or f"{args.drafter}-heads"
    regenerated = args.regenerated or Path("work") / args.drafter / "regenerated.jsonl"
    rows = [json.loads(line) for line in regenerated.read_text().splitlines()]
    target = Transformer.from_pretrained(args.model_dir / "target", place)
    master = master_place(place)  # the heads train in fp32 on the device, the drafter frozen beside them
    drafter = move_to(with_heads(DFlashDrafter.from_pretrained(args.model_dir / args.drafter, master), args.head_dim,
                                 args.seed, heads), master)
    report, _ = train_heads(drafter, target, rows, HeadsSchedule(args.steps, args.anchors, args.holdout),
                            args.seed, heads=heads, progress=True)
    report = {"drafter": args.drafter, **report}
    drafter.save_pretrained(args.model_dir / out, dtype=torch.float16)
    (args.model_dir / out / "calibration.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k not in ("per_position", "per_domain")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
