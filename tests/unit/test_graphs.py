"""Graphed steps (`adaflash.models.graphs`): the padded step a CUDA graph records gives the eager forward's
logits, features and cache, and decoding through it is lossless. Here the padded step runs eagerly on the CPU
(`step_graphs = True`); tests/unit/test_gpu.py records and replays it on a GPU."""

from __future__ import annotations

import copy
import dataclasses
import gc
import itertools
import json
import pickle
import random

import pytest
import torch
from helpers import clone_target, fixed_costs, random_prompts
from test_lossless import MAX_LEN, MAX_TOKENS, greedy_reference

from adaflash.decoding.costs import CostModel, measure_costs
from adaflash.decoding.engine import Engine
from adaflash_contract.modes import MODE_NAMES
from adaflash.decoding.sequence import Request
from adaflash.models import graphs
from adaflash.models.cache import Paging
from adaflash.models.drafter import DFlashDrafter

SLOTS = 6
LENGTH = 150  # not a power of two: the longest context bucket is the cache's length
CAPTURE = [1, 2]


def drafter_twins(trained_tiny, heads: bool = False):
    """The drafter twice, drafts graphed (eagerly, on the CPU) and not; with `heads`, a length and a position head
    (random) beside the trained layers, so that every field of a draft is compared."""
    cfg = dataclasses.replace(trained_tiny.drafter.config, length_head=heads, length_head_dim=32,
                              position_head=heads, position_head_dim=32)
    torch.manual_seed(0)
    made = []
    for graphed in (True, False):
        drafter = DFlashDrafter(cfg)
        drafter.load_state_dict(trained_tiny.drafter.state_dict(), strict=not heads)
        drafter.step_graphs = graphed
        made.append(drafter.eval())
    made[1].load_state_dict(made[0].state_dict())
    return made


def twins(trained_tiny):
    """The same target twice: steps graphed (eagerly, on the CPU) and steps as they run without graphs."""
    graphed, eager = clone_target(trained_tiny.target), clone_target(trained_tiny.target)
    graphed.step_graphs, eager.step_graphs = True, False
    return graphed, eager


def test_graphs_are_wanted_on_cuda_only_unless_chosen(monkeypatch):
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert graphs.wanted(None, cuda) and not graphs.wanted(None, cpu)
    assert graphs.wanted(True, cpu) and not graphs.wanted(False, cuda)
    monkeypatch.setenv(graphs.ENV, "0")
    assert not graphs.wanted(None, cuda)
    assert [graphs.bucket(n) for n in (1, 2, 3, 5, 16, 17)] == [1, 2, 4, 8, 16, 32]


PAGINGS = [None, Paging(page=8, pages=SLOTS * 19)]
PAGING_IDS = ["unpaged", "paged"]


@pytest.mark.parametrize("paging", PAGINGS, ids=PAGING_IDS)
def test_padded_steps_match_the_eager_forward(trained_tiny, paging):
    graphed, eager = twins(trained_tiny)
    check_padded_steps(graphed, eager, paging, tolerance=1e-4)


def check_padded_steps(graphed, eager, paging, tolerance: float) -> graphs.StepGraphs:
    """Ragged steps (1-16 new tokens, every batch size, slots in any order, with and without captured
    layers) give the eager forward's logits and features, leave the same lengths, and the slots' caches then
    decode alike: the padding wrote nowhere a slot reads. The prompts' prefill is a padded step too (8 x 128 tokens
    padded), its logits asked of the last rows only, as `steps.prefill_batch` asks. Returns the graphed model's
    recorder (the cache it served is gone with this function)."""
    caches = {m: m.new_cache(SLOTS, LENGTH, paging) for m in (graphed, eager)}
    assert caches[graphed].scratch is not None and caches[eager].scratch is None
    rng = random.Random(3)
    prompts = random_prompts(SLOTS, seed=5, min_len=3, max_len=110)
    last_rows = torch.tensor(list(itertools.accumulate(map(len, prompts)))) - 1
    filled = {m: m.forward(cache, list(range(SLOTS)), prompts, logit_rows=last_rows, capture_layers=CAPTURE)
              for m, cache in caches.items()}
    torch.testing.assert_close(filled[graphed].logits, filled[eager].logits, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(filled[graphed].hidden, filled[eager].hidden, atol=tolerance, rtol=tolerance)
    shapes = set(graphed.recorders.get(caches[graphed]).replays)
    assert max(s.tokens for s in shapes) > graphs.MAX_NEW  # the prefill was padded, not eager
    for step in range(24):
        open_slots = [s for s in range(SLOTS) if caches[eager].lengths[s] < LENGTH]
        slots = rng.sample(open_slots, rng.randint(1, len(open_slots)))
        room = [min(graphs.MAX_NEW, LENGTH - caches[eager].lengths[s]) for s in slots]
        feeds = [[rng.randrange(200) for _ in range(rng.randint(1, r))] for r in room]
        capture = CAPTURE if step % 2 else None
        out = {m: m.forward(cache, slots, feeds, capture_layers=capture) for m, cache in caches.items()}
        torch.testing.assert_close(out[graphed].logits, out[eager].logits, atol=tolerance, rtol=tolerance)
        if capture:
            torch.testing.assert_close(out[graphed].hidden, out[eager].hidden, atol=tolerance, rtol=tolerance)
        else:
            assert out[graphed].hidden is None
        assert caches[graphed].lengths == caches[eager].lengths
        for s in slots:  # roll back part of the step, as a verify does
            keep = caches[eager].lengths[s] - rng.randint(0, len(feeds[slots.index(s)]) - 1)
            for cache in caches.values():
                cache.truncate(s, keep)
        shapes |= set(graphed.recorders.get(caches[graphed]).replays)
    assert len({s.sequences for s in shapes}) > 2 and len({s.tokens for s in shapes}) > 2
    assert any(s.capture for s in shapes) and any(not s.capture for s in shapes)
    assert any(s.context == LENGTH for s in shapes)
    open_slots = [s for s in range(SLOTS) if caches[eager].lengths[s] < LENGTH]
    last = {m: m.forward(cache, open_slots, [[7]] * len(open_slots)).logits for m, cache in caches.items()}
    torch.testing.assert_close(last[graphed], last[eager], atol=tolerance, rtol=tolerance)
    return graphed.recorders.get(caches[graphed])


def test_a_weight_update_drops_the_recorded_steps(trained_tiny):
    graphed, _ = twins(trained_tiny)
    cache = graphed.new_cache(2, 40)
    graphed.forward(cache, [0, 1], [[1, 2, 3], [4, 5]])
    stepper = graphed.recorders.get(cache)
    assert stepper.replays
    with torch.no_grad():
        graphed.model.norm.weight.mul_(1.0)
    graphed.forward(cache, [0], [[6]])
    assert len(stepper.replays) == 1  # the step just run: the earlier ones were dropped


@pytest.mark.parametrize("paging", PAGINGS, ids=PAGING_IDS)
def test_padded_drafts_match_the_eager_draft(trained_tiny, paging):
    target = trained_tiny.target
    check_padded_drafts(target, *drafter_twins(trained_tiny, heads=True), paging, tolerance=1e-4)


def check_contexts_equal(graphed, eager, tolerance: float) -> None:
    """Every slot's projected context, keys and values of every layer, up to its length."""
    assert graphed.lengths == eager.lengths
    for slot, length in enumerate(eager.lengths):
        for store in ("k", "v"):
            read = [cache.gather([slot], length) for cache in (graphed, eager)]
            for layer in range(eager.k.shape[0]):
                torch.testing.assert_close(read[0](getattr(graphed, store)[layer]),
                                           read[1](getattr(eager, store)[layer]), atol=tolerance, rtol=tolerance)


def check_padded_drafts(target, graphed, eager, paging, tolerance: float) -> graphs.DraftGraphs:
    """Context projections of a step's size (a prompt's run eagerly) leave the eager projection's keys and
    values, and drafts for any subset of slots, every block length, over those contexts give the eager draft's
    tokens and (within rounding) its hidden states and heads' outputs. Returns the graphed drafter's recorder."""
    caches = {m: m.new_cache(SLOTS, LENGTH, paging) for m in (graphed, eager)}
    assert caches[graphed].scratch is not None and caches[eager].scratch is None
    rng = random.Random(4)
    width = graphed.fc.weight.shape[1]
    device = graphed.fc.weight.device
    for step in range(10):
        slots = rng.sample(range(SLOTS), rng.randint(1, SLOTS))
        counts = [rng.randint(20, 40) if step == 0 else rng.randint(1, 12) for _ in slots]  # a prompt's, then steps'
        features = torch.randn(sum(counts), width, device=device)
        for m, cache in caches.items():
            m.append_context(cache, slots, features, counts)
        check_contexts_equal(caches[graphed], caches[eager], tolerance)
        drafted = rng.sample(range(SLOTS), rng.randint(1, SLOTS))
        anchors = [rng.randrange(200) for _ in drafted]
        block = rng.randint(2, graphed.config.block_size)
        out = {m: m.draft(target, cache, drafted, anchors, block) for m, cache in caches.items()}
        assert torch.equal(out[graphed].tokens, out[eager].tokens)
        for field in ("hidden", "accept_ratio", "accept_rates"):
            torch.testing.assert_close(getattr(out[graphed], field), getattr(out[eager], field), atol=tolerance,
                                       rtol=tolerance)
    shapes = set(graphed.recorders.get(caches[graphed]).replays)
    drafts = [s for s in shapes if isinstance(s, graphs.DraftShape)]
    assert len({s.sequences for s in drafts}) > 2 and len({s.block for s in drafts}) > 2
    assert len({s.positions for s in shapes if isinstance(s, graphs.ContextShape)}) > 2
    return graphed.recorders.get(caches[graphed])


def test_a_bad_block_length_is_refused_before_any_draft(trained_tiny):
    graphed, _ = drafter_twins(trained_tiny)
    cache = graphed.new_cache(2, 40)
    graphed.append_context(cache, [0], torch.randn(3, graphed.fc.weight.shape[1]), [3])
    for bad in (1, graphed.config.block_size + 1):
        with pytest.raises(ValueError, match="block_length"):
            graphed.draft(trained_tiny.target, cache, [0], [5], bad)
    assert not [s for s in graphed.recorders.get(cache).replays if isinstance(s, graphs.DraftShape)]


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_graphed_decoding_is_lossless(trained_tiny, mode):
    """Every mode at concurrency 8 through the padded steps and drafts gives plain greedy decoding's tokens."""
    graphed, eager = twins(trained_tiny)
    drafter = copy.deepcopy(trained_tiny.drafter)
    drafter.step_graphs = True
    prompts = random_prompts(16, seed=11)
    reference = [greedy_reference(eager, p, MAX_TOKENS) for p in prompts]
    cost = fixed_costs()
    cost.padded = True  # as a table measured on graphed steps is: the policy chooses widths (`_choose_padded`)
    engine = Engine(graphed, drafter, num_slots=8, max_len=MAX_LEN, cost_model=cost, plan_gate=False)
    seqs = engine.generate([Request(p, MAX_TOKENS, mode=mode, stop_ids=()) for p in prompts], concurrency=8)
    assert [s.output for s in seqs] == reference
    assert graphed.recorders.get(engine.cache).replays
    if mode != "ar":
        assert mode == "ngram" or drafter.recorders.get(engine.context).replays


def test_a_cost_table_measured_on_graphed_steps_is_padded_and_keeps_it(trained_tiny, tmp_path):
    """The policy reads a padded table by shapes (`CostModel.padded`): a table knows whether its target's steps were
    padded when it was measured, and a saved table keeps it."""
    graphed, eager = twins(trained_tiny)
    tables = {t: measure_costs(t, trained_tiny.drafter, 4, context=32, reps=1) for t in (graphed, eager)}
    assert tables[graphed].padded and not tables[eager].padded
    tables[graphed].save(tmp_path / "costs.json")
    loaded = CostModel.from_json(json.loads((tmp_path / "costs.json").read_text()))
    assert loaded.padded and loaded.verify == {b: [tuple(p) for p in pts] for b, pts in tables[graphed].verify.items()}


def test_a_cache_and_its_recorded_steps_are_freed_together(trained_tiny):
    """The target keys its graphed steps by cache, weakly: an engine's or a cost measurement's cache, once
    dropped, takes its graphs (and on a GPU their memory) with it; a copy of the model starts with none."""
    graphed, _ = twins(trained_tiny)
    cache = graphed.new_cache(2, 40)
    graphed.forward(cache, [0, 1], [[1, 2, 3], [4, 5]])
    assert len(graphed.recorders) == 1
    assert len(copy.deepcopy(graphed).recorders) == len(pickle.loads(pickle.dumps(graphed)).recorders) == 0
    del cache
    gc.collect()
    assert len(graphed.recorders) == 0


def test_the_gate_and_the_cost_model_learn_nothing_from_a_step_that_recorded_a_shape(trained_tiny, monkeypatch):
    """A step that meets a shape for the first time pays its capture on a GPU (tens of replays' time): the plan
    gate, which follows whichever arm commits more tokens per millisecond, must not take it for the arm's speed,
    nor the cost model for its forwards' or the step's."""
    graphed, _ = twins(trained_tiny)
    engine = Engine(graphed, trained_tiny.drafter, num_slots=8, max_len=MAX_LEN, cost_model=fixed_costs())
    recorded_in_step = []
    record, step = graphs.Recorder._record, engine.scheduler.step

    def recording(self, cache, run):
        recorded_in_step.append(True)
        return record(self, cache, run)

    async def stepping():
        recorded_in_step.clear()
        return await step()

    observed = {}

    def watched(owner, name):
        learn = getattr(owner, name)

        def observing(*args):
            observed.setdefault(name, []).append(bool(recorded_in_step))
            learn(*args)

        monkeypatch.setattr(owner, name, observing)

    monkeypatch.setattr(graphs.Recorder, "_record", recording)
    monkeypatch.setattr(engine.scheduler, "step", stepping)
    watched(engine.speculation.gate, "observe")
    for name in ("observe_verify", "observe_draft", "observe_step"):
        watched(engine.cost, name)
    prompts = random_prompts(16, seed=12)
    for _ in range(2):  # the second pass meets (almost) no new shape: the gate learns from its steps
        engine.generate([Request(p, MAX_TOKENS, mode="adaflash", stop_ids=()) for p in prompts], concurrency=8)
    assert graphs.recordings() > 0 and set(observed) == {"observe", "observe_verify", "observe_draft", "observe_step"}
    assert not any(any(seen) for seen in observed.values()), observed


def test_a_prefill_past_the_graphed_tokens_runs_eagerly(trained_tiny):
    """A prefill padded past PREFILL_TOKENS records no shape, and gives the eager forward's logits."""
    graphed, eager = twins(trained_tiny)
    caches = {m: m.new_cache(2, graphs.PREFILL_TOKENS + 8) for m in (graphed, eager)}
    length = graphs.PREFILL_TOKENS // 2 + 1
    prompt = random_prompts(1, seed=9, min_len=length, max_len=length)[0]
    assert graphs.bucket(2) * graphs.bucket(len(prompt)) > graphs.PREFILL_TOKENS
    out = {m: m.forward(cache, [0, 1], [prompt, prompt[:5]]) for m, cache in caches.items()}
    torch.testing.assert_close(out[graphed].logits, out[eager].logits, atol=1e-4, rtol=1e-4)
    assert not graphed.recorders.get(caches[graphed]).replays
