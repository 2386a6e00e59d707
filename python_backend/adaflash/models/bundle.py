"""A target, its drafter and its tokenizer, from a model folder or built tiny and random in memory.

A model folder holds `target/` (Hugging Face causal LM with tokenizer.json) and one or more
drafter folders beside it (`drafter/` is the default; others are picked by name).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from adaflash.models.drafter import DFlashDrafter, DrafterConfig
from adaflash.models.layers import RopeConfig
from adaflash.models.placement import CPU, Placement, move_to
from adaflash.models.target import TargetConfig, Transformer
from adaflash.models.tokenizer import BYTE_SPECIALS, byte_tokenizer, load_tokenizer


@dataclass
class Bundle:
    target: Transformer
    drafter: DFlashDrafter | None
    tokenizer: Tokenizer | None


def load_bundle(model_dir: str | Path, drafter: str | None = "drafter", place: Placement = CPU) -> Bundle:
    model_dir = Path(model_dir)
    target = Transformer.from_pretrained(model_dir / "target", place)
    draft = None
    if drafter:
        path = model_dir / drafter
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"drafter folder {path} not found")
        draft = DFlashDrafter.from_pretrained(path, place)
    return Bundle(target, draft, load_tokenizer(model_dir / "target"))


def save_bundle(bundle: Bundle, model_dir: str | Path, drafter: str = "drafter") -> Path:
    """Write a bundle as a model folder (`target/` with tokenizer.json, and the drafter) that load_bundle reads."""
    model_dir = Path(model_dir)
    bundle.target.save_pretrained(model_dir / "target")
    if bundle.tokenizer is not None:
        bundle.tokenizer.save(str(model_dir / "target" / "tokenizer.json"))
    if bundle.drafter is not None:
        bundle.drafter.save_pretrained(model_dir / drafter, dtype=torch.float32)
    return model_dir


def tiny_random_bundle(seed: int = 0, block_size: int = 16, length_head: bool = False,
                       vocab_size: int | None = None, place: Placement = CPU) -> Bundle:
    """Seeded tiny Qwen3 target and DFlash drafter over a byte tokenizer (or a bare small vocabulary).

    Tied embeddings with a large init make the random target favour tokens close to its
    input, so its greedy text mixes runs, loops and fresh tokens, as real text does; a
    drafter trained on it for a few seconds (`train_dflash.fit_drafter`) is accepted part of
    the time, which the tests need. The drafter returned here is random.
    """
    tok = byte_tokenizer() if vocab_size is None else None
    vocab = tok.get_vocab_size() if tok else vocab_size
    eos = tok.token_to_id(BYTE_SPECIALS[0]) if tok else None
    mask = tok.token_to_id(BYTE_SPECIALS[2]) if tok else vocab - 1
    torch.manual_seed(seed)
    tcfg = TargetConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rope=RopeConfig(head_dim=16, theta=10000.0), tie_word_embeddings=True,
        eos_token_ids=[] if eos is None else [eos],
    )
    target = Transformer(tcfg)
    randomize(target, std=0.2)
    with torch.no_grad():
        target.model.embed_tokens.weight.normal_(0.0, 1.0)
    dcfg = DrafterConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, rope=RopeConfig(head_dim=16, theta=10000.0), rms_norm_eps=1e-6, block_size=block_size,
        num_target_layers=4, target_layer_ids=[1, 2], mask_token_id=mask, length_head=length_head,
        length_head_dim=32, hf=_tiny_drafter_hf(),
    )
    drafter = DFlashDrafter(dcfg)
    randomize(drafter, std=0.1)
    return Bundle(move_to(target, place).eval(), move_to(drafter, place).eval(), tok)


def randomize(model: torch.nn.Module, std: float) -> None:
    """Normal(0, std) matrices, zero biases, norms near 1, from torch's global generator (seed it first)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.8, 1.2)
            elif p.dim() == 1:
                p.zero_()
            else:
                p.normal_(0.0, std)


def _tiny_drafter_hf() -> dict:
    return {
        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
        "attention_bias": False, "tie_word_embeddings": False,
    }
