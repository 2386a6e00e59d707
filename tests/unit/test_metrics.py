"""The orchestrator's Prometheus series against a fake of Triton's `MetricFamily`: a finished request's latency
histograms (a few observations per request, from its timestamps), the counters a flush writes, and each model's
cache gauges (blocks, bytes, usage), read from real caches, paged and unpaged, and set only when they change."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from adaflash.decoding.sequence import Request, Sequence, StepRecord
from adaflash.models.cache import KVCache, Paging
from adaflash.models.placement import CPU
from adaflash.serving.metrics import BUCKETS, CacheGauges, Metrics, request_latencies
from adaflash.serving.slots import CacheSlots, CacheUsage, OccupancyReporter

SHAPE = SimpleNamespace(num_hidden_layers=2, num_key_value_heads=2, head_dim=4)
BYTES_PER_POSITION = 2 * 2 * 2 * 4 * 4  # k and v, layers, heads, head_dim, float32


class FakeSeries:
    def __init__(self, family: FakeFamily, labels: dict[str, str], buckets: list[float] | None) -> None:
        self.family, self.labels, self.buckets = family, labels, buckets
        self.value, self.observed, self.writes = 0.0, [], 0

    def increment(self, n: float) -> None:
        self.value += n
        self.writes += 1

    def set(self, value: float) -> None:
        self.value = value
        self.writes += 1

    def observe(self, value: float) -> None:
        self.observed.append(value)
        self.writes += 1


class FakeFamily:
    """`pb_utils.MetricFamily`'s interface; every family and series made is kept in `made` to be read back."""

    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    made: dict[str, FakeFamily] = {}

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name, self.description, self.kind = name, description, kind
        self.series: list[FakeSeries] = []
        FakeFamily.made[name] = self

    def Metric(self, labels: dict[str, str], buckets: list[float] | None = None) -> FakeSeries:  # noqa: N802
        assert (buckets is not None) == (self.kind == self.HISTOGRAM), f"{self.name}: buckets for histograms only"
        self.series.append(FakeSeries(self, labels, buckets))
        return self.series[-1]


@pytest.fixture
def family() -> type[FakeFamily]:
    FakeFamily.made = {}
    return FakeFamily


def _series(name: str, **labels: str) -> FakeSeries:
    [found] = [s for s in FakeFamily.made[name].series if s.labels == labels]
    return found


def _sequence(mode: str = "dflash", finish: str | None = "length", output: int = 9, steps: int = 4,
              first_token: float | None = 10.5) -> Sequence:
    """A request submitted at 10.0 whose first token came at `first_token` and that ended at 12.5."""
    seq = Sequence(id=1, request=Request([5] * 7, max_tokens=output, mode=mode), tokens=[5] * 7, generator=None,
                   stop_ids=frozenset(), submitted_at=10.0)
    seq.output = list(range(output))
    seq.steps = [StepRecord(draft_len=3, accepted=1, committed=2) for _ in range(steps)]
    seq.first_token_at, seq.finished_at, seq.finish_reason = first_token, 12.5, finish
    return seq


def test_a_completed_request_observes_its_latencies_once_each_under_its_mode(family) -> None:
    metrics = Metrics(family)
    metrics.started(_sequence())
    metrics.finished(_sequence())
    expected = {"adaflash_time_to_first_token_seconds": 0.5, "adaflash_e2e_request_latency_seconds": 2.5,
                "adaflash_request_time_per_output_token_seconds": 2.0 / 8,  # 8 tokens after the first in 2 s
                "adaflash_inter_token_latency_seconds": 2.0 / 4}  # 4 verify steps after the first token
    for name, seconds in expected.items():
        series = _series(name, spec_mode="dflash")
        assert series.observed == [pytest.approx(seconds)] and series.family.kind == FakeFamily.HISTOGRAM
        assert series.buckets == sorted(series.buckets) and series.buckets[0] < seconds < series.buckets[-1]
    assert set(BUCKETS) == {"ttft", "e2e", "tpot", "itl"}


@pytest.mark.parametrize(("finish", "first_token", "observed"), [
    ("stop", 10.5, {"ttft", "e2e", "tpot", "itl"}),
    ("cancelled", 10.5, {"ttft"}),  # its end is its client's choice; its first token came all the same
    ("cancelled", None, set()),  # cancelled in the scheduler's queue: no token
])
def test_what_a_request_observes_depends_on_how_it_ended(finish, first_token, observed) -> None:
    assert set(request_latencies(_sequence(finish=finish, first_token=first_token))) == observed


def test_a_request_of_one_token_has_no_gap_to_observe() -> None:
    assert set(request_latencies(_sequence(output=1, steps=0))) == {"ttft", "e2e"}


def test_a_failed_request_observes_nothing_and_counts_nothing(family) -> None:
    metrics = Metrics(family)
    metrics.started(_sequence())
    metrics.finished(_sequence(finish="error"))
    metrics.flush()
    assert all(not s.observed for f in FakeFamily.made.values() for s in f.series)
    assert "adaflash_requests_total" not in {f.name for f in FakeFamily.made.values() if f.series}
    assert _series("adaflash_active_sequences", spec_mode="dflash").value == 0


def test_a_flush_writes_the_counters_of_the_requests_finished_since(family) -> None:
    metrics = Metrics(family)
    for mode in ("ar", "dflash", "dflash"):
        metrics.finished(_sequence(mode=mode))
    assert not FakeFamily.made["adaflash_prompt_tokens_total"].series  # gathered until the flush
    metrics.flush()
    assert _series("adaflash_prompt_tokens_total", spec_mode="dflash").value == 14
    assert _series("adaflash_prompt_tokens_total", spec_mode="ar").writes == 1
    assert _series("adaflash_verify_steps_total", spec_mode="dflash", accepted="1").value == 8
    assert _series("adaflash_accepted_tokens_total", spec_mode="dflash").value == 8
    assert len(_series("adaflash_time_to_first_token_seconds", spec_mode="dflash").observed) == 2


def _usage(**changes: int) -> CacheUsage:
    fields = dict(open_slots=1, max_blocks=10, used_blocks=4, tokens_per_block=16, block_bytes=100, total_bytes=1100)
    return CacheUsage(**{**fields, **changes})


def test_cache_gauges_are_set_in_tensorrt_llm_block_terms_and_only_when_they_change(family) -> None:
    gauges = CacheGauges(family, "drafter_2")
    gauges.write(_usage())
    blocks = {s.labels["kv_cache_block_type"]: s.value for s in FakeFamily.made["adaflash_kv_cache_blocks"].series}
    assert blocks == {"max": 10, "free": 6, "used": 4, "tokens_per": 16}
    assert _series("adaflash_kv_cache_bytes", model="drafter_2", kind="used").value == 400
    assert _series("adaflash_kv_cache_bytes", model="drafter_2", kind="total").value == 1100
    assert _series("adaflash_kv_cache_usage_perc", model="drafter_2").value == pytest.approx(0.4)
    assert _series("adaflash_open_slots", model="drafter_2").value == 1
    writes = sum(s.writes for f in FakeFamily.made.values() for s in f.series)
    gauges.write(_usage(used_blocks=5, open_slots=1))  # used, free, used bytes and usage changed; the rest did not
    assert sum(s.writes for f in FakeFamily.made.values() for s in f.series) == writes + 4


def test_an_unpaged_cache_counts_each_slot_as_one_block_of_max_len_positions() -> None:
    slots = CacheSlots(KVCache(SHAPE, 4, 32, CPU), idle_timeout_s=60)
    slot = slots.slots.acquire("a")
    slots.cache.lengths[slot] = 5
    usage = slots.usage()
    assert (usage.open_slots, usage.max_blocks, usage.used_blocks, usage.free_blocks) == (1, 4, 1, 3)
    assert usage.tokens_per_block == 32 and usage.block_bytes == 32 * BYTES_PER_POSITION
    assert usage.total_bytes == 4 * 32 * BYTES_PER_POSITION and usage.usage == 0.25
    slots.release("a")
    assert slots.usage().used_blocks == 0 and slots.usage().open_slots == 0


def test_a_paged_cache_counts_the_pages_held_and_leaves_the_scratch_page_out() -> None:
    slots = CacheSlots(KVCache(SHAPE, 4, 32, CPU, Paging(page=8, pages=10), scratch=True), idle_timeout_s=60)
    slot = slots.slots.acquire("a")
    slots.cache.reserve(slot, 17)
    slots.cache.lengths[slot] = 17
    usage = slots.usage()
    assert (usage.max_blocks, usage.used_blocks, usage.free_blocks, usage.tokens_per_block) == (10, 3, 7, 8)
    assert usage.used_bytes == 3 * 8 * BYTES_PER_POSITION
    assert usage.total_bytes == 11 * 8 * BYTES_PER_POSITION  # the memory, the scratch page included
    slots.release("a")
    assert slots.usage().used_blocks == 0


def test_the_reporter_writes_a_usage_only_when_it_changed() -> None:
    slots = CacheSlots(KVCache(SHAPE, 2, 16, CPU), idle_timeout_s=60)
    written: list[CacheUsage] = []
    reporter = OccupancyReporter(slots, written.append)
    last = reporter.report(None)
    assert reporter.report(last) == last and len(written) == 1
    slots.slots.acquire("a")
    reporter.report(last)
    assert [u.open_slots for u in written] == [0, 1]
