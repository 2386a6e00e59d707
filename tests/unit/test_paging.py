"""A paged KV cache (pages shared by the slots, from a memory budget): outputs equal the unpaged cache's in every
mode, sequences wait for pages instead of failing, every page comes back, and a request that could never fit is
refused by name."""

from __future__ import annotations

import pytest
from helpers import fixed_costs, random_prompts

from adaflash.decoding.engine import Engine
from adaflash_contract.modes import MODE_NAMES
from adaflash.decoding.sequence import Request
from adaflash.models.cache import CacheFull, KVCache, Paging
from adaflash.models.placement import CPU

MAX_TOKENS = 40
MAX_LEN = 96
PAGING = Paging(page=8, pages=24)  # 192 positions: about three of these sequences at once, of six submitted


def _engine(bundle, paging: Paging | None) -> Engine:
    return Engine(bundle.target, bundle.drafter, num_slots=6, max_len=MAX_LEN,
                  cost_model=fixed_costs(6), plan_gate=False,
                  paging=paging)


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_paged_outputs_equal_unpaged_and_sequences_wait_for_pages(trained_tiny, mode: str) -> None:
    prompts = random_prompts(6, seed=11, min_len=10, max_len=30)
    requests = [Request(p, MAX_TOKENS, mode=mode, stop_ids=()) for p in prompts]
    unpaged = [s.output for s in _engine(trained_tiny, None).generate(requests, concurrency=6)]
    engine = _engine(trained_tiny, PAGING)
    seqs = [engine.submit(r) for r in requests]
    most = 0
    while engine.has_work:
        engine.step()
        assert engine.scheduler.reserved <= PAGING.pages
        pages_held = sum(len(t) for t in engine.cache.tables)
        assert pages_held <= PAGING.pages and len(engine.cache.free) == PAGING.pages - pages_held
        most = max(most, len(engine.running))
    assert [s.output for s in seqs] == unpaged
    assert most < len(prompts)  # some waited for pages
    assert len(engine.cache.free) == len(engine.context.free) == PAGING.pages  # every page came back


def test_a_request_larger_than_the_cache_is_refused_by_name(trained_tiny) -> None:
    engine = _engine(trained_tiny, Paging(page=8, pages=4))
    with pytest.raises(ValueError, match="^max_tokens: .* need 48 cache positions, the cache holds 32"):
        engine.submit(Request([1] * 8, MAX_TOKENS))


def test_pages_are_taken_as_a_slot_grows_and_returned_when_it_shrinks(trained_tiny) -> None:
    cache = KVCache(trained_tiny.target.config, 2, 64, CPU, Paging(page=4, pages=5))
    cache.reserve(0, 9)
    assert len(cache.tables[0]) == 3 and len(cache.free) == 2
    cache.lengths[0] = 9
    cache.truncate(0, 4)
    assert len(cache.tables[0]) == 1 and len(cache.free) == 4
    with pytest.raises(CacheFull):
        cache.reserve(1, 21)
    with pytest.raises(ValueError, match="exceed the cache length"):
        cache.reserve(1, 65)
