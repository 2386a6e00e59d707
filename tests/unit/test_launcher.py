"""The launcher without a server: a missing pytriton is named (serving for real:
tests/integration/test_launcher_served.py)."""

from __future__ import annotations

import pytest

from adaflash_server import TritonServerError, find_bundled_server


def test_missing_pytriton_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(TritonServerError, match="nvidia-pytriton"):
        find_bundled_server()
