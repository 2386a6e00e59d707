"""Lossless verification of drafted tokens: greedy prefix matching and speculative sampling.

The draft is deterministic (argmax of the drafter, or copied n-gram tokens), so the
drafter's distribution is a point mass q = 1[x]. Accepting x with probability
min(1, p(x)/q(x)) = p(x) and, on rejection, sampling from (p - q)+ renormalised, which is
p with x removed, yields exactly the target distribution p at every position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from adaflash_contract.errors import RequestError


@dataclass(frozen=True)
class SamplingParams:
    """What the target applies to its logits before choosing a token. Penalties, `min_tokens` and `bad_words`
    change the target's own distribution, so verification applies them at every drafted position exactly as
    plain decoding would at that position (`process_logits`): speculation stays lossless under them."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    repetition_penalty: float = 1.0  # CTRL's, over prompt and output (Hugging Face, TensorRT-LLM)
    presence_penalty: float = 0.0  # OpenAI's, over the output (vLLM)
    frequency_penalty: float = 0.0  # OpenAI's, over the output (vLLM)
    min_tokens: int = 0  # before this many output tokens, `end_ids` cannot be chosen
    end_ids: tuple[int, ...] = ()  # the request's stop tokens, masked while min_tokens is not reached
    bad_words: tuple[tuple[int, ...], ...] = ()  # token sequences never completed
    log_probs: bool = False  # report each output token's log-probability (`StepResult.log_probs`)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def processes(self) -> bool:
        """Whether the logits depend on the sequence's tokens so far (a history must be kept)."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or (self.min_tokens > 0 and bool(self.end_ids)) or bool(self.bad_words))

    def validate(self) -> None:
        """RequestError naming the first field out of range."""
        if not (math.isfinite(self.temperature) and self.temperature >= 0.0):
            raise RequestError("temperature", f"must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise RequestError("top_k", f"must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise RequestError("top_p", f"must be in (0, 1], got {self.top_p}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0.0):
            raise RequestError("repetition_penalty", f"must be > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise RequestError(name, f"must be finite, got {getattr(self, name)}")
        if self.min_tokens < 0:
            raise RequestError("min_tokens", f"must be >= 0, got {self.min_tokens}")
        if any(not w for w in self.bad_words):
            raise RequestError("bad_words", "an empty word")


@dataclass
class History:
    """A sequence's committed tokens (prompt, then output) that its logits processors read."""

    tokens: list[int]
    prompt_len: int


def process_logits(logits: Tensor, params: SamplingParams, history: History, draft: list[int]) -> Tensor:
    """logits: [n, V], row j the target's next-token logits after history + draft[:j]. Returns fp32 logits with
    the penalties and masks of each row's own prefix applied: what plain decoding sees at that position."""
    logits = logits.float().clone()
    n, vocab = logits.shape
    tokens = torch.tensor(history.tokens + draft[: n - 1], dtype=torch.long, device=logits.device)
    base = len(history.tokens)
    if params.repetition_penalty != 1.0 or params.presence_penalty or params.frequency_penalty:
        seen = _prefix_counts(tokens, base, n, vocab, 0)
        out = _prefix_counts(tokens, base, n, vocab, history.prompt_len)
        r = params.repetition_penalty
        logits = torch.where(seen > 0, torch.where(logits > 0, logits / r, logits * r), logits)
        logits = logits - params.presence_penalty * (out > 0) - params.frequency_penalty * out
    produced = base - history.prompt_len
    if params.min_tokens > produced and params.end_ids:
        rows = min(n, params.min_tokens - produced)
        logits[:rows, list(params.end_ids)] = float("-inf")
    if params.bad_words:
        prefix = history.tokens[-max(map(len, params.bad_words)):] if history.tokens else []
        for j in range(n):
            context = prefix + draft[:j]
            for word in params.bad_words:
                if len(word) == 1 or context[len(context) - len(word) + 1:] == list(word[:-1]):
                    logits[j, word[-1]] = float("-inf")
    return logits


def _prefix_counts(tokens: Tensor, base: int, rows: int, vocab: int, start: int) -> Tensor:
    """[rows, V]: how often each token occurs in tokens[start : base + j] for row j."""
    counts = torch.zeros(rows, vocab, device=tokens.device)
    counts += torch.bincount(tokens[start:base], minlength=vocab).to(counts.dtype)
    if rows > 1:
        steps = torch.zeros(rows, vocab, device=tokens.device)
        steps[torch.arange(1, rows, device=tokens.device), tokens[base:base + rows - 1]] = 1.0
        counts += steps.cumsum(0)
    return counts


def tempered(logits: Tensor, temperature: float) -> Tensor:
    """Logits over the temperature, each row shifted so that its largest is 0 first: the same distribution, but a
    temperature near 0 (a float's smallest) sends the others to -inf instead of every logit to +-inf, whose softmax
    is NaN. The likeliest token then has all the mass, as greedy decoding gives it."""
    return (logits - logits.amax(dim=-1, keepdim=True)) / temperature


def log_probs_of(logits: Tensor, params: SamplingParams, chosen: list[int]) -> list[float]:
    """log p of chosen[j] under row j: the processed logits at the request's temperature (1 when greedy), before
    top-k and top-p, as TensorRT-LLM and vLLM report them."""
    rows = logits[: len(chosen)].float()
    if not params.greedy:
        rows = tempered(rows, params.temperature)
    logp = torch.log_softmax(rows, dim=-1)
    return logp[torch.arange(len(chosen)), torch.tensor(chosen)].tolist()


def target_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """The distribution sampled from: temperature, then top-k, then top-p (nucleus), as in Hugging Face."""
    logits = tempered(logits.float(), params.temperature)
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass strictly above each token
        sorted_p = sorted_p.masked_fill(before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def verify_greedy(draft: list[int], target_ids: list[int]) -> list[int]:
    """target_ids[j] is the target's argmax after draft[:j]; commit the matching prefix plus the next target token."""
    a = 0
    while a < len(draft) and draft[a] == target_ids[a]:
        a += 1
    return draft[:a] + [target_ids[a]]


def verify_sampled(draft: list[int], probs: Tensor, generator: torch.Generator) -> tuple[list[int], float]:
    """probs: [len(draft) + 1, V]. Speculative sampling with a point-mass draft (see module docstring).

    Also returns the sum of p(x) over the draft tokens that were tried: the expected number of
    acceptances, which a caller can hold the observed count against.
    """
    committed: list[int] = []
    expected = 0.0
    for j, x in enumerate(draft):
        p = probs[j]
        px = p[x].item()
        expected += px
        if torch.rand((), generator=generator).item() < px:
            committed.append(x)
            continue
        residual = p.clone()
        residual[x] = 0.0
        committed.append(sample(residual, generator))
        return committed, expected
    committed.append(sample(probs[len(draft)], generator))
    return committed, expected


def sample(p: Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(p / p.sum(), 1, generator=generator).item())
