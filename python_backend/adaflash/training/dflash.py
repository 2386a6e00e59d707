"""DFlash drafter training, the published recipe.

Random anchors in a response; each block is [anchor, mask x (B-1)] and position k predicts
token anchor+k. A block sees the target features of positions strictly before its anchor,
attends bidirectionally inside itself and never sees other blocks. Cross-entropy is
weighted by exp(-(k-1)/gamma): early positions decide acceptance, so they matter most.

`adaflash-train-drafter` runs the recipe for a model folder: sample training prompts of every
domain, regenerate the responses with the target, train, save in the published format.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import IO

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import Tensor, nn
from tqdm import tqdm

from adaflash.cli_args import DEFAULT_MODEL_DIR, add_placement_args
from adaflash.decoding.engine import Engine
from adaflash.decoding.sampling import SamplingParams
from adaflash.decoding.sequence import Request, context_length, tau
from adaflash.models.drafter import DFlashDrafter, DrafterConfig, block_size_of
from adaflash.models.placement import Placement, move_to, place_of, placement
from adaflash.models.target import Transformer
from adaflash.models.tokenizer import BYTE_SPECIALS
from adaflash.corpus import DOMAINS, PROMPT_DOMAINS, TRAIN_LAYOUT, as_prompt, documents
from adaflash.training.distributed import SINGLE, World, no_sync
from adaflash.training.precision import autocast, check_master, master_place

PUBLISHED_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


def default_gamma(block_size: int) -> float:
    return PUBLISHED_GAMMA.get(block_size, 7.0 * block_size / 16)


def target_features(target: Transformer, tokens: list[int], layer_ids: list[int]) -> Tensor:
    """Hidden states of the drafter's target layers for every position of `tokens`, [L, n_layers * D], on the
    target's device in its dtype."""
    first_row = torch.tensor([0], device=place_of(target).device)
    hidden = target.forward(target.new_cache(1, len(tokens)), [0], [tokens], logit_rows=first_row,
                            capture_layers=layer_ids).hidden
    return hidden.clone()  # outside inference mode: a normal tensor that autograd may save


def training_data(target: Transformer, sequences: list[tuple[list[int], int]],
                  layer_ids: list[int]) -> list[tuple[Tensor, Tensor, int]]:
    """(tokens [L], features [L, F], response start) of every sequence, made on the target's device once, so
    that a training step moves nothing between devices."""
    device = place_of(target).device
    return [(torch.tensor(t, device=device), target_features(target, t, layer_ids), start) for t, start in sequences]


def sample_anchors(first: int, length: int, count: int, generator: torch.Generator) -> Tensor:
    """Anchors in [first, length - 2]: each has at least one token after it to predict. On the CPU, as
    `generator` is: a seed draws the same anchors on every device."""
    high = length - 1
    if high <= first:
        return torch.empty(0, dtype=torch.long)
    count = min(count, high - first)
    return first + torch.randperm(high - first, generator=generator)[:count]


def anchored_blocks(
    drafter: DFlashDrafter, target: Transformer, tokens: Tensor, features: Tensor, anchors: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Blocks anchored at `anchors` of one sequence (tokens [L], features [L, F]), each seeing the context
    strictly before its anchor: hidden states [n, B, D], labels [n, B-1] (token anchor+k), valid [n, B-1],
    on the drafter's device (where `tokens` and `anchors` are moved when they are not there yet)."""
    b = drafter.config.block_size
    device = place_of(drafter).device
    tokens, anchors = tokens.to(device), anchors.to(device)
    ctx_kv = drafter.context_kv(features)
    ctx_mask = torch.arange(tokens.shape[0], device=device)[None, :] < anchors[:, None]
    hidden = drafter.block_hidden(target, drafter.block_ids(tokens[anchors]), anchors, ctx_kv, ctx_mask)
    label_pos = anchors[:, None] + torch.arange(1, b, device=device)[None, :]
    valid = label_pos < tokens.shape[0]
    return hidden, tokens[label_pos.clamp(max=tokens.shape[0] - 1)], valid


def dflash_loss(
    drafter: DFlashDrafter, target: Transformer, tokens: Tensor, features: Tensor, anchors: Tensor, gamma: float
) -> Tensor:
    """Decayed cross-entropy of all blocks anchored in one sequence (tokens [L], features [L, F])."""
    hidden, labels, valid = anchored_blocks(drafter, target, tokens, features, anchors)
    logits = block_logits(target, hidden)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.where(valid, labels, -100).reshape(-1),
                         reduction="none").view(labels.shape)
    w = decay_weights(drafter.config.block_size, gamma, valid.device)[None, :] * valid
    return (ce * w).sum() / w.sum()


def block_logits(target: Transformer, hidden: Tensor) -> Tensor:
    """The target's LM head over the drafted positions, [n, B-1, V] in fp32: the drafter's fp32 states are cast
    to the head's dtype (a bf16 target's head refuses fp32 outside autocast), and a softmax over the
    vocabulary loses too much in bf16."""
    return target.lm_head(hidden[:, 1:].to(target.lm_head.weight.dtype)).float()


def decay_weights(block_size: int, gamma: float, device: torch.device) -> Tensor:
    """Loss weight of block positions 1..B-1: exp(-(k-1)/gamma)."""
    return torch.exp(-torch.arange(block_size - 1, dtype=torch.float, device=device) / gamma)


BlockLoss = Callable[[DFlashDrafter, Transformer, Tensor, Tensor, Tensor, float], Tensor]
"""(drafter, target, tokens [L], features [L, F], anchors [n], gamma) -> scalar loss of one sequence's blocks."""


def fit_drafter(
    drafter: DFlashDrafter,
    target: Transformer,
    sequences: list[tuple[list[int], int]],
    steps: int,
    lr: float = 3e-3,
    anchors_per_seq: int = 16,
    seed: int = 0,
    run_dir: Path | None = None,
    checkpoint_every: int = 200,
    progress: bool = False,
    max_new_steps: int | None = None,
    loss_fn: BlockLoss | None = None,
    batch: int = 1,
    world: World = SINGLE,
    desc: str = "drafter",
    feature_cache: int = 8 * 2**30,
) -> list[float]:
    """Train on (tokens, response_start) pairs with AdamW and cosine decay; returns this call's loss curve.

    The loss is the DFlash recipe's decayed cross-entropy unless `loss_fn` says otherwise
    (on-policy distillation uses the same loop with a KL loss).

    The target's placement is the run's (`training/precision.py`): the drafter must be in fp32 on its
    device, and on CUDA with a half placement the loss's forward runs under bf16 autocast. Anchors and the
    order come from CPU generators, so a seed gives the same run on every device.

    `batch` sequences per step (the global batch), in a seeded order reshuffled every pass; the loss is their
    mean. Under torchrun (`world`) each process trains its share of every batch and DistributedDataParallel
    averages the gradients, so a step is the same step at any world size (up to the order of float sums):
    a sequence's anchors depend only on its place in the run, never on the process that trains it. One
    sequence per step (`batch` 1) draws its anchors from one generator, as the recipe always did.
    The target's features are computed when a sequence is first trained and kept while they fit in
    `feature_cache` bytes (`FeatureStore`).

    With `run_dir`, metrics (the global batch's mean loss) are appended to metrics.jsonl and a checkpoint is
    written every `checkpoint_every` steps, by the main process; a later call with the same arguments, at any
    world size, resumes from it and ends with the same weights; `max_new_steps` stops early (time-boxed
    sessions) after a checkpoint.
    """
    place = place_of(target)
    check_master(drafter, place, "drafter")
    if batch < 1 or batch % world.size:
        raise ValueError(f"batch: {batch} sequences per step do not split over {world.size} processes")
    if batch > 1:  # every process runs every step's forwards: none may lack a token to predict
        sequences = [(t, s) for t, s in sequences if len(t) - 1 > max(s - 1, 0)]
    features = FeatureStore(target, sequences, drafter.config.target_layer_ids, feature_cache)
    for p in target.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(drafter.parameters(), lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    step = _resume(run_dir, drafter, opt, g, world.is_main)
    model = world.wrap(SequenceLoss(drafter, loss_fn or dflash_loss))
    log = None if run_dir is None or not world.is_main else (run_dir / "metrics.jsonl").open("a")
    drafter.train()
    losses: list[float] = []
    gamma = default_gamma(drafter.config.block_size)
    stop_at = steps if max_new_steps is None else min(steps, step + max_new_steps)
    bar = tqdm(range(step, stop_at), initial=step, total=steps, disable=not (progress and world.is_main), desc=desc)
    for step in bar:
        picks = [_pick(features, step, i, batch, seed, anchors_per_seq, g) for i in world.share(batch)]
        if batch == 1 and picks[0][1].numel() == 0:
            continue
        for group in opt.param_groups:
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        opt.zero_grad()
        local = _accumulate(model, target, picks, gamma, place)
        opt.step()
        losses.append(world.mean(local, place.device))
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
        if log is not None:
            log.write(json.dumps({"step": step + 1, "loss": round(losses[-1], 6), "lr": opt.param_groups[0]["lr"]}) + "\n")
        if run_dir is not None and ((step + 1) % checkpoint_every == 0 or step + 1 == stop_at):
            _checkpoint(run_dir, drafter, opt, g, step + 1, log, world)
    bar.close()
    if log is not None:
        log.close()
    drafter.eval()
    return losses


class SequenceLoss(nn.Module):
    """The drafter and its loss as one module whose forward is one sequence's loss: what DistributedDataParallel
    wraps, since it synchronises gradients of what runs through its forward (the loss calls the drafter's parts,
    not its forward). The frozen target is an argument, not a submodule, so it is neither broadcast nor synced."""

    def __init__(self, drafter: DFlashDrafter, loss_fn: BlockLoss) -> None:
        super().__init__()
        self.drafter, self.loss_fn = drafter, loss_fn

    def forward(self, target: Transformer, tokens: Tensor, features: Tensor, anchors: Tensor, gamma: float) -> Tensor:
        return self.loss_fn(self.drafter, target, tokens, features, anchors, gamma)


class FeatureStore:
    """Tokens and target features of each training sequence, computed on first use on the target's device and
    kept while they fit in `budget` bytes: a process computes only the sequences it trains, and a large corpus
    need not fit in memory at once (beyond the budget, features are recomputed: the same values)."""

    def __init__(self, target: Transformer, sequences: list[tuple[list[int], int]], layer_ids: list[int],
                 budget: int = 8 * 2**30) -> None:
        self.target, self.sequences, self.layer_ids, self.budget = target, sequences, layer_ids, budget
        self.kept: dict[int, tuple[Tensor, Tensor, int]] = {}
        self.kept_bytes = 0

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor, int]:
        if i in self.kept:
            return self.kept[i]
        tokens, start = self.sequences[i]
        device = place_of(self.target).device
        item = (torch.tensor(tokens, device=device), target_features(self.target, tokens, self.layer_ids), start)
        size = item[1].numel() * item[1].element_size()
        if self.kept_bytes + size <= self.budget:
            self.kept[i], self.kept_bytes = item, self.kept_bytes + size
        return item


def _pick(features: FeatureStore, step: int, i: int, batch: int, seed: int, count: int,
          g: torch.Generator) -> tuple[tuple[Tensor, Tensor, int], Tensor]:
    """The `i`-th sequence of step `step`'s global batch and its anchors: from the run's generator with one
    sequence per step (the recipe's draw), else from a generator seeded by the sequence's place in the run."""
    position = step * batch + i
    item = features[_order(len(features), position, seed)]
    tokens, _, start = item
    draw = g if batch == 1 else torch.Generator().manual_seed(seed * 1_000_003 + position)
    return item, sample_anchors(max(start - 1, 0), tokens.shape[0], count, draw)


def _accumulate(model: nn.Module, target: Transformer, picks: list[tuple[tuple[Tensor, Tensor, int], Tensor]],
                gamma: float, place: Placement) -> float:
    """Backward of the mean loss of this process's sequences, one at a time (one sequence's activations in memory),
    gradients synchronised once, on the last; returns that mean."""
    total = 0.0
    for k, ((tokens, feats, _), anchors) in enumerate(picks):
        if anchors.numel() == 0:
            raise ValueError("a training sequence has no response token to predict: drop it before training")
        with no_sync(model, keep=k < len(picks) - 1):
            with autocast(place):
                loss = model(target, tokens, feats, anchors.to(tokens.device), gamma)
            (loss / len(picks)).backward()
        total += loss.item()
    return total / len(picks)


def _checkpoint(run_dir: Path, drafter: DFlashDrafter, opt: torch.optim.Optimizer, g: torch.Generator, step: int,
                log: IO[str] | None, world: World) -> None:
    """The main process writes the state to resume from, whole or not at all (a kill mid-write leaves the previous
    one); the metrics are flushed first, so they never end before the checkpoint does."""
    if world.is_main:
        if log is not None:
            log.flush()
        state = {"drafter": drafter.state_dict(), "optimizer": opt.state_dict(), "step": step,
                 "generator": g.get_state()}
        tmp = run_dir / "checkpoint.pt.tmp"
        torch.save(state, tmp)
        os.replace(tmp, run_dir / "checkpoint.pt")
    world.barrier()


def _order(n: int, step: int, seed: int) -> int:
    """Index of the sequence trained at `step`: a fresh seeded permutation every pass over the data."""
    epoch, i = divmod(step, n)
    return int(torch.randperm(n, generator=torch.Generator().manual_seed(seed * 7919 + epoch))[i])


def _resume(run_dir: Path | None, drafter: DFlashDrafter, opt: torch.optim.Optimizer, g: torch.Generator,
            writer: bool = True) -> int:
    """Step to start from: 0, or the one saved in run_dir/checkpoint.pt (whose state is loaded). Read onto the
    CPU, whatever device wrote it: the loads copy into the models' devices, and the generator state is a CPU
    tensor. The `writer` drops metrics logged after that checkpoint (a run killed between two): they are logged
    again."""
    if run_dir is None:
        return 0
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = run_dir / "checkpoint.pt"
    step = 0
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False, map_location="cpu")
        drafter.load_state_dict(state["drafter"])
        opt.load_state_dict(state["optimizer"])
        g.set_state(state["generator"])
        step = state["step"]
    if writer:
        _truncate_metrics(run_dir / "metrics.jsonl", step)
    return step


def _truncate_metrics(path: Path, step: int) -> None:
    """Keep the whole lines of steps up to `step`; a line cut by a kill is dropped."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            break
        if row["step"] > step:
            break
        kept.append(line + "\n")
    path.write_text("".join(kept))


def new_drafter(target: Transformer, mask_token_id: int, num_layers: int = 2, block_size: int = 16,
                seed: int = 0) -> DFlashDrafter:
    """A DFlash drafter shaped for `target` (same width and head layout), target layers spread as published,
    in fp32 on the target's device for training; initialised on the CPU, so a seed gives the same weights
    on every device."""
    t = target.config
    hf = {"hidden_size": t.hidden_size, "intermediate_size": t.intermediate_size, "num_attention_heads":
          t.num_attention_heads, "num_key_value_heads": t.num_key_value_heads, "head_dim": t.head_dim,
          "rms_norm_eps": t.rms_norm_eps, "rope_theta": t.rope.theta, "hidden_act": "silu", "attention_bias": False,
          "num_hidden_layers": num_layers, "num_target_layers": t.num_hidden_layers, "block_size": block_size,
          "vocab_size": t.vocab_size, "max_position_embeddings": t.max_position_embeddings,
          "dflash_config": {"mask_token_id": mask_token_id}}
    torch.manual_seed(seed)
    drafter = DFlashDrafter(DrafterConfig.from_hf(hf))
    with torch.no_grad():
        for p in drafter.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)
    return move_to(drafter, master_place(place_of(target)))


def regenerate(target: Transformer, prompts: list[list[int]], max_tokens: int, batch: int = 32,
               out: Path | None = None, progress: bool = False, tags: list[str] | None = None,
               drafter: DFlashDrafter | None = None, temperatures: tuple[float, ...] = (0.0,),
               seed: int = 0) -> list[list[int]]:
    """The target's own continuations: the drafter learns the target, not the corpus.

    Greedy by default; prompt i is decoded at temperatures[i % len(temperatures)] (seeded). With
    a drafter the text is generated through speculative decoding (mode dflash): the same text,
    and the tau it reached is recorded (on-policy rounds report it). With `out`, responses are
    appended to a JSON-lines file chunk by chunk (with the prompt's tag, its domain) and the
    ones already there are reused, so an interrupted run picks up where it stopped.
    """
    tags = tags or [""] * len(prompts)
    done: list[list[int]] = []
    if out is not None and out.exists():
        lines = out.read_text().splitlines()
        for line, p in zip(lines, prompts):
            row = json.loads(line)
            if row["prompt"] != p:
                break  # written for other prompts: keep only the prefix that matches
            done.append(row["response"])
        if len(done) < len(lines):
            out.write_text("".join(line + "\n" for line in lines[: len(done)]))
    engine = Engine(target, drafter, num_slots=batch,
                    max_len=context_length([len(p) for p in prompts], max_tokens, block_size_of(drafter)))
    mode = "dflash" if drafter else "ar"
    chunk = 4 * batch
    with tqdm(total=len(prompts), initial=len(done), disable=not progress, desc="generate") as bar:
        for i in range(len(done), len(prompts), chunk):
            idx = range(i, min(i + chunk, len(prompts)))
            reqs = [Request(prompts[j], max_tokens, mode=mode,
                            sampling=SamplingParams(temperatures[j % len(temperatures)], seed=seed + j)) for j in idx]
            seqs = engine.generate(reqs, concurrency=batch)
            done.extend(s.output for s in seqs)
            if out is not None:
                with out.open("a") as f:
                    f.writelines(json.dumps({"domain": tags[j], "prompt": prompts[j], "response": s.output,
                                             "temperature": reqs[k].sampling.temperature, "tau": tau(s.steps, 4)}) + "\n"
                                 for k, (j, s) in enumerate(zip(idx, seqs)))
            bar.update(len(idx))
    return done


def training_prompts(data_dir: str | Path, tokenizer: Tokenizer, per_domain: int, max_prompt_tokens: int,
                     seed: int) -> list[tuple[str, list[int]]]:
    """Seeded sample of training prompts of every domain: the prompt of prompt/response records,
    a random cut of text records (the continuation is what the target writes)."""
    rng = random.Random(seed)
    out = []
    for domain in DOMAINS:
        docs = list(documents(data_dir, domain))
        for text in rng.sample(docs, min(per_domain, len(docs))):
            ids = tokenizer.encode(as_prompt(text.split("\n\n")[0]) if domain in PROMPT_DOMAINS else text).ids
            cut = rng.randint(min(16, len(ids)), max(16, min(len(ids), max_prompt_tokens)))
            out.append((domain, ids[:cut]))
    return [(d, p) for d, p in out if p]


def add_data_arguments(p: argparse.ArgumentParser, prompts_per_domain: int) -> None:
    """Options every drafter-training command shares: models, data, work folder, prompts, seed."""
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR, help="holds target/")
    p.add_argument("--data", type=Path, required=True, help=f"the corpus folder: {TRAIN_LAYOUT}")
    p.add_argument("--work", type=Path, help="generated data, checkpoints, metrics (default: work/<out>)")
    p.add_argument("--prompts-per-domain", type=int, default=prompts_per_domain)
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--response-tokens", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="adaflash-train-drafter", description=__doc__)
    add_data_arguments(p, prompts_per_domain=200)
    p.add_argument("--out", default="drafter-dflash", help="drafter folder name inside --model-dir")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--anchors", type=int, default=64, help="blocks per training sequence and step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--init", type=Path, help="start from this drafter's weights (same shape) instead of a random one")
    add_placement_args(p)
    args = p.parse_args(argv)
    place = placement(args.device, args.dtype)
    work = args.work or Path("work") / args.out
    work.mkdir(parents=True, exist_ok=True)
    target = Transformer.from_pretrained(args.model_dir / "target", place)
    tokenizer = Tokenizer.from_file(str(args.model_dir / "target" / "tokenizer.json"))
    tagged = training_prompts(args.data, tokenizer, args.prompts_per_domain, args.max_prompt_tokens, args.seed)
    prompts = [p for _, p in tagged]
    responses = regenerate(target, prompts, args.response_tokens, out=work / "regenerated.jsonl", progress=True,
                           tags=[d for d, _ in tagged])
    drafter = new_drafter(target, tokenizer.token_to_id(BYTE_SPECIALS[2]), args.layers, args.block_size, args.seed)
    if args.init is not None:
        drafter.load_state_dict(DFlashDrafter.from_pretrained(args.init).state_dict())
    losses = fit_drafter(drafter, target, [(p + r, len(p)) for p, r in zip(prompts, responses)], args.steps,
                         lr=args.lr, anchors_per_seq=args.anchors, seed=args.seed, run_dir=work, progress=True)
    drafter.save_pretrained(args.model_dir / args.out, dtype=torch.float16)
    tail = losses[-20:]
    print(json.dumps({"drafter": str(args.model_dir / args.out), "sequences": len(prompts),
                      "last_loss": round(sum(tail) / len(tail), 4) if tail else None}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
