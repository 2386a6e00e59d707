"""Batched prefill and verify on the target: the math of one target step for many sequences.

Shared by the in-process engine and the Triton target model, which differ only in how they
schedule sequences and where per-sequence state lives.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from adaflash.decoding.sampling import (
    History,
    SamplingParams,
    log_probs_of,
    process_logits,
    sample,
    target_probs,
    verify_greedy,
    verify_sampled,
)
from adaflash.models.cache import KVCache
from adaflash.models.layers import argmax
from adaflash.models.placement import indices
from adaflash.models.target import Transformer


@dataclass
class StepResult:
    committed: list[int]  # accepted draft tokens + the target's own next token
    accepted: int
    expected_accepted: float  # sampling: sum of p(x) over the draft tokens tried
    features: torch.Tensor | None  # target features of the positions now committed, for the drafter
    log_probs: list[float] | None = None  # per committed token, when its request asked (`SamplingParams.log_probs`)


def ms_since(t0: float) -> float:
    """Milliseconds since a `time.perf_counter()` stamp: how the models' forwards are timed."""
    return (time.perf_counter() - t0) * 1000


# Asked by `decode_run` after each step of a run: True ends the run there (a request waits to join the batch).
StopEarly = Callable[[], bool]


def _never() -> bool:
    return False


def on_cpu(logits: torch.Tensor) -> torch.Tensor:
    """Sampling draws from a CPU generator seeded per request, so a seed gives the same tokens on every device;
    the logits of the sampled rows come over in fp32."""
    return logits.float().cpu()


def _layers(capture: list[int] | None, wants: list[bool]) -> list[int] | None:
    """The layers a forward captures: none when no sequence in it drafts (their features would be dropped)."""
    return capture if capture and any(wants) else None


def _processed(logits: torch.Tensor, sp: SamplingParams, history: History | None,
               draft: list[int]) -> torch.Tensor | None:
    """The rows a sequence chooses from with its logits processors applied; None when it has none."""
    return None if history is None or not sp.processes else process_logits(logits, sp, history, draft)


def _log_probs(logits: torch.Tensor, sp: SamplingParams, committed: list[int]) -> list[float] | None:
    return log_probs_of(logits, sp, committed) if sp.log_probs else None


def prefill_batch(target: Transformer, cache: KVCache, slots: list[int], prompts: list[list[int]],
                  sampling: list[SamplingParams], generators: list[torch.Generator], capture: list[int] | None,
                  wants: list[bool]) -> list[StepResult]:
    """Fill each slot with its prompt and pick the first token; features cover every prompt position of the
    sequences that `wants` them."""
    ends = np.cumsum([len(p) for p in prompts])
    out = target.forward(cache, slots, prompts, logit_rows=indices(ends - 1, cache.k.device),
                         capture_layers=_layers(capture, wants))
    return _first_tokens(out.logits, out.hidden, prompts, sampling, generators, wants)


def _first_tokens(logits: torch.Tensor, hidden: torch.Tensor | None, prompts: list[list[int]],
                  sampling: list[SamplingParams], generators: list[torch.Generator],
                  wants: list[bool]) -> list[StepResult]:
    """Each prompt's first token from logits [one row per prompt], and its features from hidden [the prompts'
    rows, packed in order]."""
    results, end = [], 0
    for i, (prompt, sp, g) in enumerate(zip(prompts, sampling, generators)):
        end += len(prompt)
        processed = _processed(logits[i : i + 1], sp, History(prompt, len(prompt)), [])
        row = logits[i : i + 1] if processed is None else processed
        token = int(argmax(row[0])) if sp.greedy else sample(target_probs(on_cpu(row), sp)[0], g)
        # A view, as a verify's features are (`_judged`): a copy of every prompt's features cost about 0.5% of a
        # prefill of 32-64 prompts on the CPU (docs/history.md, engine speed round 37).
        feats = hidden[end - len(prompt) : end] if hidden is not None and wants[i] else None
        results.append(StepResult([token], 0, 0.0, feats, _log_probs(row, sp, [token])))
    return results


def step_batch(target: Transformer, cache: KVCache, new: int, slots: list[int], feeds: list[list[int]],
               sampling: list[SamplingParams], generators: list[torch.Generator], capture: list[int] | None,
               wants: list[bool] | None = None, histories: list[History | None] | None = None,
               runs: list[int] | None = None, stop_early: StopEarly | None = None) -> tuple[list[StepResult], float]:
    """One scheduler step on the target: the first `new` sequences are prefilled (feeds: their prompts), the
    others verified (feeds: [anchor] + draft); features go to the sequences that `wants` them (None: all).
    `histories`: per verified sequence, its committed tokens through the anchor (None: it has no logits
    processors). `runs` (no new sequences, feeds of one token): plain decoding of runs[i] steps for sequence
    i instead (`decode_run`, which `stop_early` may end sooner). Returns the results in order and the verify
    forwards' milliseconds (what the cost model learns from; 0 without one). Where the target's forwards are
    batch-invariant (`Transformer.batch_invariant`) prefills and verifies share one forward (`prefill_and_verify`),
    whose milliseconds are returned: neither the cost model nor the gate learns from an admitting step."""
    wants = [True] * len(slots) if wants is None else wants
    histories = [None] * len(slots) if histories is None else histories
    if new and len(slots) > new and runs is None and target.batch_invariant(cache):
        t0 = time.perf_counter()
        return prefill_and_verify(target, cache, new, slots, feeds, sampling, generators, capture, wants,
                                  histories), ms_since(t0)
    prefilled = prefill_batch(target, cache, slots[:new], feeds[:new], sampling[:new], generators[:new],
                              capture, wants[:new]) if new else []
    if len(slots) == new:
        return prefilled, 0.0
    t0 = time.perf_counter()
    if runs is not None:
        return decode_run(target, cache, slots, [f[0] for f in feeds], runs, sampling, generators, histories, capture,
                          wants, stop_early or _never), ms_since(t0)
    verified = verify_batch(target, cache, slots[new:], feeds[new:], sampling[new:], generators[new:], capture,
                            wants[new:], histories[new:])
    return prefilled + verified, ms_since(t0)


def prefill_and_verify(target: Transformer, cache: KVCache, new: int, slots: list[int], feeds: list[list[int]],
                       sampling: list[SamplingParams], generators: list[torch.Generator], capture: list[int] | None,
                       wants: list[bool], histories: list[History | None]) -> list[StepResult]:
    """`prefill_batch` of the first `new` sequences and `verify_batch` of the others in one forward, for a target
    whose forwards are batch-invariant (the caller checks): each sequence's results are bitwise those of the two
    forwards. Why: where sequences end one by one, every admission shares a call with the others' verifies, and a
    second forward reads every weight again for a verify's few rows."""
    ends = np.cumsum([len(f) for f in feeds])
    prompt_rows = int(ends[new - 1])
    rows = indices(np.concatenate([ends[:new] - 1, np.arange(prompt_rows, int(ends[-1]))]), cache.k.device)
    starts = [cache.lengths[s] for s in slots[new:]]
    out = target.forward(cache, slots, feeds, logit_rows=rows, capture_layers=_layers(capture, wants))
    hidden = out.hidden
    prefilled = _first_tokens(out.logits[:new], None if hidden is None else hidden[:prompt_rows], feeds[:new],
                              sampling[:new], generators[:new], wants[:new])
    return prefilled + _judged(out.logits[new:], None if hidden is None else hidden[prompt_rows:], cache, slots[new:],
                               starts, feeds[new:], sampling[new:], generators[new:], wants[new:], histories[new:])


def decode_run(target: Transformer, cache: KVCache, slots: list[int], anchors: list[int], runs: list[int],
               sampling: list[SamplingParams], generators: list[torch.Generator],
               histories: list[History | None], capture: list[int] | None,
               wants: list[bool], stop_early: StopEarly) -> list[StepResult]:
    """Plain decoding, runs[i] one-token steps for sequence i, each fed the token the step before committed;
    fewer when `stop_early()` turns true after a step (a request waits to join the batch: it waits no longer).

    Why: a served step loop pays a round trip to the target model per call, and plain decoding decides
    nothing between its steps, so one call can carry several. The forwards, generator draws and logits
    processors are those of runs[i] verify steps without a draft, so the tokens are the same; a sequence whose
    run is shorter leaves the batch when it ends. Each result's `committed` holds a token per step, and its
    features (for a sequence that `wants` them: it drafts later) a row per step."""
    committed: list[list[int]] = [[] for _ in slots]
    features: list[list[torch.Tensor]] = [[] for _ in slots]
    log_probs: list[list[float] | None] = [[] if sp.log_probs else None for sp in sampling]
    for step in range(max(runs, default=0)):
        rows = [i for i, n in enumerate(runs) if n > step]
        feeds = [[committed[i][-1] if committed[i] else anchors[i]] for i in rows]
        grown = [None if histories[i] is None else History(histories[i].tokens + committed[i], histories[i].prompt_len)
                 for i in rows]
        results = verify_batch(target, cache, [slots[i] for i in rows], feeds, [sampling[i] for i in rows],
                               [generators[i] for i in rows], capture, [wants[i] for i in rows], grown)
        for i, res in zip(rows, results):
            committed[i] += res.committed
            if res.features is not None:
                features[i].append(res.features)
            if log_probs[i] is not None:
                log_probs[i] += res.log_probs
        if stop_early():
            break
    return [StepResult(c, 0, 0.0, _joined(f), p) for c, f, p in zip(committed, features, log_probs)]


def _joined(rows: list[torch.Tensor]) -> torch.Tensor | None:
    """A run's features as one tensor (a single step's as they are: cat would copy them)."""
    return None if not rows else rows[0] if len(rows) == 1 else torch.cat(rows)


def verify_batch(target: Transformer, cache: KVCache, slots: list[int], feeds: list[list[int]],
                 sampling: list[SamplingParams], generators: list[torch.Generator], capture: list[int] | None,
                 wants: list[bool], histories: list[History | None]) -> list[StepResult]:
    """feeds[b] = [anchor] + draft. Verify every draft, then roll each slot back to its accepted length."""
    starts = [cache.lengths[s] for s in slots]
    out = target.forward(cache, slots, feeds, capture_layers=_layers(capture, wants))
    return _judged(out.logits, out.hidden, cache, slots, starts, feeds, sampling, generators, wants, histories)


def _judged(logits: torch.Tensor, hidden: torch.Tensor | None, cache: KVCache, slots: list[int], starts: list[int],
            feeds: list[list[int]], sampling: list[SamplingParams], generators: list[torch.Generator],
            wants: list[bool], histories: list[History | None]) -> list[StepResult]:
    """What each verified sequence commits, from the forward's logits and hidden rows of its feed (packed in
    order); each slot rolled back from `starts` to its accepted length."""
    greedy_ids = argmax(logits).tolist()
    results, row = [], 0
    for i, (slot, start, feed, sp, g) in enumerate(zip(slots, starts, feeds, sampling, generators)):
        n = len(feed)
        expected = 0.0
        processed = _processed(logits[row : row + n], sp, histories[i], feed[1:])
        rows = logits[row : row + n] if processed is None else processed
        if sp.greedy:
            ids = greedy_ids[row : row + n] if processed is None else argmax(processed).tolist()
            committed = verify_greedy(feed[1:], ids)
        else:
            committed, expected = verify_sampled(feed[1:], target_probs(on_cpu(rows), sp), g)
        accepted = len(committed) - 1
        cache.truncate(slot, start + accepted + 1)
        # A view, not a copy: the forward's features are a tensor of their own, and a copy per sequence per step
        # took ~2% of a 64-sequence step (docs/history.md, round 15).
        feats = hidden[row : row + accepted + 1] if hidden is not None and wants[i] else None
        results.append(StepResult(committed, accepted, expected, feats, _log_probs(rows, sp, committed)))
        row += n
    return results
