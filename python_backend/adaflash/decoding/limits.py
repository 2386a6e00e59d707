"""The one check of a request against what the server or engine can run: fields, lengths and capacity.

Every front door parses a request's fields into a `Request` (the wire's types and forms, `serving/protocol.py`; the
engine's callers build one) and hands it here before it is queued. A refusal is a `RequestError` naming the field
at fault, which each front door maps by that field (Triton's INVALID_ARGUMENT, OpenAI's `param`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from adaflash_contract.errors import RequestError
from adaflash_contract.modes import MODE_NAMES

if TYPE_CHECKING:  # types only: the OpenAI front shares `check_prompt_text` without importing torch
    from adaflash.decoding.sequence import Request
    from adaflash.models.cache import Paging


@dataclass(frozen=True)
class Limits:
    """What a request is checked against. `max_len`: cache positions per sequence; a request also leaves room for a
    draft block (`block_size`). `paging`: the paged caches' size (None: a max_len slot per sequence), which the
    request's prompt and output must fit whole. `max_output_tokens` and `max_prompt_tokens`: the server's caps
    (None: the context's)."""

    vocab_size: int
    max_len: int
    block_size: int
    modes: tuple[str, ...] = MODE_NAMES
    paging: Paging | None = None
    max_output_tokens: int | None = None
    max_prompt_tokens: int | None = None

    @property
    def page(self) -> int:
        return 1 if self.paging is None else self.paging.page

    def pages_for(self, request: Request) -> int:
        """Pages a sequence may fill: its prompt and every token it may produce (drafts stay within them)."""
        return -(-min(self.max_len, len(request.prompt_ids) + request.max_tokens) // self.page)

    def check(self, r: Request) -> None:
        """RequestError naming the first field at fault."""
        if r.mode.name not in self.modes:
            why = "needs a drafter and none is loaded" if r.mode.drafter else f"must be one of {', '.join(self.modes)}"
            raise RequestError("spec_mode", f"{r.mode.name!r} {why}")
        self._check_prompt(r.prompt_ids)
        self._check_max_tokens(r)
        if r.max_draft is not None and r.max_draft < 0:
            raise RequestError("max_draft", f"must be >= 0, got {r.max_draft}")
        r.sampling.validate()

    def check_prompt_text(self, characters: int, longest_token: int) -> None:
        """`check_prompt_text` against this limit."""
        check_prompt_text(characters, longest_token, self.max_prompt_tokens)

    def _check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise RequestError("prompt_ids", "empty prompt")
        if self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
            raise RequestError("text_input", f"prompt of {len(ids)} tokens exceeds the limit of {self.max_prompt_tokens}")
        if any(not 0 <= t < self.vocab_size for t in ids):
            raise RequestError("prompt_ids", "the prompt holds ids outside the vocabulary")

    def _check_max_tokens(self, r: Request) -> None:
        most = self.max_output_tokens
        if r.max_tokens < 1 or most is not None and r.max_tokens > most:
            raise RequestError("max_tokens", f"must be in [1, {most}], got {r.max_tokens}" if most is not None
                               else f"must be >= 1, got {r.max_tokens}")
        if len(r.prompt_ids) + r.max_tokens + self.block_size > self.max_len:
            raise RequestError("max_tokens", f"prompt length {len(r.prompt_ids)} + max_tokens {r.max_tokens} exceeds "
                                             f"the context limit {self.max_len - self.block_size}")
        if self.paging is not None and self.pages_for(r) > self.paging.pages:
            raise RequestError("max_tokens", f"the prompt and {r.max_tokens} new tokens need "
                                             f"{self.pages_for(r) * self.page} cache positions, the cache holds "
                                             f"{self.paging.pages * self.page}")


def check_prompt_text(characters: int, longest_token: int, max_prompt_tokens: int | None) -> None:
    """Refuse a prompt by its characters, before it is tokenised, where that is enough: no token holds more than
    `longest_token` characters (the tokenizer's longest), so more characters than that many times the limit are more
    tokens than the limit. One huge request is then refused in no time, without tokenising it (which would hold the
    loop that serves the others); a prompt under the bound is counted in tokens. RequestError naming text_input."""
    if max_prompt_tokens is not None and characters > max_prompt_tokens * max(longest_token, 1):
        raise RequestError("text_input", f"prompt of {characters} characters exceeds the limit of {max_prompt_tokens} "
                                         f"tokens (a token of this tokenizer holds at most {longest_token} characters)")
