"""The launcher's cleanup of a killed server's shared-memory regions (`adaflash_server.shm`): only regions it noted,
and only once no live process maps them (a killed tritonserver's, in tests/integration/test_queue.py)."""

from __future__ import annotations

import mmap
import os

from adaflash_server import shm


def test_only_the_regions_no_process_maps_are_removed(tmp_path):
    regions = [tmp_path / f"{shm.REGION_PREFIX}{i}" for i in range(3)]
    for region in regions:
        region.write_bytes(b"\0" * mmap.PAGESIZE)
    stranger = tmp_path / "not_a_region"
    stranger.write_bytes(b"\0" * mmap.PAGESIZE)
    with regions[0].open("r+b") as f, mmap.mmap(f.fileno(), mmap.PAGESIZE) as held:
        assert shm.mapped_regions(os.getpid()) >= {regions[0]}
        assert regions[1] not in shm.mapped_by_anyone()
        removed = shm.remove_unmapped({regions[0], regions[1]})
        held[0] = 1  # still usable: the mapped region was left alone
    assert removed == [regions[1]]
    assert regions[0].exists() and not regions[1].exists()
    assert regions[2].exists() and stranger.exists()  # never noted: another server's, or not a region


def test_a_process_that_is_gone_maps_nothing():
    assert shm.mapped_regions(2**22 + 12345) == set()
