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


@pytest.mark.parametrize("scenario", reliability.SCENARIOS)  # in order: faults restart processes, so last
def test_the_short_scenario_passes(server, scenario):
    result = reliability.SCENARIO_FUNCTIONS[scenario](server, reliability.SHORT)
    assert result["passed"], json.dumps(result, indent=1)
    if scenario == "soak":
        series = result["memory_kib_series"]
        assert len(series) == result["memory_samples"] and all("tritonserver" in kib for _, kib in series)
