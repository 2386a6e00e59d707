"""The served contract without a server: input checks name the field; streamed text never splits a character."""

from __future__ import annotations

import numpy as np
import pytest

from adaflash.serving.api import encode, parse_inputs, text_delta
from adaflash.decoding.engine import MODES
from adaflash.models.tokenizer import byte_tokenizer


def _tensors(**kw):
    base = {"text_input": np.array([[b"hello"]], dtype=object), "max_tokens": np.array([[8]], dtype=np.int32)}
    base.update(kw)
    return base


def test_defaults_and_overrides():
    got = parse_inputs(_tensors(), "adaflash", MODES, 100)
    assert (got.prompt, got.max_tokens, got.spec_mode, got.temperature, got.top_p) == ("hello", 8, "adaflash", 0.0, 1.0)
    got = parse_inputs(_tensors(spec_mode=np.array([[b"ngram"]], dtype=object), top_k=np.array([[5]]),
                                random_seed=np.array([[7]], dtype=np.uint64)), "adaflash", MODES, 100)
    assert (got.spec_mode, got.top_k, got.seed) == ("ngram", 5, 7)


@pytest.mark.parametrize("field,value", [
    ("max_tokens", np.array([[0]])), ("max_tokens", np.array([[101]])), ("temperature", np.array([[-1.0]])),
    ("temperature", np.array([[np.nan]])), ("top_p", np.array([[0.0]])), ("top_k", np.array([[-1]])),
    ("spec_mode", np.array([[b"medusa"]], dtype=object)), ("text_input", np.array([[b"\xc3"]], dtype=object)),
    ("text_input", np.array([[b""]], dtype=object)), ("max_draft", np.array([[-2]])),
])
def test_bad_values_name_their_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}:"):
        parse_inputs(_tensors(**{field: value}), "adaflash", MODES, 100)


def test_stop_words_and_end_id():
    tok = byte_tokenizer()
    inputs = parse_inputs(_tensors(stop_words=np.array([[b"\n", b"."]], dtype=object)), "ar", MODES, 100)
    ids, stops = encode(tok, inputs, 64, tok.get_vocab_size(), [256])
    assert stops == [256, tok.encode("\n").ids[0], tok.encode(".").ids[0]] and ids == tok.encode("hello").ids
    with pytest.raises(ValueError, match="^stop_words:"):
        encode(tok, parse_inputs(_tensors(stop_words=np.array([[b"\xc3\xa9"]], dtype=object)), "ar", MODES, 100),
               64, tok.get_vocab_size(), [256])
    with pytest.raises(ValueError, match="^text_input:"):
        encode(tok, parse_inputs(_tensors(text_input=np.array([[b"x" * 65]], dtype=object)), "ar", MODES, 100),
               64, tok.get_vocab_size(), [256])


def test_streamed_deltas_never_split_a_character_and_add_up_to_the_text():
    tok = byte_tokenizer()
    text = "naïve 世界 🙂 end"
    ids = tok.encode(text).ids
    deltas, sent = [], 0
    for n in range(1, len(ids) + 1):
        deltas.append(text_delta(tok, ids[:n], sent, final=n == len(ids)))
        sent = n
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    assert any(d == "" for d in deltas)  # held back while a multi-byte character was incomplete
    # Bytes that never form a character are sent as replacement characters, at the latest at the end.
    assert text_delta(tok, ids[:1] + [tok.encode("é").ids[0]], 1, final=True) == "\ufffd"
