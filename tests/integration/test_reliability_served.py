"""The reliability suite's short scale against a real server (`make soak` runs the full one); the checks it
applies, each shown failing on the outcome it must catch, are tests/unit/test_reliability.py."""

from __future__ import annotations

import json

import pytest

from adaflash_tools import reliability


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = reliability.start_server(tmp_path_factory.mktemp("reliability"), reliability.SHORT, None)
    yield server
    server.stop()


@pytest.mark.parametrize("scenario", [s for s in reliability.SCENARIOS if s not in reliability.APART])
def test_the_short_scenario_passes(server, scenario):  # in order: faults restart processes, so last
    result = reliability.SCENARIO_FUNCTIONS[scenario](server, reliability.SHORT)
    assert result["passed"], json.dumps(result, indent=1)
    if scenario == "soak":
        series = result["memory_kib_series"]
        assert len(series) == result["memory_samples"] and all("tritonserver" in kib for _, kib in series)


def test_the_short_chaos_passes(tmp_path):
    """One kill of each kind under the mixed load, on a server whose drafter has a process of its own."""
    server = reliability.start_server(tmp_path, reliability.SHORT, None, drafter_apart=True)
    try:
        result = reliability.SCENARIO_FUNCTIONS["chaos"](server, reliability.SHORT)
    finally:
        server.stop()
    assert result["passed"], json.dumps(result, indent=1)
    assert min(result["kills_by_kind"].values()) >= 1, result["kills_by_kind"]
    assert all(result["requests_by_door"].values()), result["requests_by_door"]
