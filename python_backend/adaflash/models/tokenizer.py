"""Tokenizers: the checkpoint's `tokenizer.json`, or a byte-level one for the tiny random models."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

BYTE_SPECIALS = ("<|endoftext|>", "<|pad|>", "<|mask|>")


def load_tokenizer(model_dir: str | Path) -> Tokenizer:
    path = Path(model_dir) / "tokenizer.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: a target folder ships its tokenizer.json")
    return Tokenizer.from_file(str(path))


def byte_tokenizer() -> Tokenizer:
    """256 byte tokens (ids 0..255) then the special tokens: every text round-trips, no training needed."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(BYTE_SPECIALS))
    return tok
