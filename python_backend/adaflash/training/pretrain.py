"""Train the embedded default target from scratch: corpus, byte-level BPE tokenizer, pretraining.

Every stage is a command that is seeded, resumable and writes JSON-lines metrics:
`adaflash-pretrain tokenizer`, `adaflash-pretrain tokenize`, `adaflash-pretrain target`
(`adaflash-pretrain all` runs the three).
The target is a Qwen3 folder (config.json, model.safetensors, tokenizer.json,
generation_config.json) that transformers and the project's runner both load.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm import tqdm

from adaflash.cli_args import DEFAULT_MODEL_DIR, add_placement_args
from adaflash.models.chat_template import CHATML, CONFIG_FILE
from adaflash.models.layers import RopeConfig
from adaflash.models.placement import CPU, Placement, move_to, placement
from adaflash.models.target import TargetConfig, Transformer
from adaflash.models.tokenizer import BYTE_SPECIALS
from adaflash.corpus import DOMAINS, TRAIN_LAYOUT, documents
from adaflash.heldout import heldout_loss
from adaflash.training.precision import autocast, master_place


def train_tokenizer(data_dir: str | Path, out: str | Path, vocab_size: int = 8192,
                    chars_per_domain: int = 4_000_000) -> Tokenizer:
    """Byte-level BPE over an equal share of every domain; specials: end of sequence, padding, mask."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(BYTE_SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=True)
    texts = (t for d in DOMAINS for t in documents(data_dir, d, chars_per_domain))
    tok.train_from_iterator(texts, trainer=trainer)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    return tok


def tokenize_corpus(data_dir: str | Path, tokenizer: Tokenizer, out_dir: str | Path,
                    limit_chars: int | None = None) -> dict[str, int]:
    """One uint16 token stream per domain (documents joined by end-of-sequence); returns token counts."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    eos = tokenizer.token_to_id(BYTE_SPECIALS[0])
    counts = {}
    for domain in DOMAINS:
        ids: list[int] = []
        batch = list(documents(data_dir, domain, limit_chars))
        for enc in tokenizer.encode_batch(batch):
            ids.extend(enc.ids)
            ids.append(eos)
        np.save(out_dir / f"{domain}.npy", np.asarray(ids, dtype=np.uint16))
        counts[domain] = len(ids)
    (out_dir / "counts.json").write_text(json.dumps(counts, indent=1))
    return counts


@dataclass
class PretrainConfig:
    hidden_size: int = 384
    intermediate_size: int = 1152
    num_hidden_layers: int = 6
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    head_dim: int = 64
    context: int = 1024  # training window = the model's max_position_embeddings
    batch_size: int = 4  # 4k tokens a step: many small steps beat few large ones on a CPU budget
    steps: int = 2200  # about 9M tokens
    lr: float = 1.5e-3
    min_lr_ratio: float = 0.1
    warmup: int = 60
    weight_decay: float = 0.1
    mixture: dict[str, float] = field(default_factory=lambda: {"chat": 0.2, "code": 0.22, "math": 0.22,
                                                              "multilingual": 0.12, "prose": 0.24})
    seed: int = 0
    checkpoint_every: int = 200


def build_model(cfg: PretrainConfig, tokenizer: Tokenizer) -> Transformer:
    eos = tokenizer.token_to_id(BYTE_SPECIALS[0])
    target_cfg = TargetConfig(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        rope=RopeConfig(head_dim=cfg.head_dim, theta=10000.0), tie_word_embeddings=True,
        max_position_embeddings=cfg.context, eos_token_ids=[eos],
    )
    torch.manual_seed(cfg.seed)
    model = Transformer(target_cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                std = 0.02 / math.sqrt(2 * cfg.num_hidden_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                p.normal_(0.0, std)
    return model


def lr_at(step: int, cfg: PretrainConfig) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio x lr."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def sample_batch(streams: dict[str, np.ndarray], cfg: PretrainConfig, rng: np.random.Generator) -> torch.Tensor:
    """batch_size windows of context + 1 tokens; each window's domain drawn from the mixture."""
    names = list(cfg.mixture)
    weights = np.array([cfg.mixture[n] for n in names])
    rows = []
    for name in rng.choice(names, size=cfg.batch_size, p=weights / weights.sum()):
        stream = streams[name]
        start = int(rng.integers(0, len(stream) - cfg.context - 1))
        rows.append(stream[start : start + cfg.context + 1].astype(np.int64))
    return torch.from_numpy(np.stack(rows))


def pretrain(token_dir: str | Path, tokenizer_path: str | Path, out_dir: str | Path, cfg: PretrainConfig,
             progress: bool = True, max_new_steps: int | None = None, place: Placement = CPU) -> tuple[Transformer, bool]:
    """Train, resuming from out_dir/checkpoint.pt when present, for at most `max_new_steps` steps now
    (time-boxed sessions); returns the model and whether all cfg.steps are done. Appends to metrics.jsonl.

    The model is initialised on the CPU (a seed gives the same start on every device) and trained in fp32
    on `place`'s device, under bf16 autocast on CUDA with a half placement (`training/precision.py`); the
    batches are drawn on the CPU and moved."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    streams = {d: np.load(Path(token_dir) / f"{d}.npy") for d in cfg.mixture}
    model = move_to(build_model(cfg, tokenizer), master_place(place))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    rng = np.random.default_rng(cfg.seed)
    step = 0
    ckpt = out_dir / "checkpoint.pt"
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False, map_location="cpu")  # whatever device wrote it
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        rng.bit_generator.state = state["rng"]
        step = state["step"]
    model.train()
    log = (out_dir / "metrics.jsonl").open("a")
    bar = tqdm(total=cfg.steps, initial=step, disable=not progress, desc="pretrain")
    t0 = time.perf_counter()
    stop_at = cfg.steps if max_new_steps is None else min(cfg.steps, step + max_new_steps)
    while step < stop_at:
        batch = sample_batch(streams, cfg, rng).to(place.device)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        with autocast(place):
            logits = model.train_logits(batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        value = loss.item()
        bar.update(1)
        bar.set_postfix(loss=f"{value:.3f}")
        log.write(json.dumps({"step": step, "loss": round(value, 4), "lr": lr_at(step - 1, cfg),
                              "elapsed_s": round(time.perf_counter() - t0, 1)}) + "\n")
        if step % cfg.checkpoint_every == 0 or step == stop_at:
            log.flush()
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": rng.bit_generator.state,
                        "step": step, "config": asdict(cfg)}, ckpt)
    bar.close()
    log.close()
    model.eval()
    return model, step >= cfg.steps


def save_target(model: Transformer, tokenizer_path: str | Path, out: str | Path) -> None:
    """The Hugging Face folder: fp16 weights (half the size), tokenizer, its special tokens and ChatML chat template
    (chat requests and `--chat`), generation config."""
    out = Path(out)
    model.save_pretrained(out, dtype=torch.float16)
    Tokenizer.from_file(str(tokenizer_path)).save(str(out / "tokenizer.json"))
    (out / CONFIG_FILE).write_text(json.dumps(
        {"eos_token": BYTE_SPECIALS[0], "pad_token": BYTE_SPECIALS[1], "chat_template": CHATML}, indent=1) + "\n")
    eos = model.config.eos_token_ids[0]
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "do_sample": False}, indent=1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="adaflash-pretrain", description=__doc__)
    p.add_argument("stage", choices=["tokenizer", "tokenize", "target", "all"])
    p.add_argument("--data", type=Path, required=True,
                   help=f"the corpus folder: {TRAIN_LAYOUT}, and eval/heldout_<domain>.jsonl (rows with prompt and "
                        "reference: the held-out loss reported at the end)")
    p.add_argument("--work", type=Path, default=Path("work/pretrain"), help="tokenizer, token streams, checkpoints")
    p.add_argument("--out", type=Path, default=DEFAULT_MODEL_DIR / "target")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--limit-chars", type=int, help="per domain, for smoke runs")
    p.add_argument("--config", type=Path, help="JSON overriding PretrainConfig fields")
    p.add_argument("--max-new-steps", type=int, help="train at most this many steps now, then checkpoint and stop")
    add_placement_args(p)
    args = p.parse_args(argv)
    place = placement(args.device, args.dtype)
    cfg = PretrainConfig(**(json.loads(args.config.read_text()) if args.config else {}))
    tok_path = args.work / "tokenizer.json"
    if args.stage in ("tokenizer", "all"):
        train_tokenizer(args.data, tok_path, args.vocab_size, args.limit_chars or 4_000_000)
    if args.stage in ("tokenize", "all"):
        print(json.dumps(tokenize_corpus(args.data, Tokenizer.from_file(str(tok_path)), args.work / "tokens",
                                         args.limit_chars)))
    if args.stage in ("target", "all"):
        model, done = pretrain(args.work / "tokens", tok_path, args.work / "target-run", cfg,
                               max_new_steps=args.max_new_steps, place=place)
        if not done:
            print(json.dumps({"checkpoint": str(args.work / "target-run" / "checkpoint.pt"), "finished": False}))
            return 0
        save_target(model, tok_path, args.out)
        losses = heldout_loss(model, Tokenizer.from_file(str(tok_path)), args.data, context=cfg.context)
        (args.work / "heldout.json").write_text(json.dumps(losses, indent=1))
        print(json.dumps({"heldout_loss_nats": losses}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
