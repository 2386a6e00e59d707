"""The host allocator setting: when it applies (what it does to page faults, measured in a fresh interpreter:
tests/integration/test_host_subprocess.py)."""

from __future__ import annotations

import platform

import pytest

from adaflash.models import host

GLIBC = platform.libc_ver()[0] == "glibc"


@pytest.mark.parametrize("name, value", [("MALLOC_TRIM_THRESHOLD_", "131072"),
                                         ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536")])
def test_an_allocator_tuned_by_the_environment_is_left_alone(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert not host.keep_freed_memory()


def test_other_tunables_do_not_count_as_the_allocators(monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.cpu.hwcaps=-AVX512F")
    assert host.keep_freed_memory() == GLIBC
