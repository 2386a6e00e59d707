"""Speculative sampling reproduces the target distribution exactly, in every mode; verification unit tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import clone_target, fixed_costs, random_prompts, self_generated
from scipy.stats import chisquare

from adaflash.decoding.costs import CostModel
from adaflash.decoding.engine import Engine
from adaflash_contract.modes import MODE_NAMES
from adaflash.decoding.sampling import (
    History,
    SamplingParams,
    log_probs_of,
    process_logits,
    target_probs,
    verify_greedy,
    verify_sampled,
)
from adaflash.decoding.sequence import Request
from adaflash.models.bundle import tiny_random_bundle
from adaflash.models.target import Transformer
from adaflash.training.dflash import fit_drafter

V = 8  # vocabulary of the small bundle; id 7 is its mask token
PROMPT = [1, 2, 3, 1, 2, 3, 4, 1, 2]
N_SAMPLES = 3000
DEPTH = 3  # joint distribution of the first DEPTH generated tokens
# One more token than DEPTH: the first decode step then verifies a 2-token draft (tokens 2 and 3 of the
# joint come out of accept / reject / resample chains, not only the bonus token).
MAX_TOKENS = DEPTH + 1
ALPHA = 0.001
DRAFT_MODES = [m for m in MODE_NAMES if m != "ar"]


@pytest.fixture(scope="module")
def small():
    """A vocabulary-8 target; its drafter fitted briefly on the target's greedy continuations."""
    bundle = tiny_random_bundle(seed=0, vocab_size=V)
    data = self_generated(bundle.target, random_prompts(64, seed=5, vocab=V - 1), max_tokens=64)
    fit_drafter(bundle.drafter, bundle.target, data, steps=200)
    return bundle


def exact_joint(target: Transformer, prompt: list[int], params: SamplingParams, depth: int = DEPTH) -> np.ndarray:
    """P(first `depth` tokens) over all V**depth continuations, from the target's own logits (full recompute),
    each continuation's logits processed for its own prefix."""
    twin = clone_target(target)
    dist = np.ones(1)
    prefixes: list[tuple[int, ...]] = [()]
    for d in range(depth):
        n = len(prefixes)
        cache = twin.new_cache(n, len(prompt) + depth)
        seq_len = len(prompt) + d
        rows = torch.arange(1, n + 1) * seq_len - 1
        logits = twin.forward(cache, list(range(n)), [prompt + list(p) for p in prefixes], logit_rows=rows).logits
        if params.processes:
            logits = torch.cat([process_logits(logits[i : i + 1], params, History(prompt + list(p), len(prompt)), [])
                                for i, p in enumerate(prefixes)])
        probs = target_probs(logits, params).double().numpy()
        dist = (dist[:, None] * probs).reshape(-1)
        prefixes = [p + (t,) for p in prefixes for t in range(V)]
    return dist / dist.sum()


def cell_of(output: list[int]) -> int:
    return sum(t * V ** (DEPTH - 1 - i) for i, t in enumerate(output[:DEPTH]))


def chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson chi-square p-value; cells expecting fewer than 5 samples are pooled into one bin."""
    expected = probs * counts.sum()
    small = expected < 5
    obs, exp = counts[~small].astype(float), expected[~small]
    if expected[small].sum() > 0:
        obs, exp = np.append(obs, counts[small].sum()), np.append(exp, expected[small].sum())
    else:
        assert counts[small].sum() == 0, "samples fell on continuations of probability zero"
    exp = exp * obs.sum() / exp.sum()  # remove float rounding of the total
    return float(chisquare(obs, exp).pvalue)


_runs: dict = {}
# Verify cost flat in tokens, drafting almost free: the cost-aware policy drafts these short requests too.
CHEAP_DRAFTS = CostModel(verify={b: [(b, 2.0), (16 * b, 2.0)] for b in (1, 16)}, draft={1: [(16, 0.1)], 16: [(16, 0.1)]})


def sample_run(bundle, mode: str, params: dict) -> list:
    """N_SAMPLES requests of PROMPT with distinct seeds, concurrency 16 (memoised per mode and params)."""
    key = (id(bundle), mode, tuple(sorted(params.items())))
    if key not in _runs:
        engine = Engine(bundle.target, bundle.drafter, num_slots=16, max_len=32,
                        cost_model=CHEAP_DRAFTS, plan_gate=False)
        first_seed = MODE_NAMES.index(mode) * N_SAMPLES  # independent samples per mode
        reqs = [Request(prompt_ids=PROMPT, max_tokens=MAX_TOKENS, mode=mode, stop_ids=(),
                        sampling=SamplingParams(seed=first_seed + i, **params)) for i in range(N_SAMPLES)]
        _runs[key] = engine.generate(reqs, concurrency=16)
    return _runs[key]


def draft_tokens_tried(seqs) -> int:
    return sum(min(st.accepted + 1, st.draft_len) for s in seqs for st in s.steps)


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_first_tokens_follow_the_target_distribution(small, mode):
    seqs = sample_run(small, mode, {"temperature": 1.0})
    assert all(len(s.output) == MAX_TOKENS and s.finish_reason == "length" for s in seqs)
    if mode != "ar":  # the samples went through draft verification, not only plain sampling
        assert draft_tokens_tried(seqs) > N_SAMPLES // 2
    counts = np.bincount([cell_of(s.output) for s in seqs], minlength=V**DEPTH)
    p_true = chi_square_p(counts, exact_joint(small.target, PROMPT, SamplingParams(temperature=1.0)))
    assert p_true > ALPHA, f"{mode}: samples do not follow the target distribution (p={p_true:.2e})"
    # The same test on the same samples rejects a slightly different distribution: it has power.
    p_wrong = chi_square_p(counts, exact_joint(small.target, PROMPT, SamplingParams(temperature=0.85)))
    assert p_wrong < ALPHA


@pytest.mark.parametrize("mode", ["dflash"])  # (every drafting mode verifies through the same verify_sampled)
def test_first_tokens_follow_the_filtered_distribution(small, mode):
    params = {"temperature": 1.0, "top_k": 4, "top_p": 0.9}
    seqs = sample_run(small, mode, params)
    assert draft_tokens_tried(seqs) > N_SAMPLES // 2
    counts = np.bincount([cell_of(s.output) for s in seqs], minlength=V**DEPTH)
    exact = exact_joint(small.target, PROMPT, SamplingParams(**params))
    assert counts[exact == 0].sum() == 0, "a token outside top-k / top-p was generated"
    assert chi_square_p(counts, exact) > ALPHA
    # Unfiltered sampling is a different distribution and is rejected.
    assert chi_square_p(counts, exact_joint(small.target, PROMPT, SamplingParams(temperature=1.0))) < ALPHA


PROCESSED = {"temperature": 1.0, "repetition_penalty": 1.6, "presence_penalty": 0.5, "frequency_penalty": 0.4,
             "min_tokens": 2, "end_ids": (3,), "bad_words": ((1, 2), (5,))}


@pytest.mark.parametrize("mode", ["dflash", "adaflash"])  # (penalised outputs leave the prompt's n-grams: few copies)
def test_first_tokens_follow_the_processed_distribution(small, mode):
    """Penalties, min_tokens and bad words under speculative sampling: the samples follow plain sampling from the
    processed logits, and the unprocessed distribution is rejected."""
    seqs = sample_run(small, mode, PROCESSED)
    assert draft_tokens_tried(seqs) > 100
    counts = np.bincount([cell_of(s.output) for s in seqs], minlength=V**DEPTH)
    exact = exact_joint(small.target, PROMPT, SamplingParams(**PROCESSED))
    assert counts[exact == 0].sum() == 0, "a banned token was generated"
    assert chi_square_p(counts, exact) > ALPHA
    assert chi_square_p(counts, exact_joint(small.target, PROMPT, SamplingParams(temperature=1.0))) < ALPHA


def test_process_logits_matches_the_definitions_row_by_row():
    """Each verified row sees its own prefix: the counts, the min_tokens mask and the bad words move with it."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, V, generator=g)
    sp = SamplingParams(repetition_penalty=1.5, presence_penalty=0.3, frequency_penalty=0.7, min_tokens=3,
                        end_ids=(6,), bad_words=((4, 2), (0,)))
    history, draft = History([1, 4, 4, 5], 2), [2, 4, 6]
    got = process_logits(logits, sp, history, draft)
    for j in range(4):
        tokens, want = history.tokens + draft[:j], logits[j].clone()
        for t in set(tokens):
            want[t] = want[t] / 1.5 if want[t] > 0 else want[t] * 1.5
        out = tokens[2:]
        for t in set(out):
            want[t] -= 0.3 + 0.7 * out.count(t)
        if len(out) < 3:
            want[6] = float("-inf")
        want[0] = float("-inf")
        if tokens[-1] == 4:
            want[2] = float("-inf")
        torch.testing.assert_close(got[j], want, msg=f"row {j}")
    assert got[0, 6] == float("-inf") and got[1, 6] > float("-inf")  # 2 tokens produced, then 3
    assert got[1, 2] > float("-inf") and got[2, 2] == float("-inf")  # the draft's 4 precedes row 2 only


def _check_acceptance(seqs, min_tried: int) -> None:
    """Accepted drafts count = sum of Bernoulli(p(x)) over the tried draft tokens: its mean is the sum of
    expected_accepted and its variance sum p(1-p) <= sum over steps of (e - e^2/n), n tokens tried."""
    steps = [st for s in seqs for st in s.steps if st.draft_len > 0]
    tried = [min(st.accepted + 1, st.draft_len) for st in steps]
    assert sum(tried) > min_tried
    accepted = sum(st.accepted for st in steps)
    expected = sum(st.expected_accepted for st in steps)
    assert all(0.0 <= st.expected_accepted <= n + 1e-9 for st, n in zip(steps, tried))
    var = sum(st.expected_accepted - st.expected_accepted**2 / n for st, n in zip(steps, tried))
    sd = max(var, 1.0) ** 0.5
    assert abs(accepted - expected) <= 4 * sd, f"accepted {accepted} vs expected {expected:.1f} (sd {sd:.1f})"
    assert 0 < accepted < sum(tried)  # both acceptances and rejections happened


@pytest.mark.parametrize("mode", DRAFT_MODES)
def test_acceptance_rate_matches_its_expectation(trained_tiny, small, mode):
    # Short runs of the vocabulary-8 bundle (from the distribution test) ...
    _check_acceptance(sample_run(small, mode, {"temperature": 1.0}), min_tried=N_SAMPLES // 2)
    # ... and long generations of the byte-level bundle, where drafts of every length are verified.
    bundle = trained_tiny
    engine = Engine(bundle.target, bundle.drafter, num_slots=16, max_len=30 + 48 + 16 + 10,
                    cost_model=CHEAP_DRAFTS, plan_gate=False)
    reqs = [Request(prompt_ids=p, max_tokens=48, mode=mode, stop_ids=(), sampling=SamplingParams(temperature=1.0, seed=i))
            for i, p in enumerate(random_prompts(64, seed=3))]
    seqs = engine.generate(reqs, concurrency=16)
    _check_acceptance(seqs, min_tried=200)
    if mode in ("ngram", "dflash"):
        assert any(st.draft_len > 8 for s in seqs for st in s.steps)


def test_sampled_requests_are_reproducible_from_their_seed(small):
    """The same seed gives the same text whatever the batch around it."""
    engine = Engine(small.target, small.drafter, num_slots=16, max_len=48, cost_model=fixed_costs(), plan_gate=False)
    params = SamplingParams(temperature=1.0, seed=42)
    alone = engine.generate([Request(PROMPT, 20, mode="dflash", sampling=params, stop_ids=())])[0].output
    crowd = [Request(PROMPT, 20, mode="dflash", sampling=SamplingParams(temperature=1.0, seed=i), stop_ids=())
             for i in range(7)]
    crowd.insert(3, Request(PROMPT, 20, mode="dflash", sampling=params, stop_ids=()))
    assert engine.generate(crowd, concurrency=8)[3].output == alone


# ---- unit tests ---------------------------------------------------------------------------

def test_target_probs_temperature():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, 0.0], [0.1, 0.2, 0.3, 0.4, 0.5]])
    for t in (0.5, 1.0, 2.0):
        got = target_probs(logits, SamplingParams(temperature=t))
        assert torch.allclose(got, torch.softmax(logits / t, dim=-1), atol=1e-7)


def test_target_probs_top_k_keeps_exactly_k():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g)
    for k in (1, 3, 10):
        probs = target_probs(logits, SamplingParams(temperature=1.0, top_k=k))
        assert torch.all((probs > 0).sum(-1) == k)
        top = torch.topk(logits, k, dim=-1).indices
        assert torch.all(torch.gather(probs, -1, top) > 0)
        expected = torch.zeros_like(logits).scatter(-1, top, torch.softmax(torch.gather(logits, -1, top), -1))
        assert torch.allclose(probs, expected, atol=1e-6)
    # top_k = 0 or >= vocabulary: no filtering.
    full = torch.softmax(logits, dim=-1)
    assert torch.allclose(target_probs(logits, SamplingParams(temperature=1.0, top_k=0)), full, atol=1e-7)
    assert torch.allclose(target_probs(logits, SamplingParams(temperature=1.0, top_k=50)), full, atol=1e-7)


def test_target_probs_top_p_keeps_the_minimal_nucleus():
    p = torch.tensor([0.4, 0.05, 0.25, 0.2, 0.1])
    logits = p.log()[None]
    # Sorted: 0.4, 0.25, 0.2, 0.1, 0.05 -> cumulative 0.4, 0.65, 0.85, 0.95, 1.0
    cases = {0.1: {0}, 0.39: {0}, 0.41: {0, 2}, 0.64: {0, 2}, 0.66: {0, 2, 3}, 0.9: {0, 2, 3, 4}, 0.96: {0, 1, 2, 3, 4}}
    for top_p, keep in cases.items():
        probs = target_probs(logits, SamplingParams(temperature=1.0, top_p=top_p))[0]
        assert set(torch.nonzero(probs).flatten().tolist()) == keep, top_p
        kept = torch.tensor(sorted(keep))
        assert torch.allclose(probs[kept], p[kept] / p[kept].sum(), atol=1e-6)
        assert probs.sum().item() == pytest.approx(1.0, abs=1e-6)


def test_target_probs_top_k_then_top_p():
    p = torch.tensor([0.4, 0.05, 0.25, 0.2, 0.1])
    # top_k=3 leaves 0.4, 0.25, 0.2 -> renormalised 0.47, 0.29, 0.24; top_p=0.7 keeps the first two.
    probs = target_probs(p.log()[None], SamplingParams(temperature=1.0, top_k=3, top_p=0.7))[0]
    assert set(torch.nonzero(probs).flatten().tolist()) == {0, 2}
    assert probs[0].item() == pytest.approx(0.4 / 0.65, abs=1e-6)


def test_verify_greedy():
    assert verify_greedy([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]  # all accepted -> bonus token
    assert verify_greedy([5, 6, 7], [1, 6, 7, 8]) == [1]  # first rejected -> the target's token
    assert verify_greedy([5, 6, 7], [5, 9, 7, 8]) == [5, 9]
    assert verify_greedy([5, 6, 7], [5, 6, 2, 8]) == [5, 6, 2]
    assert verify_greedy([], [4]) == [4]


def test_verify_sampled_certain_and_impossible_drafts():
    v = 6
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        # Draft token 2 has probability 1 at every position: always accepted, then a bonus from the last row.
        probs = torch.zeros(4, v)
        probs[:3, 2] = 1.0
        probs[3] = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0, 0.0])
        committed, expected = verify_sampled([2, 2, 2], probs, g)
        assert committed[:3] == [2, 2, 2] and committed[3] in (1, 3) and len(committed) == 4
        assert expected == pytest.approx(3.0)
        # Draft token 4 has probability 0: rejected at once, replaced by a token of the target's distribution.
        probs = torch.full((3, v), 0.2)
        probs[:, 4] = 0.0
        probs[:, 5] = 0.0
        committed, expected = verify_sampled([4, 4], probs, g)
        assert len(committed) == 1 and committed[0] in (0, 1, 2, 3)
        assert expected == 0.0


def test_verify_sampled_resamples_from_the_residual():
    """After rejecting draft x, the replacement is drawn from p without x: overall the token follows p."""
    p = torch.tensor([0.5, 0.3, 0.2])
    g = torch.Generator().manual_seed(1)
    n = 20000
    first = [verify_sampled([0], torch.stack([p, p]), g)[0][0] for _ in range(n)]
    counts = np.bincount(first, minlength=3)
    assert chisquare(counts, p.double().numpy() * n).pvalue > ALPHA
    # A rejected draft token is never its own replacement.
    for _ in range(500):
        committed, _ = verify_sampled([0, 1], torch.stack([p, p, p]), g)
        if len(committed) == 1:
            assert committed[0] != 0
        elif len(committed) == 2:
            assert committed[1] != 1


def test_a_temperature_near_zero_puts_all_the_mass_on_the_likeliest_token():
    """The fuzz found 1.175494351e-38 (float32's smallest normal) answered with a server error: never NaN."""
    logits = torch.tensor([[1.0, 3.0, -2.0, float("-inf")], [0.5, 0.25, 0.75, 0.0]])
    for temperature in (1.175494351e-38, 1e-45, 1e-30):
        probs = target_probs(logits, SamplingParams(temperature=temperature, top_p=0.9))
        assert torch.isfinite(probs).all()
        assert probs.argmax(-1).tolist() == [1, 2] and probs.max(-1).values.tolist() == [1.0, 1.0]
        assert all(torch.isfinite(torch.tensor(log_probs_of(logits, SamplingParams(temperature=temperature), [1, 2]))))


def test_an_ordinary_temperature_gives_the_same_distribution_as_dividing():
    logits = torch.randn(3, 50)
    for temperature in (0.3, 1.0, 2.5):
        expected = torch.softmax(logits / temperature, dim=-1)
        assert torch.allclose(target_probs(logits, SamplingParams(temperature=temperature)), expected, atol=1e-6)
