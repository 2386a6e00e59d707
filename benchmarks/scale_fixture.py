"""A model of real size with random weights: Qwen3-0.6B's published configuration (28 layers, hidden 1,024, 16/8
heads, vocabulary 151,936, tied embeddings) saved as a Hugging Face folder, with the published Qwen3-0.6B DFlash
drafter's shape beside it (5 layers reading target layers 1, 7, 13, 19, 25, blocks of 16).

Why random weights: no weights can be downloaded here, and a step's cost does not depend on the weights' values (the
drafts' acceptance does: random weights accept little, which is what shows that adaflash falls back to plain
decoding without loss at scale). The folder is what llama.cpp converts and runs too, so both engines run the same
model. The tokenizer is a byte-level BPE whose ids cover the whole vocabulary (every id is a token a text can
produce), built from merges rather than trained, so that writing the fixture takes seconds and needs no corpus.

    .venv/bin/python benchmarks/scale_fixture.py --out bench-out/scale/qwen3-0.6b-random            # 2.4 GB
    .venv/bin/python benchmarks/scale_fixture.py --out /tmp/tiny --shape tiny                       # the CI test's

Generated, never committed (bench-out/ is ignored).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from adaflash.models.bundle import randomize
from adaflash.models.drafter import DFlashDrafter, DrafterConfig
from adaflash.models.target import TargetConfig, Transformer

# Qwen3-0.6B's config.json as published (the fields the runner and llama.cpp's converter read).
QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1000000, "attention_bias": False,
    "tie_word_embeddings": True, "max_position_embeddings": 40960, "bos_token_id": 151643, "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}
# The published Qwen3-0.6B DFlash drafter's config.json (z-lab), as the runner reads it.
DFLASH_QWEN3_0_6B = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16, "bos_token_id": 151643,
    "eos_token_id": 151645, "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 7, 13, 19, 25]},
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 3072,
    "layer_types": ["full_attention"] * 5, "max_position_embeddings": 40960, "num_attention_heads": 16,
    "num_hidden_layers": 5, "num_key_value_heads": 8, "num_target_layers": 28, "rms_norm_eps": 1e-6,
    "rope_scaling": None, "rope_theta": 1000000, "attention_bias": False, "tie_word_embeddings": False,
    "vocab_size": 151936, "sliding_window": None, "use_sliding_window": False,
}
# The same structure at toy size: what the CI test writes and serves.
TINY = {**QWEN3_0_6B, "vocab_size": 2048, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 4096,
        "bos_token_id": 2040, "eos_token_id": 2041}
TINY_DRAFTER = {**DFLASH_QWEN3_0_6B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                "layer_types": ["full_attention"] * 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "num_target_layers": 6, "vocab_size": 2048, "bos_token_id": 2040,
                "eos_token_id": 2041, "max_position_embeddings": 4096,
                "dflash_config": {"mask_token_id": 2042, "target_layer_ids": [1, 4]}}
SHAPES = {"qwen3-0.6b": (QWEN3_0_6B, DFLASH_QWEN3_0_6B), "tiny": (TINY, TINY_DRAFTER)}
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # Qwen3's first three, at the ids its config names
INIT_STD = 0.02  # the published initializer_range (norms drawn near 1, as the tiny bundles' are)


def covering_tokenizer(vocab_size: int, first_special: int) -> Tokenizer:
    """A byte-level BPE with exactly `first_special` regular tokens (the 256 bytes, then merges of two bytes, then
    of a merged pair and a byte, in a fixed order) and the special tokens from `first_special` on; the ids left
    above them stay unused, as Qwen3's padded vocabulary leaves them."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    merges: list[tuple[str, str]] = []
    pairs = ((a, b) for a in alphabet for b in alphabet)
    triples = ((a + b, c) for a, b in itertools.product(alphabet, alphabet) for c in alphabet)
    for left, right in itertools.chain(pairs, triples):
        if len(vocab) >= first_special:
            break
        vocab[left + right] = len(vocab)
        merges.append((left, right))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    if tok.get_vocab_size() > vocab_size:
        raise ValueError(f"the tokenizer's {tok.get_vocab_size()} tokens exceed the vocabulary of {vocab_size}")
    return tok


def write_fixture(out: Path, shape: str = "qwen3-0.6b", seed: int = 0) -> Path:
    """`out`/target (config.json, model.safetensors, tokenizer.json) and `out`/drafter, the model folder layout
    `adaflash serve --model-dir` and `adaflash bench --model-dir` read."""
    target_cfg, drafter_cfg = SHAPES[shape]
    torch.manual_seed(seed)
    target = Transformer(TargetConfig.from_hf(target_cfg))
    randomize(target, INIT_STD)
    target.save_pretrained(out / "target", dtype=torch.float32)
    config = json.loads((out / "target" / "config.json").read_text())  # the runner's, with the published fields kept
    (out / "target" / "config.json").write_text(json.dumps({**target_cfg, **config, "torch_dtype": "float32"},
                                                           indent=1) + "\n")
    tokenizer = covering_tokenizer(target_cfg["vocab_size"], target_cfg["bos_token_id"])
    tokenizer.save(str(out / "target" / "tokenizer.json"))
    del target
    drafter = DFlashDrafter(DrafterConfig.from_hf(drafter_cfg))
    randomize(drafter, INIT_STD)
    drafter.save_pretrained(out / "drafter", dtype=torch.float32)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="the model folder to write (target/ and drafter/)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6b")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    started = time.perf_counter()
    write_fixture(args.out, args.shape, args.seed)
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"{args.out}: {args.shape}, {size / 1e9:.2f} GB in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
