"""On-policy distillation of a DFlash drafter: AdaFlash's reverse-KL recipe and the OSD baseline.

Each round (a) generates responses to fresh training prompts with the target and the current
drafter through the engine (speculative decoding, so the text is the target's, greedy or
sampled), (b) trains the drafter on them, the target as a detached teacher over the full
vocabulary at every block position, and (c) publishes the drafter as a numbered version
folder (Triton's layout: `<work>/versions/<round>/`), which a running server can load.

Losses per block position k (weights w_k = exp(-(k-1)/gamma), as in DFlash):
- reverse (AdaFlash): alpha x CE(target argmax) + (1 - alpha) x min(KL(p_drafter || p_target), kl_cap).
  Reverse KL is mode-seeking: the drafter puts its mass where the target is most likely, which
  is what acceptance (greedy: argmax equality; sampling: p_target of the drafted token) rewards.
- forward (OSD): KL(p_target || p_drafter), i.e. cross-entropy to the target's distribution.
Both start from the same drafter and get the same rounds, prompts and steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import Tensor

from adaflash.cli_args import add_placement_args, split_csv
from adaflash.models.drafter import DFlashDrafter
from adaflash.models.placement import place_of, placement
from adaflash.models.target import Transformer
from adaflash.training.dflash import (
    BlockLoss,
    add_data_arguments,
    anchored_blocks,
    block_logits,
    decay_weights,
    fit_drafter,
    regenerate,
    training_prompts,
)
from adaflash.training.distributed import SINGLE, World
from adaflash.training.generation import Generation, generate_rows
from adaflash.training.precision import master_place

KINDS = ("reverse", "forward")


@dataclass
class DistillConfig:
    kind: str = "reverse"
    alpha: float = 0.5  # weight of the cross-entropy to the target's argmax (reverse only)
    kl_cap: float = 5.0  # cap on one position's KL, nats (reverse only): a few hopeless positions cannot dominate


def teacher_logits(target: Transformer, tokens: Tensor) -> Tensor:
    """The target's next-token logits at every position of one sequence, [L, V] in fp32 (a bf16 target's
    softmax over the vocabulary would be too coarse to compare with), detached."""
    with torch.no_grad():
        return target.train_logits(tokens[None])[0].float()


def distill_loss(cfg: DistillConfig) -> BlockLoss:
    if cfg.kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {cfg.kind!r}")

    def loss(drafter: DFlashDrafter, target: Transformer, tokens: Tensor, features: Tensor, anchors: Tensor,
             gamma: float) -> Tensor:
        hidden, _, valid = anchored_blocks(drafter, target, tokens, features, anchors)
        log_d = F.log_softmax(block_logits(target, hidden), dim=-1)  # [n, B-1, V]
        offsets = torch.arange(drafter.config.block_size - 1, device=anchors.device)
        rows = (anchors[:, None] + offsets[None, :]).clamp(max=tokens.shape[0] - 1)
        log_t = F.log_softmax(teacher_logits(target, tokens), dim=-1)[rows]  # position anchor+k-1 predicts k
        if cfg.kind == "reverse":
            kl = (log_d.exp() * (log_d - log_t)).sum(-1).clamp(max=cfg.kl_cap)
            ce = F.nll_loss(log_d.reshape(-1, log_d.shape[-1]), log_t.argmax(-1).reshape(-1),
                            reduction="none").view(kl.shape)
            per = cfg.alpha * ce + (1 - cfg.alpha) * kl
        else:
            per = (log_t.exp() * (log_t - log_d)).sum(-1)
        w = decay_weights(drafter.config.block_size, gamma, valid.device)[None, :] * valid
        return (per * w).sum() / w.sum()

    return loss


RoundPrompts = Callable[[int], list[tuple[str, list[int]]]]
"""round number (from 1) -> that round's (domain, prompt ids)."""


@dataclass(frozen=True)
class RoundSchedule:
    """What every round trains: steps, learning rate, anchors per sequence, sequences per step (the global batch)."""

    steps: int
    lr: float
    anchors: int
    batch: int = 1
    feature_cache: int = 8 * 2**30  # bytes of target features kept between steps (`dflash.FeatureStore`)


def run_rounds(target: Transformer, drafter: DFlashDrafter, tokenizer: Tokenizer, data_dir: Path, work: Path,
               cfg: DistillConfig, rounds: int, prompts_per_domain: int, steps: int, lr: float, anchors: int,
               response_tokens: int, max_prompt_tokens: int, temperatures: tuple[float, ...], seed: int) -> DFlashDrafter:
    """All rounds on fresh prompts of the corpus folder `data_dir` each round (`distill_rounds`)."""

    def prompts(r: int) -> list[tuple[str, list[int]]]:
        return training_prompts(data_dir, tokenizer, prompts_per_domain, max_prompt_tokens, seed + 1000 * r)

    return distill_rounds(target, drafter, work, cfg, rounds, prompts, RoundSchedule(steps, lr, anchors),
                          response_tokens, temperatures, seed)


def distill_rounds(target: Transformer, drafter: DFlashDrafter, work: Path, cfg: DistillConfig, rounds: int,
                   prompts: RoundPrompts, schedule: RoundSchedule, response_tokens: int,
                   temperatures: tuple[float, ...], seed: int, world: World = SINGLE, generation: Generation | None = None,
                   version_dtype: torch.dtype = torch.float16, progress: bool = True) -> DFlashDrafter:
    """All rounds, resumable: a published version is loaded instead of retrained (where `drafter` is, fp32 on the
    training device), a round's generation and training pick up from their files. Appends one line per round
    to <work>/rounds.jsonl; returns the last round's drafter.

    Alone and without `generation`, a round's text comes from `regenerate` (one file, as the recipe always made
    it); with `generation` (`adaflash train`), from chunks the processes of `world` share. Versions are written by
    the main process in `version_dtype`: float32 makes a resumed run continue from exactly the weights an
    uninterrupted one holds."""
    for r in range(1, rounds + 1):
        version = work / "versions" / str(r)
        if (version / "config.json").exists():
            drafter = DFlashDrafter.from_pretrained(version, place_of(drafter))
            continue
        round_dir = work / f"round-{r}"
        round_dir.mkdir(parents=True, exist_ok=True)
        tagged = prompts(r)
        ids, tags = [p for _, p in tagged], [d for d, _ in tagged]
        if generation is None and world.size == 1:
            responses = regenerate(target, ids, response_tokens, out=round_dir / "generated.jsonl", progress=progress,
                                   tags=tags, drafter=drafter, temperatures=temperatures, seed=seed + r)
            rows = [json.loads(line) for line in (round_dir / "generated.jsonl").read_text().splitlines()]
        else:
            how = dataclasses.replace(generation or Generation(response_tokens), max_tokens=response_tokens,
                                      temperatures=temperatures, seed=seed + r)
            rows = generate_rows(target, drafter, ids, tags, round_dir, how, world, progress)
            responses = [row["response"] for row in rows]
        losses = fit_drafter(drafter, target, [(p + o, len(p)) for p, o in zip(ids, responses)], schedule.steps,
                             lr=schedule.lr, anchors_per_seq=schedule.anchors, seed=seed + r, run_dir=round_dir,
                             progress=progress, loss_fn=distill_loss(cfg), batch=schedule.batch, world=world,
                             desc=f"opd round {r}", feature_cache=schedule.feature_cache)
        taus = [row["tau"] for row in rows if row["tau"] is not None]
        line = {"round": r, "kind": cfg.kind, "sequences": len(ids),
                "generation_tau": round(sum(taus) / len(taus), 4) if taus else None,
                "last_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4) if losses else None}
        if world.is_main:
            drafter.save_pretrained(version, dtype=version_dtype)
            with (work / "rounds.jsonl").open("a") as f:
                f.write(json.dumps(line) + "\n")
            if progress:
                print(json.dumps(line), flush=True)
        world.barrier()
    return drafter


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="adaflash-train-opd", description=__doc__)
    add_data_arguments(p, prompts_per_domain=60)
    p.add_argument("--from", dest="start", default="drafter-dflash", help="drafter folder to start from")
    p.add_argument("--out", help="drafter folder name to write (default: drafter-opd-<kind>)")
    p.add_argument("--kind", choices=KINDS, default="reverse")
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--kl-cap", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=400, help="training steps per round")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--anchors", type=int, default=32)
    p.add_argument("--temperatures", default="0,1", help="prompts alternate between these")
    add_placement_args(p)
    args = p.parse_args(argv)
    place = placement(args.device, args.dtype)
    out = args.out or f"drafter-opd-{args.kind}"
    work = args.work or Path("work") / out
    target = Transformer.from_pretrained(args.model_dir / "target", place)
    tokenizer = Tokenizer.from_file(str(args.model_dir / "target" / "tokenizer.json"))
    drafter = DFlashDrafter.from_pretrained(args.model_dir / args.start, master_place(place))
    cfg = DistillConfig(args.kind, args.alpha, args.kl_cap)
    temps = tuple(float(t) for t in split_csv(args.temperatures))
    drafter = run_rounds(target, drafter, tokenizer, args.data, work, cfg, args.rounds, args.prompts_per_domain,
                         args.steps, args.lr, args.anchors, args.response_tokens, args.max_prompt_tokens, temps,
                         args.seed)
    final = work / "versions" / str(args.rounds)
    if (args.model_dir / out).exists():
        shutil.rmtree(args.model_dir / out)
    shutil.copytree(final, args.model_dir / out)
    print(json.dumps({"drafter": str(args.model_dir / out), "rounds": args.rounds, "kind": args.kind}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
