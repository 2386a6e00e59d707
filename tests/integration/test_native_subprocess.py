"""The C kernels (adaflash.models.native) in a fresh interpreter: the switch that turns them off, a first build
into an empty cache, and a failed build that leaves torch's products (the kernels themselves:
tests/unit/test_native.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from test_native import needs_native


def _available_in_subprocess(env: dict[str, str]) -> str:
    code = "from adaflash.models import native; print(native.available())"
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120, check=True)
    return done.stdout.strip() + done.stderr


def test_the_switch_turns_the_native_product_off():
    assert _available_in_subprocess({"ADAFLASH_NATIVE": "0"}).startswith("False")


@needs_native
def test_an_empty_cache_builds_the_kernels_once(tmp_path):
    """What a new host does on its first forward: compile into the cache, then load what is there."""
    for _ in range(2):
        assert _available_in_subprocess({"ADAFLASH_CACHE_DIR": str(tmp_path)}).startswith("True")
    assert [p.suffix for p in tmp_path.iterdir()] == [".so"]


@needs_native
def test_a_failed_build_leaves_torch_products(tmp_path):
    """A host without a working compiler keeps torch's products and says why."""
    out = _available_in_subprocess({"CC": "/bin/false", "ADAFLASH_CACHE_DIR": str(tmp_path)})
    assert out.startswith("False") and "native kernels unavailable" in out
    assert not list(tmp_path.iterdir())  # no half-written library left behind
