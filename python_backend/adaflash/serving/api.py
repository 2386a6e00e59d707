"""The request/response contract of the served model, independent of any server.

Requests arrive as named numpy arrays (TensorRT-LLM ensemble names); `parse_inputs` checks
them and says which field is wrong. Text leaves as deltas: `text_delta` decodes the whole
output so far and holds back an incomplete trailing UTF-8 character until the bytes that
complete it arrive, so a stream never splits a multi-byte character.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

REPLACEMENT = "\ufffd"


@dataclass
class GenerationInputs:
    prompt: str
    max_tokens: int
    stream: bool = False
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    end_id: int | None = None
    stop_words: tuple[str, ...] = ()
    spec_mode: str = "ar"
    max_draft: int = -1  # -1: the mode's default


def _scalar(tensors: dict[str, np.ndarray | None], name: str):
    value = tensors.get(name)
    if value is None:
        return None
    flat = np.asarray(value).reshape(-1)
    if flat.size != 1:
        raise ValueError(f"{name}: expected one value, got {flat.size}")
    return flat[0]


def _text(value, name: str) -> str:
    raw = value if isinstance(value, bytes) else str(value).encode()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{name}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def parse_inputs(tensors: dict[str, np.ndarray | None], default_mode: str, allowed_modes: tuple[str, ...],
                 max_output_tokens: int) -> GenerationInputs:
    """Named input arrays -> checked inputs; raises ValueError whose message starts with the field name."""
    prompt = _scalar(tensors, "text_input")
    if prompt is None:
        raise ValueError("text_input: required")
    prompt = _text(prompt, "text_input")
    if not prompt:
        raise ValueError("text_input: empty prompt")
    max_tokens = _scalar(tensors, "max_tokens")
    if max_tokens is None:
        raise ValueError("max_tokens: required")
    if not 1 <= int(max_tokens) <= max_output_tokens:
        raise ValueError(f"max_tokens: must be in [1, {max_output_tokens}], got {int(max_tokens)}")
    out = GenerationInputs(prompt=prompt, max_tokens=int(max_tokens), spec_mode=default_mode)
    if (v := _scalar(tensors, "stream")) is not None:
        out.stream = bool(v)
    if (v := _scalar(tensors, "temperature")) is not None:
        if not (math.isfinite(float(v)) and float(v) >= 0.0):
            raise ValueError(f"temperature: must be a finite number >= 0, got {float(v)}")
        out.temperature = float(v)
    if (v := _scalar(tensors, "top_k")) is not None:
        if int(v) < 0:
            raise ValueError(f"top_k: must be >= 0, got {int(v)}")
        out.top_k = int(v)
    if (v := _scalar(tensors, "top_p")) is not None:
        if not 0.0 < float(v) <= 1.0:
            raise ValueError(f"top_p: must be in (0, 1], got {float(v)}")
        out.top_p = float(v)
    if (v := _scalar(tensors, "random_seed")) is not None:
        out.seed = int(v)
    if (v := _scalar(tensors, "end_id")) is not None:
        out.end_id = int(v)
    if tensors.get("stop_words") is not None:
        out.stop_words = tuple(_text(w, "stop_words") for w in np.asarray(tensors["stop_words"]).reshape(-1) if len(w))
    if (v := _scalar(tensors, "spec_mode")) is not None:
        mode = _text(v, "spec_mode")
        if mode not in allowed_modes:
            raise ValueError(f"spec_mode: must be one of {', '.join(allowed_modes)}, got {mode!r}")
        out.spec_mode = mode
    if (v := _scalar(tensors, "max_draft")) is not None:
        if int(v) < 0:
            raise ValueError(f"max_draft: must be >= 0, got {int(v)}")
        out.max_draft = int(v)
    return out


def encode(tokenizer: Tokenizer, inputs: GenerationInputs, max_prompt_tokens: int, vocab_size: int,
           eos_ids: list[int]) -> tuple[list[int], list[int]]:
    """Prompt ids and stop ids (end_id or the model's end of sequence, plus single-token stop words)."""
    ids = tokenizer.encode(inputs.prompt).ids
    if len(ids) > max_prompt_tokens:
        raise ValueError(f"text_input: prompt of {len(ids)} tokens exceeds the limit of {max_prompt_tokens}")
    if inputs.end_id is not None and not 0 <= inputs.end_id < vocab_size:
        raise ValueError(f"end_id: must be a token id in [0, {vocab_size}), got {inputs.end_id}")
    stops = [inputs.end_id] if inputs.end_id is not None else list(eos_ids)
    for word in inputs.stop_words:
        word_ids = tokenizer.encode(word).ids
        if len(word_ids) != 1:
            raise ValueError(f"stop_words: {word!r} is {len(word_ids)} tokens; only single-token stop words are supported")
        stops.append(word_ids[0])
    return ids, stops


def text_delta(tokenizer: Tokenizer, ids: list[int], sent_len: int, final: bool) -> str:
    """Text of ids[sent_len:] given that the text of ids[:sent_len] was already sent (held back the same way)."""
    before = _stable(tokenizer.decode(ids[:sent_len]), final=False) if sent_len else ""
    now = _stable(tokenizer.decode(ids), final)
    return now[len(before):]


def _stable(text: str, final: bool) -> str:
    """Drop a trailing replacement character (an incomplete UTF-8 sequence) unless nothing more will come."""
    return text if final else text.rstrip(REPLACEMENT)

