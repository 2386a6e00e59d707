"""The served model's text side, independent of any server: prompt and stop ids in, text deltas out.

Requests are checked field by field in `protocol.parse_request`; what needs the tokenizer is here.
Text leaves as deltas: `text_delta` decodes the whole output so far and holds back an incomplete
trailing UTF-8 character until the bytes that complete it arrive, so a stream never splits a
multi-byte character.
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer

REPLACEMENT = "\ufffd"


def encode(tokenizer: Tokenizer, values: dict[str, Any], max_prompt_tokens: int, vocab_size: int,
           eos_ids: list[int]) -> tuple[list[int], list[int]]:
    """Prompt ids and stop ids (end_id or the model's end of sequence, plus single-token stop words)
    of a request parsed by `protocol.parse_request`."""
    ids = tokenizer.encode(values["text_input"]).ids
    if len(ids) > max_prompt_tokens:
        raise ValueError(f"text_input: prompt of {len(ids)} tokens exceeds the limit of {max_prompt_tokens}")
    end_id = values["end_id"]
    if end_id is not None and not 0 <= end_id < vocab_size:
        raise ValueError(f"end_id: must be a token id in [0, {vocab_size}), got {end_id}")
    stops = [end_id] if end_id is not None else list(eos_ids)
    for word in values["stop_words"]:
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
