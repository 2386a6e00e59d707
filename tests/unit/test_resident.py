"""Resident memory of the served path, the parts that need no server: a cache allocated for the worst case is
resident only where it is written, reads the zeros `torch.zeros` gave, and its pages and slots are handed out lowest
first, so what is resident follows the highest use; the launcher's builder options survive the trip to the
interpreter that builds (`repository.config_argv`). The served figures: tests/integration/test_resident_served.py,
benchmarks/bench_memory.py."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from adaflash.models.cache import KVCache, Paging, untouched_zeros
from adaflash.models.placement import CPU, Placement
from adaflash.serving.slots import SlotTable
from adaflash_server import serve
from adaflash_server.repository import RepositoryConfig, add_config_arguments, config_argv, config_from_arguments

# Cache shape of the tests below: big enough that being resident or not cannot hide in the process's noise.
SHAPE = SimpleNamespace(num_hidden_layers=4, num_key_value_heads=2, head_dim=64)
SLOTS, MAX_LEN = 64, 1024

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/status")


def resident_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


@linux_only
def test_an_allocated_cache_is_resident_only_where_written():
    before = resident_bytes()
    cache = KVCache(SHAPE, SLOTS, MAX_LEN, CPU)
    allocated = resident_bytes() - before
    assert cache.k.nbytes + cache.v.nbytes == 2 * 4 * SLOTS * 2 * MAX_LEN * 64 * 4
    assert allocated < (cache.k.nbytes + cache.v.nbytes) / 20  # generous: nothing of it is resident yet

    for store in (cache.k, cache.v):  # reads see zeros (reductions that make no copy of the cache)...
        assert store.max().item() == store.min().item() == 0
    read = resident_bytes() - before
    assert read < (cache.k.nbytes + cache.v.nbytes) / 20  # ... and make nothing resident

    slot_bytes = cache.k[:, 0].nbytes  # one slot's keys over every layer
    cache.k[:, 0] = 1.0
    written = resident_bytes() - before
    assert slot_bytes * 0.9 < written - read < slot_bytes * 2


def test_untouched_zeros_are_zeros_of_the_placement():
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        z = untouched_zeros((3, 5, 7), Placement(torch.device("cpu"), dtype))
        assert z.dtype == dtype and z.shape == (3, 5, 7) and z.is_contiguous()
        assert torch.equal(z, torch.zeros(3, 5, 7, dtype=dtype))
        z[1] = 2  # writable, and the other pages stay zeros
        assert z.sum().item() == 2 * 5 * 7
    assert untouched_zeros((0, 4), CPU).shape == (0, 4)
    assert untouched_zeros((2, 2), Placement(torch.device("meta"), torch.float32)).device.type == "meta"


def test_pages_go_lowest_first_and_a_freed_page_before_one_never_written():
    cache = KVCache(SHAPE, 4, 64, CPU, Paging(page=16, pages=8))
    cache.reserve(0, 32)
    cache.reserve(1, 16)
    assert cache.tables[:2] == [[0, 1], [2]]
    cache.truncate(0, 0)
    cache.reserve(2, 48)  # the two pages slot 0 gave back, then the lowest never written
    assert cache.tables[2] == [0, 1, 3]
    assert max(p for t in cache.tables for p in t) == 3  # the high-water mark of use, not more


def test_slots_go_lowest_first_and_a_freed_slot_before_one_never_used():
    table = SlotTable(8, idle_timeout_s=60.0)
    assert [table.acquire(k) for k in "abc"] == [0, 1, 2]
    table.release("b")
    assert table.acquire("d") == 1 and table.acquire("e") == 3


def test_config_argv_gives_the_config_back():
    """What `adaflash serve` parsed reaches the builder's interpreter unchanged: flags both ways, empty strings,
    negative numbers (AUTO), floats."""
    p = argparse.ArgumentParser()
    add_config_arguments(p)
    for cfg in (RepositoryConfig(),
                RepositoryConfig(max_active=8, dtype="", kv_cache_memory="1GiB", target_in_orchestrator=False,
                                 max_responses_per_s=-1.0, stream_interval_ms=2.5, device="cpu")):
        assert config_from_arguments(p.parse_args(config_argv(cfg))) == cfg


def test_serve_builds_apart_only_where_that_keeps_torch_out_of_the_launcher(monkeypatch, tmp_path):
    """Where the process has torch already (the `adaflash` CLI imported it) the repository is built here: an
    interpreter apart would only add its start."""
    built = []
    monkeypatch.setattr(serve, "build_apart", lambda out, *rest: built.append("apart") or (out, None))
    monkeypatch.setattr(serve, "build_repository", lambda out, *rest: built.append("here") or out)
    assert serve.build(tmp_path, Path("models"), "drafter", RepositoryConfig(), None) == tmp_path / "model_repository"
    monkeypatch.delitem(sys.modules, "torch")
    assert serve.build(tmp_path, Path("models"), "drafter", RepositoryConfig(), None) == tmp_path / "model_repository"
    assert built == ["here", "apart"]
