"""Offline throughput and acceptance benchmark: every mode on the same prompts, in one process.

Speed is only worth reporting for output that is right: at temperature 0 every mode's
output is compared token for token with mode `ar` at the same concurrency, and a mode
that differs gets no speed (the run then exits non-zero). With a tie tolerance (GPUs: half
precision, and kernels picked per batch shape even in fp32) an output may instead depart from
`ar`'s where the target's logits of the two tokens are within rounding of each other.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import cycle

from adaflash.decoding.engine import Engine
from adaflash_contract.modes import REFERENCE_MODE
from adaflash.decoding.sampling import SamplingParams
from adaflash.decoding.sequence import Request, Sequence, tau
from adaflash.models.target import Transformer


def departure_gap(target: Transformer, prompt: list[int], reference: list[int], output: list[int]) -> float:
    """How far apart the target's logits of `reference`'s and `output`'s tokens are where `output` first departs
    from `reference`, over the largest logit's magnitude, from a forward of that one sequence alone: 0.0 when the
    two are equal, inf when one merely stops first. A verify of k+1 rows and a decode of one row round differently
    in half precision (and, on a GPU, even in fp32 where the kernel is picked per batch shape), so a lossless mode
    can part from plain decoding where two tokens were within rounding of each other; a wrong one parts anywhere."""
    i = next((j for j, (a, b) in enumerate(zip(reference, output)) if a != b), None)
    if i is None:
        return 0.0 if len(reference) == len(output) else math.inf
    cache = target.new_cache(1, len(prompt) + i + 1)
    logits = target.forward(cache, [0], [prompt + reference[:i]]).logits[-1].float()
    return (logits[reference[i]] - logits[output[i]]).abs().item() / logits.abs().max().item()


def departures(target: Transformer, prompts: Iterable[list[int]], references: list[list[int]],
               outputs: list[list[int]]) -> list[float]:
    """`departure_gap` of each output that differs from its reference (the three aligned)."""
    return [departure_gap(target, p, r, o) for p, r, o in zip(prompts, references, outputs) if o != r]


def is_wrong(row: dict) -> bool:
    """A benchmark row whose greedy output differs from ar's, other than at near-ties it was allowed."""
    return row["greedy_equal_to_ar"] is False and not row.get("equal_up_to_ties")


def summarize(seqs: list[Sequence], wall_s: float, reference: list[list[int]] | None) -> dict:
    """Figures of one run: tau counts tokens committed per decode-step target forward, bonus included."""
    steps = [st for s in seqs for st in s.steps]
    tokens = sum(len(s.output) for s in seqs)
    equal = None if reference is None else all(s.output == r for s, r in zip(seqs, reference))
    return {
        "num_requests": len(seqs),
        "output_tokens": tokens,
        "wall_s": round(wall_s, 4),
        "output_tokens_per_s": round(tokens / wall_s, 2) if wall_s > 0 else None,
        "tau": tau(steps, 4),
        "mean_draft_len": round(sum(st.draft_len for st in steps) / len(steps), 4) if steps else None,
        "target_forwards": sum(s.target_forwards for s in seqs),
        "greedy_equal_to_ar": equal,
    }


def summarize_domain(seqs: list[Sequence], reference: list[list[int]] | None) -> dict:
    """Per-domain figures from a mixed run. Domains share the batch, so their speed is the domain's tokens over
    the time its requests held a slot (admission to finish, prefill included): at concurrency 1 that is the
    domain's own throughput. Time in the queue is left out: it is what the requests before took, of any
    domain."""
    figures = summarize(seqs, 0.0, reference)
    del figures["wall_s"]
    served_s = sum(s.finished_at - s.admitted_at for s in seqs)
    figures["output_tokens_per_s"] = round(sum(len(s.output) for s in seqs) / served_s, 2)
    return figures


@dataclass(frozen=True)
class Contender:
    """One row label of a throughput comparison: a mode run on an engine (which holds the drafter)."""

    name: str
    mode: str
    engine: Engine


def run_bench(
    engine: Engine,
    prompt_ids: list[list[int]],
    domains: list[str | None],
    modes: list[str],
    concurrencies: list[int],
    max_tokens: int,
    sampling: SamplingParams,
    progress: bool = True,
    passes: int = 1,
    each_domain: bool = False,
    tie_tolerance: float = 0.0,
) -> tuple[list[dict], bool]:
    """Rows per (mode, concurrency); returns (rows, ok) where ok is False if any greedy output differed from ar.

    With `each_domain`, every domain runs as a workload of its own (rows per domain, mode and concurrency, the
    domain under "workload"; concurrencies above its prompt count are left out): in a mixed run the domains share
    each verify forward, so a domain whose neighbours verify long copies runs slower per step than it would alone,
    and its slice of the mixed run does not say how a mode does on that domain's traffic."""
    contenders = [Contender(m, m, engine) for m in [REFERENCE_MODE] + [m for m in modes if m != REFERENCE_MODE]]
    if not each_domain:
        return compare(contenders, prompt_ids, domains, concurrencies, max_tokens, sampling, progress, label="mode",
                       passes=passes, tie_tolerance=tie_tolerance)
    rows, ok = [], True
    for domain in sorted({d for d in domains if d is not None}):
        part = [i for i, d in enumerate(domains) if d == domain]
        fitting = [c for c in concurrencies if c <= len(part)]
        if progress:
            print(f"workload {domain}: {len(part)} prompts", flush=True)
        found, equal = compare(contenders, [prompt_ids[i] for i in part], [None] * len(part), fitting, max_tokens,
                               sampling, progress, label="mode", passes=passes, tie_tolerance=tie_tolerance)
        rows += [{"workload": domain, **row} for row in found]
        ok = ok and equal
    return rows, ok


def compare(
    contenders: list[Contender],
    prompt_ids: list[list[int]],
    domains: list[str | None],
    concurrencies: list[int],
    max_tokens: int,
    sampling: SamplingParams,
    progress: bool = True,
    label: str = "mode",
    passes: int = 1,
    tie_tolerance: float = 0.0,
) -> tuple[list[dict], bool]:
    """Rows per (contender, concurrency), the contender's name under `label`; returns (rows, ok), ok False
    if any greedy output differed from ar's (with `tie_tolerance` > 0: other than at a near-tie, `departure_gap`
    at most that; such a row keeps its speed and counts its departures).

    The first contender must be plain `ar`: it is the reference for equality and speedups. All prompts run as one
    mixed workload; per-domain figures are read from that same run. The prompts run in rounds (`rounds`), every
    contender on each round before the next, so that a machine whose speed drifts over minutes (a shared one)
    weighs on every contender alike instead of on whichever ran during a slow spell. With `passes` > 1 all the
    rounds run that many times, each pass checked for equality, and the figures sum the passes: where the prompts
    fit in one round (a concurrency near their count) a single pass is one sample of a noisy machine; each pass's
    speed is kept beside the sum (`output_tokens_per_s_per_pass`).
    """
    assert contenders[0].mode == REFERENCE_MODE, "the reference mode comes first"
    rows, ok = [], True
    for c in concurrencies:
        seqs: dict[str, list[Sequence]] = {ct.name: [] for ct in contenders}
        walls = {ct.name: [0.0] * passes for ct in contenders}
        others = contenders[1:]
        parts = [(p, part) for p in range(passes) for part in rounds(len(prompt_ids), c)]
        for i, (p, part) in enumerate(parts):
            turn = i % len(others) if others else 0  # who follows the reference rotates from round to round
            for ct in [contenders[0], *others[turn:], *others[:turn]]:
                reqs = [Request(prompt_ids[j], max_tokens, mode=ct.mode, sampling=sampling) for j in part]
                t0 = time.perf_counter()
                seqs[ct.name] += ct.engine.generate(reqs, concurrency=c)
                walls[ct.name][p] += time.perf_counter() - t0
        reference = [s.output for s in seqs[contenders[0].name]]
        all_domains = domains * passes
        for ct in contenders:
            ref = reference if sampling.greedy else None
            row = {label: ct.name, "concurrency": c, **summarize(seqs[ct.name], sum(walls[ct.name]), ref)}
            if passes > 1:
                n = len(prompt_ids)
                row["output_tokens_per_s_per_pass"] = [
                    round(sum(len(s.output) for s in seqs[ct.name][p * n:(p + 1) * n]) / wall, 2)
                    for p, wall in enumerate(walls[ct.name])]
            if any(d is not None for d in domains):
                row["per_domain"] = {
                    d: summarize_domain([s for s, sd in zip(seqs[ct.name], all_domains) if sd == d],
                                        None if ref is None else [r for r, sd in zip(ref, all_domains) if sd == d])
                    for d in sorted({d for d in domains if d is not None})
                }
            if row["greedy_equal_to_ar"] is False and tie_tolerance > 0:
                _count_departures(row, contenders[0].engine.target, prompt_ids, reference, seqs[ct.name],
                                  tie_tolerance)
            if is_wrong(row):
                ok = False
                _withhold_speed(row)
            rows.append(row)
            if progress:
                print(f"c={c:<3} {ct.name:<28} tok/s={row['output_tokens_per_s']}  tau={row['tau']}  "
                      f"draft={row['mean_draft_len']}  equal={row['greedy_equal_to_ar']}", flush=True)
    _add_speedups(rows, label, contenders[0].name)
    return rows, ok


ROUND_WAVES = 4  # a round holds at least this many times the concurrency in prompts


def rounds(n: int, concurrency: int) -> list[range]:
    """The prompts' indices in rounds of at least ROUND_WAVES x `concurrency` prompts (one round when there are
    fewer), in order: enough per round that each keeps `concurrency` requests in flight most of its time."""
    count = max(1, n // (ROUND_WAVES * concurrency))
    bounds = [n * i // count for i in range(count + 1)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def _count_departures(row: dict, target: Transformer, prompt_ids: list[list[int]], reference: list[list[int]],
                      seqs: list[Sequence], tolerance: float) -> None:
    gaps = departures(target, cycle(prompt_ids), reference, [s.output for s in seqs])
    row["departures"] = len(gaps)
    row["largest_departure_gap"] = round(max(gaps), 6)
    row["equal_up_to_ties"] = max(gaps) <= tolerance


def _withhold_speed(row: dict) -> None:
    """A mode whose output is wrong has no speed worth printing."""
    for figures in [row, *row.get("per_domain", {}).values()]:
        if figures["greedy_equal_to_ar"] is False:
            figures["output_tokens_per_s"] = None


def _add_speedups(rows: list[dict], label: str, reference: str) -> None:
    ar = {r["concurrency"]: r["output_tokens_per_s"] for r in rows if r[label] == reference}
    for r in rows:
        base, mine = ar.get(r["concurrency"]), r["output_tokens_per_s"]
        r["speedup_vs_ar"] = round(mine / base, 4) if base and mine else None
