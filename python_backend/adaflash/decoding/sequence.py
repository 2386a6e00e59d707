"""A generation request and the sequence that carries it through decoding, shared by the engine and the
served loop: the same caps, the same commit rules, so both produce the same output."""

from __future__ import annotations

import time

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from adaflash.decoding.policy import PolicyState
from adaflash.decoding.sampling import History, SamplingParams
from adaflash_contract.modes import REFERENCE_MODE, Mode, parse_mode

# Stop strings (`serving/api.py` TextStops): given the output and the index of its first token not yet searched,
# the output length to keep when a stop string ends in the new tokens, else None.
StopText = Callable[[list[int], int], "int | None"]


@dataclass
class Request:
    """A parsed generation request. `mode` may be given by name: it is resolved here, once, and is a `Mode` from
    then on (a name outside the registry is a RequestError naming spec_mode)."""

    prompt_ids: list[int]
    max_tokens: int
    mode: Mode = REFERENCE_MODE
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_draft: int | None = None  # the client's cap on k (draft tokens verified per step); None: no cap
    stop_ids: tuple[int, ...] | None = None  # None: the target's end-of-sequence ids
    stop_text: StopText | None = None  # stop strings of several tokens, matched in the text
    tag: str = ""  # free label carried to the result (a prompt id, a domain)

    def __post_init__(self) -> None:
        self.mode = parse_mode(self.mode)


@dataclass
class StepRecord:
    draft_len: int  # k: draft tokens sent to verification
    accepted: int  # of those, accepted
    committed: int  # tokens this step produced: accepted + bonus, cut after a stop token (counted) or at max_tokens
    expected_accepted: float = 0.0  # sampling only: sum of p(x) over the draft tokens tried
    copied: bool = False  # the draft was copied from the context (adaflash), not drafted


@dataclass
class Sequence:
    id: int
    request: Request
    tokens: list[int]
    generator: torch.Generator | None  # None when the target keeps it (served sequences)
    stop_ids: frozenset[int]
    slot: int = -1
    output: list[int] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    finish_reason: str | None = None  # stop, length, cancelled, error
    error: str | None = None  # why a model failed the sequence (finish_reason "error")
    policy: PolicyState | None = None
    can_draft: bool = True  # False without a drafter for its mode, or after the drafter failed it
    pending_context: list[torch.Tensor] = field(default_factory=list)  # target features not yet in the drafter
    submitted_at: float = 0.0  # time.perf_counter() stamps
    admitted_at: float | None = None  # when it left the queue for a slot
    first_token_at: float | None = None  # when its first output token was committed
    finished_at: float | None = None
    log_probs: list[float] = field(default_factory=list)  # per output token, when the request asked
    sampling: SamplingParams = field(init=False)  # the request's, its min_tokens masking the stop ids

    def __post_init__(self) -> None:
        sp = self.request.sampling
        self.sampling = replace(sp, end_ids=tuple(sorted(self.stop_ids))) if sp.min_tokens and not sp.end_ids else sp

    @property
    def history(self) -> History | None:
        """What the target's logits processors read (None: the request has none)."""
        return History(self.tokens, len(self.request.prompt_ids)) if self.sampling.processes else None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def target_forwards(self) -> int:
        return 1 + len(self.steps) if self.output or self.finished else 0

    def commit(self, tokens: list[int], log_probs: list[float] | None = None) -> int:
        """Append committed tokens up to a stop token, a stop string or max_tokens; returns how many were
        produced (the tokens a verify step accepted past a stop count: the target computed them)."""
        produced, before = 0, len(self.output)
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        for i, t in enumerate(tokens):
            produced += 1
            if t in self.stop_ids:
                self.finish_reason = "stop"
                break
            self.output.append(t)
            self.tokens.append(t)
            if log_probs is not None:
                self.log_probs.append(log_probs[i])
            if len(self.output) >= self.request.max_tokens:
                self.finish_reason = "length"
                break
        self._stop_at_text(max(before, self.sampling.min_tokens - 1))
        return produced

    def _stop_at_text(self, first_new: int) -> None:
        """Cut the output after the token that completes a stop string (none is sought before min_tokens)."""
        if self.request.stop_text is None or len(self.output) <= first_new:
            return
        keep = self.request.stop_text(self.output, first_new)
        if keep is None:
            return
        del self.tokens[len(self.tokens) - len(self.output) + keep:]
        del self.output[keep:], self.log_probs[keep:]
        self.finish_reason = "stop"


def tau(steps: list[StepRecord], digits: int | None = None) -> float | None:
    """Tokens committed per decode-step target forward, bonus included (None before the first step);
    rounded to `digits` for reports."""
    if not steps:
        return None
    value = sum(st.committed for st in steps) / len(steps)
    return value if digits is None else round(value, digits)


def context_length(prompt_lens: list[int], max_tokens: int, block_size: int) -> int:
    """Cache positions per sequence that the longest prompt needs: what `limits.Limits.check` asks of max_len,
    plus the anchor's position."""
    return max(prompt_lens) + max_tokens + block_size + 1


def draft_cap(r: Request, produced: int, length: int, block_size: int, max_len: int) -> int:
    """The cap: the most draft tokens worth verifying this step, from the client's max_draft, the tokens
    still wanted and the cache room."""
    limit = block_size - 1 if r.max_draft is None else min(r.max_draft, block_size - 1)
    return max(0, min(limit, r.max_tokens - produced - 1, max_len - length - 1))
