"""The served model's text side, independent of any server: prompt and stop ids in, text deltas out.

Requests are checked field by field in `protocol.parse_request`; what needs the tokenizer is here.
Text leaves as deltas: `Detokenizer` decodes the output from a little before the text already sent and
holds back an incomplete trailing UTF-8 character until the bytes that complete it arrive, so a stream
never splits a multi-byte character.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer, decoders

from adaflash.models.chat_template import ChatTemplate
from adaflash_contract.errors import RequestError

if TYPE_CHECKING:
    from adaflash.serving.protocol import Encoded

REPLACEMENT = "\ufffd"


def longest_token(tokenizer: Tokenizer) -> int:
    """The most bytes one token of `tokenizer` stands for: a text has at most that many characters a token, which
    lets a prompt be refused by its length in characters (`Limits.check_prompt_text`). The longer of the entry's
    vocabulary string (byte-level BPE spells each byte as one character) and its decoded UTF-8 bytes."""
    return max((max(len(tokenizer.id_to_token(i) or ""), len(tokenizer.decode([i]).encode()))
                for i in range(tokenizer.get_vocab_size())), default=1)


def prompt_characters(values: dict[str, Any]) -> int:
    """The characters of what a request's prompt is made of (text_input, and the turns of a chat request)."""
    turns = values["messages"] if values["apply_chat_template"] else ()
    return len(values["text_input"]) + sum(len(t.get("content", "")) for t in turns)
DETOKENIZE_CONTEXT = 8  # tokens decoded before the sent ones (`Detokenizer._window`)


def encode(tokenizer: Tokenizer, values: dict[str, Any], vocab_size: int, eos_ids: list[int],
           chat: ChatTemplate | None = None) -> Encoded:
    """The token ids of a request parsed by `protocol.parse_request`; `chat` is the target's chat template, if it
    has one. A stop word of one token stops like end_id (the token is not output); a longer one is matched in the
    text (`TextStops`), since a text has many tokenisations and the model need not choose the tokenizer's. The
    prompt's length is checked with the request's other limits (`decoding.limits.Limits`)."""
    from adaflash.serving.protocol import Encoded  # late: the OpenAI front imports this module without torch

    ids = prompt_ids(tokenizer, values, chat)
    for name in ("end_id", "pad_id"):
        if values[name] is not None and not 0 <= values[name] < vocab_size:
            raise RequestError(name, f"must be a token id in [0, {vocab_size}), got {values[name]}")
    stops = [values["end_id"]] if values["end_id"] is not None else list(eos_ids)
    texts = []
    for word in values["stop_words"]:
        word_ids = tokenizer.encode(word).ids
        if len(word_ids) == 1:
            stops.append(word_ids[0])
        else:
            texts.append(word)
    bad = [tokenizer.encode(word).ids for word in values["bad_words"]]
    if any(not w for w in bad):
        raise RequestError("bad_words", "a word with no tokens")
    return Encoded(ids, stops, bad, texts)


def prompt_ids(tokenizer: Tokenizer, values: dict[str, Any], chat: ChatTemplate | None) -> list[int]:
    """text_input as sent, or with apply_chat_template the conversation (messages, then text_input as the user's
    turn) in the target's chat template, the assistant's turn opened: a chat model's drafter was trained on
    that text, not on the bare prompt."""
    if not values["apply_chat_template"]:
        for name in ("messages", "chat_template_kwargs"):
            if values[name]:
                raise RequestError(name, "only read with apply_chat_template true")
        return tokenizer.encode(values["text_input"]).ids
    if chat is None:
        raise RequestError("apply_chat_template", "the target has no chat template (chat_template in its "
                                                  "tokenizer_config.json, or chat_template.jinja)")
    conversation = [*values["messages"], {"role": "user", "content": values["text_input"]}]
    try:
        return chat.encode(tokenizer, conversation, **values["chat_template_kwargs"])
    except ValueError as exc:
        raise RequestError("messages", f"the target's chat template refused the conversation: {exc}") from None


class Detokenizer:
    """Text deltas of streamed outputs, from the ids so far and how many of them were already sent as text.

    With a byte-level decoder (GPT-2 style: Qwen, Llama 3, this project's models), a token's text depends only
    on the token and the bytes around it, so decoding starts shortly before the sent text instead of at the
    beginning: a stream costs O(tokens), not O(tokens^2). Other decoders can be non-local: with byte fallback
    (SentencePiece), one invalid byte turns a whole run of byte tokens into replacement characters. Those
    decode the whole output, as before.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.windowed = isinstance(tokenizer.decoder, decoders.ByteLevel)

    def delta(self, ids: list[int], sent_len: int, final: bool) -> str:
        """Text of ids[sent_len:] given that the text of ids[:sent_len] was already sent (held back the same
        way); from a window start, the same as from the whole output."""
        start, before = self._window(ids, sent_len) if self.windowed else (0, self._sent(ids, 0, sent_len))
        now = _stable(self.tokenizer.decode(ids[start:]), final)
        return now[len(before):]

    def _window(self, ids: list[int], sent_len: int) -> tuple[int, str]:
        """The latest start at least DETOKENIZE_CONTEXT tokens before `sent_len` whose text up to `sent_len`
        begins with a whole character (not a replacement character: the middle of a multi-byte one) and keeps
        some text after holding back (so all that is held back lies inside the window), with that text; else
        0. The context keeps a decoder's effects at a window's start (a stripped leading space) off the delta."""
        for start in range(sent_len - DETOKENIZE_CONTEXT, 0, -1):
            text = self.tokenizer.decode(ids[start:sent_len])
            before = _stable(text, final=False)
            if before and not text.startswith(REPLACEMENT):
                return start, before
        return 0, self._sent(ids, 0, sent_len)

    def _sent(self, ids: list[int], start: int, sent_len: int) -> str:
        return _stable(self.tokenizer.decode(ids[start:sent_len]), final=False) if sent_len > start else ""



def _stable(text: str, final: bool) -> str:
    """Drop a trailing replacement character (an incomplete UTF-8 sequence) unless nothing more will come."""
    return text if final else text.rstrip(REPLACEMENT)


class TextStops:
    """Stop strings found in the decoded output (`Request.stop_text`): the output keeps the token that completes
    one, as TensorRT-LLM keeps a stop word's tokens; the text after it in that token stays too."""

    def __init__(self, tokenizer: Tokenizer, words: tuple[str, ...]) -> None:
        self.tokenizer, self.words = tokenizer, words
        self.span = max(len(w.encode()) for w in words)  # a token holds at least a byte: the most tokens a word spans

    def __call__(self, output: list[int], first_new: int) -> int | None:
        """The output length to keep when a stop string ends in output[first_new:]: the shortest prefix whose text
        holds it; None when none does."""
        start = max(0, first_new - self.span)
        before = self._text(output[start:first_new])
        text = self._text(output[start:])
        ends = [i + len(w) for w in self.words
                if (i := text.find(w, max(0, len(before) - len(w) + 1))) >= 0]
        if not ends:
            return None
        end = min(ends)
        for keep in range(first_new + 1, len(output) + 1):
            if len(self._text(output[start:keep])) >= end:
                return keep
        return len(output)

    def _text(self, ids: list[int]) -> str:
        return _stable(self.tokenizer.decode(ids), final=False)
