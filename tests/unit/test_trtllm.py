"""The TensorRT-LLM target profile on our side of the boundary: the length schedule derived from a cost table and
acceptance, and the exported repository checked against the names read from the pinned TensorRT-LLM's source
(tests/fixtures/trtllm_fields.json). Nothing here runs TensorRT-LLM."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from adaflash.decoding.costs import CostModel
from adaflash.serving.protocol import REQUEST_FIELDS
from adaflash.serving.trtllm import (
    REQUEST_TENSORS,
    LengthSchedule,
    acceptance_rates,
    derive_schedule,
    load_cost_table,
    policy_length,
)
from adaflash_server.export_trtllm import export_trtllm, register

FIELDS = json.loads((Path(__file__).parents[1] / "fixtures" / "trtllm_fields.json").read_text())
BLOCK = 16
BATCHES = (1, 2, 4, 8, 16, 32, 64)


def growing_cost(per_token_ms: float = 0.05) -> CostModel:
    """A fixed overhead plus a cost per verified token: one more draft token per sequence costs more the more
    sequences share the forward, as on a device that turns compute-bound under load."""
    verify = {b: [(b * k, 5.0 + per_token_ms * b * k) for k in (1, 2, 4, 8, 16)] for b in BATCHES}
    draft = {b: [(n, 0.5 + 0.01 * b * n) for n in (2, 4, 8, 16)] for b in BATCHES}
    return CostModel(verify=verify, draft=draft)


def flat_cost() -> CostModel:
    return CostModel(verify={b: [(b, 5.0), (16 * b, 5.0)] for b in BATCHES},
                     draft={b: [(2, 0.1), (16, 0.1)] for b in BATCHES})


def calibration(rates: list[float]) -> dict:
    return {"per_position": [{"position": j, "reached": 100, "observed": r} for j, r in enumerate(rates, start=1)]}


def model_dir(tmp_path: Path, rates: list[float]) -> Path:
    root = tmp_path / "models"
    (root / "target").mkdir(parents=True)
    (root / "drafter").mkdir()
    (root / "target" / "config.json").write_text(json.dumps({"max_position_embeddings": 1024}))
    (root / "drafter" / "config.json").write_text(json.dumps({"block_size": BLOCK}))
    (root / "drafter" / "calibration.json").write_text(json.dumps(calibration(rates)))
    return root


RATES = [0.6, 0.7, 0.8] + [0.9] * 12


def test_lengths_never_grow_with_the_batch_when_verify_cost_per_token_grows():
    lengths = [policy_length(np.array(RATES), growing_cost(), b, BLOCK) for b in range(1, 65)]
    assert lengths[0] > 0
    assert all(a >= b for a, b in zip(lengths, lengths[1:])), lengths
    assert lengths[-1] < lengths[0]


def test_speculation_stops_above_max_concurrency():
    schedule = derive_schedule(np.array(RATES), growing_cost(per_token_ms=0.2), 64, BLOCK)
    assert 0 < schedule.max_concurrency < 64
    assert all(k > 0 for k in schedule.lengths[: schedule.max_concurrency])
    assert all(k == 0 for k in schedule.lengths[schedule.max_concurrency:])
    assert max(schedule.draft_len_schedule()) == schedule.max_concurrency


def test_free_verification_of_certain_drafts_verifies_whole_blocks_at_every_batch():
    schedule = derive_schedule(np.ones(BLOCK - 1), flat_cost(), 64, BLOCK)
    assert schedule.lengths == (BLOCK - 1,) * 64
    assert schedule.draft_len_schedule() == {64: BLOCK - 1}
    assert schedule.max_concurrency == 64


def test_drafts_never_accepted_are_never_scheduled():
    schedule = derive_schedule(np.zeros(BLOCK - 1), growing_cost(), 8, BLOCK)
    assert schedule.lengths == (0,) * 8 and schedule.max_concurrency == 0


def test_a_length_rising_with_the_batch_is_levelled_and_each_key_closes_a_run():
    schedule = LengthSchedule.levelled([6, 6, 8, 4, 4, 0, 2])
    assert schedule.lengths == (6, 6, 6, 4, 4, 0, 0)
    assert schedule.draft_len_schedule() == {3: 6, 5: 4}
    assert schedule.max_draft_len == 6 and schedule.max_concurrency == 5


def test_acceptance_is_read_in_position_order_and_refused_when_a_position_is_missing():
    shuffled = {"per_position": list(reversed(calibration([0.5, 0.6, 0.7])["per_position"]))}
    assert acceptance_rates(shuffled, 4).tolist() == [0.5, 0.6, 0.7]
    with pytest.raises(ValueError, match=r"positions \[3\]"):
        acceptance_rates(calibration([0.5, 0.6]), 4)


def test_cost_table_from_a_bench_report_and_refused_without_drafter_timings():
    table = growing_cost().to_json()
    assert load_cost_table({"rows": [], "cost_model_ms": table}).verify == load_cost_table(table).verify
    with pytest.raises(ValueError, match="draft_ms"):
        load_cost_table({"verify_ms": table["verify_ms"]})


def exported(tmp_path: Path, cost: CostModel = growing_cost()) -> tuple[dict, str, Path]:
    root = model_dir(tmp_path, RATES)
    out = tmp_path / "repo"
    export_trtllm(out, root / "target", root / "drafter", cost.to_json(),
                  json.loads((root / "drafter" / "calibration.json").read_text()))
    model = out / FIELDS["llmapi_config_pbtxt"]["name"]
    return yaml.safe_load((model / "1" / "model.yaml").read_text()), (model / "config.pbtxt").read_text(), root


def test_every_key_of_the_exported_config_is_a_field_of_the_pinned_release(tmp_path):
    config, _, root = exported(tmp_path)
    assert set(config) - {"triton_config"} <= set(FIELDS["BaseLlmArgs"]["fields"])
    assert set(config["triton_config"]) <= set(FIELDS["llmapi_model_yaml"]["triton_config"])
    spec = config["speculative_config"]
    dflash = FIELDS["DFlashDecodingConfig"]
    assert set(spec) <= set(dflash["fields"])
    assert spec["decoding_type"] == dflash["decoding_type"]
    assert not set(dflash["mutually_exclusive"]) <= set(spec)
    assert Path(config["model"]) == (root / "target").resolve()
    assert Path(spec["speculative_model"]) == (root / "drafter").resolve()


def test_exported_schedule_passes_the_pinned_release_checks(tmp_path):
    config, _, _ = exported(tmp_path)
    spec = config["speculative_config"]
    schedule = spec["draft_len_schedule"]
    assert all(isinstance(b, int) and b >= 1 for b in schedule)
    assert schedule[min(schedule)] == spec["max_draft_len"] > 0  # its smallest key must carry max_draft_len
    assert all(0 <= k <= spec["max_draft_len"] <= BLOCK - 1 for k in schedule.values())
    assert max(schedule) <= config["max_batch_size"] == max(BATCHES)


def test_declared_tensors_are_the_llmapi_models_and_carry_our_request_fields(tmp_path):
    _, pbtxt, _ = exported(tmp_path)
    upstream = FIELDS["llmapi_config_pbtxt"]
    assert f'name: "{upstream["name"]}"' in pbtxt and f'backend: "{upstream["backend"]}"' in pbtxt
    inputs, outputs = (re.findall(r'name: "(\w+)" data_type: (\w+) dims: \[ ([-\d, ]+) \]', part)
                       for part in pbtxt.split("output ["))
    for declared, theirs in ((inputs, upstream["inputs"]), (outputs, upstream["outputs"])):
        for name, dtype, dims in declared:
            assert theirs[name] == [dtype, [int(d) for d in dims.split(",")]], name
    assert {n for n, _, _ in outputs} == set(upstream["outputs"])
    assert set(REQUEST_TENSORS) <= {f.name for f in REQUEST_FIELDS}
    assert {t.name for t in REQUEST_TENSORS.values()} <= {n for n, _, _ in inputs}


def command(tmp_path: Path, rates: list[float]) -> argparse.Namespace:
    root = model_dir(tmp_path, rates)
    (tmp_path / "costs.json").write_text(json.dumps(growing_cost().to_json()))
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["export-trtllm", "--out", str(tmp_path / "repo"), "--model-dir", str(root),
                              "--cost-table", str(tmp_path / "costs.json")])


def test_command_writes_the_repository_and_says_what_it_scheduled(tmp_path, capsys):
    args = command(tmp_path, RATES)
    assert args.func(args) == 0
    printed = json.loads(capsys.readouterr().out)
    report = json.loads((tmp_path / "repo" / "tensorrt_llm" / "adaflash-schedule.json").read_text())
    assert printed["max_concurrency"] == report["max_concurrency"] > 0
    assert {int(b): k for b, k in printed["draft_len_schedule"].items()} == \
        yaml.safe_load((tmp_path / "repo" / "tensorrt_llm" / "1" / "model.yaml").read_text())[
            "speculative_config"]["draft_len_schedule"]


def test_command_refuses_a_table_on_which_speculation_never_pays(tmp_path, capsys):
    args = command(tmp_path, [0.0] * (BLOCK - 1))
    assert args.func(args) == 1
    assert "never pays" in capsys.readouterr().err
    assert not (tmp_path / "repo").exists()
