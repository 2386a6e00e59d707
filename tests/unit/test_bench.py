"""The offline benchmark's per-domain figures: a domain's speed is read from the time its own requests ran."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from helpers import BENCHMARKS, load_script, random_prompts

from adaflash.decoding.engine import Engine
from adaflash.decoding.sampling import SamplingParams
from adaflash.decoding.sequence import Request, Sequence
from adaflash.evaluation.bench import Contender, compare, departure_gap, rounds, run_bench
from adaflash.evaluation.prompts import load_prompts
from adaflash.models.bundle import tiny_random_bundle


def record_generate(engine: Engine) -> list[tuple[list[Request], list[Sequence]]]:
    """Each `engine.generate` call the benchmark makes, its requests and the sequences it returned, in order."""
    calls = []
    generate = engine.generate

    def recording(requests: list[Request], concurrency: int | None = None) -> list[Sequence]:
        seqs = generate(requests, concurrency)
        calls.append((requests, seqs))
        return seqs

    engine.generate = recording
    return calls


def test_per_domain_speed_leaves_out_the_queue_and_tiles_the_run_at_concurrency_1():
    """At concurrency 1 requests run one after another, so a domain queued behind another must not be charged the
    other's time: its figure is its tokens over its requests' admission-to-finish time, and those intervals do not
    overlap."""
    bundle = tiny_random_bundle(seed=0)
    engine = Engine(bundle.target, bundle.drafter, num_slots=2, max_len=256)
    prompts = random_prompts(6, seed=7)
    domains = ["first"] * 3 + ["second"] * 3
    calls = record_generate(engine)
    rows, ok = run_bench(engine, prompts, domains, ["ar"], [1], 8, SamplingParams(), progress=False)
    assert ok
    seqs = [s for _, done in calls for s in done]
    assert len(seqs) == 6 and all(s.submitted_at < seqs[0].admitted_at for s in seqs)  # all queued at once
    for before, after in zip(seqs, seqs[1:]):
        assert before.admitted_at <= before.finished_at <= after.admitted_at
    per_domain = rows[0]["per_domain"]
    for name, part in (("first", seqs[:3]), ("second", seqs[3:])):
        served = sum(s.finished_at - s.admitted_at for s in part)
        assert per_domain[name]["output_tokens_per_s"] == round(sum(len(s.output) for s in part) / served, 2)
    queued = sum(s.finished_at - s.submitted_at for s in seqs[3:])
    assert per_domain["second"]["output_tokens_per_s"] > sum(len(s.output) for s in seqs[3:]) / queued


def test_rounds_cover_every_prompt_once_in_order_and_hold_four_waves():
    for n, c in [(40, 1), (40, 8), (40, 32), (36, 1), (7, 1), (1, 64)]:
        parts = rounds(n, c)
        assert [i for part in parts for i in part] == list(range(n))
        assert len(parts) == 1 or all(len(part) >= 4 * c for part in parts)
    assert len(rounds(40, 1)) == 10 and len(rounds(40, 8)) == 1


def test_contenders_take_turns_on_each_round_and_outputs_stay_in_prompt_order():
    """Every contender runs each round before the next round starts, the reference first; the others rotate."""
    bundle = tiny_random_bundle(seed=0)
    engine = Engine(bundle.target, bundle.drafter, num_slots=2, max_len=256)
    prompts = random_prompts(8, seed=3)
    calls = record_generate(engine)
    contenders = [Contender(m, m, engine) for m in ("ar", "ngram", "adaflash")]
    rows, ok = compare(contenders, prompts, [None] * 8, [1], 8, SamplingParams(), progress=False)
    assert ok and [r["mode"] for r in rows] == ["ar", "ngram", "adaflash"]
    assert [reqs[0].mode.name for reqs, _ in calls] == ["ar", "ngram", "adaflash", "ar", "adaflash", "ngram"]
    assert [r.prompt_ids for reqs, _ in calls if reqs[0].mode.name == "ngram" for r in reqs] == prompts
    assert all(r["output_tokens"] == rows[0]["output_tokens"] for r in rows)


def test_passes_repeat_every_round_check_each_and_sum_them():
    """With two passes every round runs twice per contender, each pass's outputs are checked against the
    reference's, and the row's figures cover both passes, each pass's own speed beside them."""
    bundle = tiny_random_bundle(seed=0)
    engine = Engine(bundle.target, bundle.drafter, num_slots=2, max_len=256)
    prompts = random_prompts(4, seed=5)
    calls = record_generate(engine)
    contenders = [Contender(m, m, engine) for m in ("ar", "ngram")]
    rows, ok = compare(contenders, prompts, ["a", "a", "b", "b"], [1], 8, SamplingParams(), progress=False, passes=2)
    assert ok and [reqs[0].mode.name for reqs, _ in calls] == ["ar", "ngram"] * 2
    ar_tokens = [len(s.output) for reqs, done in calls if reqs[0].mode.name == "ar" for s in done]
    assert len(ar_tokens) == 8 and ar_tokens[:4] == ar_tokens[4:]  # greedy: each pass decodes the same
    for row in rows:
        assert row["num_requests"] == 8 and row["output_tokens"] == sum(ar_tokens)
        assert len(row["output_tokens_per_s_per_pass"]) == 2
        assert row["per_domain"]["a"]["num_requests"] == 4


def test_each_domain_runs_as_a_workload_of_its_own():
    """In a mixed run the domains share each verify forward, so a domain's slice says how it did beside the others;
    with `each_domain` every domain runs alone: its requests never share a step with another domain's, and
    concurrencies above its prompt count are left out."""
    bundle = tiny_random_bundle(seed=0)
    engine = Engine(bundle.target, bundle.drafter, num_slots=4, max_len=256)
    prompts = random_prompts(6, seed=9)
    domains = ["b", "a", "b", "a", "a", "b"]
    calls = record_generate(engine)
    rows, ok = run_bench(engine, prompts, domains, ["ar", "ngram"], [1, 3, 4], 8, SamplingParams(), progress=False,
                         each_domain=True)
    assert ok
    assert [(r["workload"], r["mode"], r["concurrency"]) for r in rows] == [
        (w, m, c) for w in ("a", "b") for c in (1, 3) for m in ("ar", "ngram")]
    for reqs, _ in calls:
        assert len({domains[prompts.index(r.prompt_ids)] for r in reqs}) == 1
    assert all(r["num_requests"] == 3 and "per_domain" not in r for r in rows)
    by_workload = {w: [p for p, d in zip(prompts, domains) if d == w] for w in ("a", "b")}
    for w, mine in by_workload.items():
        ran = [r.prompt_ids for reqs, _ in calls if reqs[0].mode.name == "ar"
               and domains[prompts.index(reqs[0].prompt_ids)] == w for r in reqs]
        assert ran == mine * 2  # once per concurrency, in order


def test_departure_gap_is_the_logit_gap_where_an_output_first_parts_from_the_reference():
    """Zero when equal, inf when one output only stops first; else the target's logit gap of the two tokens at the
    first difference over the largest logit, from the sequence's own prefix: the runner-up's gap is smaller than
    the worst token's."""
    bundle = tiny_random_bundle(seed=0)
    engine = Engine(bundle.target, None, num_slots=1, max_len=256)
    prompt = random_prompts(1, seed=11)[0]
    ref = engine.generate([Request(prompt, 8, stop_ids=())])[0].output
    cache = bundle.target.new_cache(1, 256)
    logits = bundle.target.forward(cache, [0], [prompt + ref[:3]]).logits[-1].float()
    runner_up, worst = logits.topk(2).indices[1].item(), logits.argmin().item()
    assert departure_gap(bundle.target, prompt, ref, ref) == 0.0
    assert departure_gap(bundle.target, prompt, ref, ref[:-1]) == math.inf
    near = departure_gap(bundle.target, prompt, ref, ref[:3] + [runner_up] + ref[4:])
    assert near == pytest.approx(((logits[ref[3]] - logits[runner_up]) / logits.abs().max()).item(), rel=1e-5)
    assert 0 < near < departure_gap(bundle.target, prompt, ref, ref[:3] + [worst])


@pytest.mark.parametrize("tolerance", [2.0, 1e-9])
def test_a_departing_contender_keeps_its_speed_only_within_the_tie_tolerance(tolerance: float):
    """A contender whose last tokens differ from ar's: its row counts the departures and keeps its speed where the
    largest gap is within the tolerance (2 bounds any gap), else it loses its speed and fails the run."""
    bundle = tiny_random_bundle(seed=0)
    engine = Engine(bundle.target, bundle.drafter, num_slots=2, max_len=256)
    prompts = random_prompts(4, seed=5)
    generate = engine.generate

    def departing(requests: list[Request], concurrency: int | None = None) -> list[Sequence]:
        seqs = generate(requests, concurrency)
        for s in seqs if requests[0].mode.name == "ngram" else []:
            s.output[-1] = (s.output[-1] + 1) % bundle.target.config.vocab_size
        return seqs

    engine.generate = departing
    contenders = [Contender(m, m, engine) for m in ("ar", "ngram")]
    rows, ok = compare(contenders, prompts, [None] * 4, [2], 8, SamplingParams(), progress=False,
                       tie_tolerance=tolerance)
    ngram = rows[1]
    assert ngram["greedy_equal_to_ar"] is False and ngram["departures"] == 4
    assert ok is (tolerance == 2.0) and ngram["equal_up_to_ties"] is ok
    assert (ngram["output_tokens_per_s"] is not None) is ok


def _bench_gate():
    """benchmarks/bench_gate.py (a script, not a package), loaded from its file."""
    return load_script(BENCHMARKS / "bench_gate.py")


def _gate_rows(domain: str, adaflash: list[float]) -> list[dict]:
    """bench_gate rows of one cell at c=8: `ar` at 100 tok/s, ngram 90, dflash 50, adaflash as given, round by round."""
    speeds = {"ar": 100.0, "ngram": 90.0, "dflash": 50.0, "adaflash-no-gate": 80.0}
    return [{"domain": domain, "concurrency": 8, "repeat": r, "variant": v, "tokens_per_s": tps}
            for r, a in enumerate(adaflash) for v, tps in {**speeds, "adaflash": a}.items()]


def test_bench_gate_gives_each_cell_the_median_of_its_rounds_ratios_and_an_interval_within_them():
    bench_gate = _bench_gate()
    rows = _gate_rows("swinging", [97.0, 99.0, 95.0, 101.0, 96.0]) + _gate_rows("steady", [105.0] * 5)
    summary = {cell["domain"]: cell for cell in bench_gate.summarise(rows)}
    swinging = summary["swinging"]["adaflash_round_median_interval"]
    assert swinging["median"] == 0.97
    assert 0.95 <= swinging["low"] <= 0.97 <= swinging["high"] <= 1.01 and swinging["low"] < swinging["high"]
    assert summary["steady"]["adaflash_round_median_interval"] == {"median": 1.05, "low": 1.05, "high": 1.05}
    assert bench_gate.summarise(rows) == list(summary.values())  # resampled alike every time: reproducible


@pytest.mark.parametrize("pooled", [False, True])
def test_bench_gate_pools_the_chosen_domains_into_one_cell_only_when_asked(pooled):
    bench_gate = _bench_gate()
    mix = Path(__file__).parents[2] / "python_backend" / "adaflash" / "data" / "broad_mix.jsonl"
    argv = ["--model-dir", "m", "--json", "j", "--prompts", str(mix), "--split", "holdout", "--domains", "qa,rag"]
    prompts = bench_gate.load(bench_gate.parse_args(argv + ["--pooled"] * pooled))
    chosen = [p for p in load_prompts(mix, None, "holdout") if p.domain in ("qa", "rag")]
    assert [p.id for p in prompts] == [p.id for p in chosen] and chosen
    assert {p.domain for p in prompts} == ({"pooled"} if pooled else {"qa", "rag"})
