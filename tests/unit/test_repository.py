"""The repository builder: it fills the templates and copies code, and loads no model (the process that runs the
target's forwards measures the cost table when it starts: the `adaflash` model by default, else `target`), so
a server holds one copy of the target."""

from __future__ import annotations

import argparse
import shutil
from dataclasses import replace

import pytest

from helpers import fixed_costs

from adaflash.models.bundle import save_bundle, tiny_random_bundle
from adaflash_server.repository import (
    RepositoryConfig,
    add_config_arguments,
    build_repository,
    config_from_arguments,
    models_to_load,
)

CFG = RepositoryConfig(max_active=4, max_batch_size=8, max_len=512, max_prompt_tokens=64, max_output_tokens=256)


def _configs_only(tmp_path):
    """A model folder with the configs and tokenizer but no weights: enough to build, not to load."""
    full = save_bundle(tiny_random_bundle(seed=0), tmp_path / "full")
    bare = tmp_path / "bare"
    shutil.copytree(full, bare, ignore=shutil.ignore_patterns("*.safetensors"))
    return bare


LAYOUTS = [True, False]  # target_in_orchestrator


def _host(cfg: RepositoryConfig) -> str:
    """The model whose process runs the target's forwards."""
    return "adaflash" if cfg.target_in_orchestrator else "target"


def _parameter(config: str, key: str) -> str:
    line = next(line for line in config.splitlines() if f'key: "{key}"' in line)
    return line.split('string_value: "')[1].split('"')[0]


@pytest.mark.parametrize("here", LAYOUTS)
def test_the_builder_reads_no_weights_and_leaves_the_costs_to_the_target(tmp_path, here):
    cfg = replace(CFG, target_in_orchestrator=here)
    repo = build_repository(tmp_path / "model_repository", _configs_only(tmp_path), "drafter", cfg)
    assert _parameter((repo / _host(cfg) / "config.pbtxt").read_text(), "cost_table") == ""
    assert not (tmp_path / "model_repository.cost.json").exists()


@pytest.mark.parametrize("here", LAYOUTS)
def test_a_given_cost_table_is_handed_to_the_target(tmp_path, here):
    cfg = replace(CFG, target_in_orchestrator=here)
    given = tmp_path / "given.json"
    fixed_costs(4).save(given)
    repo = build_repository(tmp_path / "model_repository", _configs_only(tmp_path), "drafter", cfg, given)
    path = _parameter((repo / _host(cfg) / "config.pbtxt").read_text(), "cost_table")
    assert path and open(path).read() == given.read_text()


def test_the_target_runs_in_the_orchestrator_unless_asked_apart(tmp_path):
    """By default no `target` model is written (one copy of the target, in the process of `adaflash`, the
    orchestrator); asked apart, the `target` model holds it and the orchestrator calls it."""
    assert RepositoryConfig().target_in_orchestrator
    here = build_repository(tmp_path / "here", _configs_only(tmp_path / "a"), "drafter", CFG)
    assert sorted(p.name for p in here.iterdir()) == ["adaflash", "drafter"]
    assert _parameter((here / "adaflash" / "config.pbtxt").read_text(), "target_in_orchestrator") == "True"
    apart = build_repository(tmp_path / "apart", _configs_only(tmp_path / "b"), "drafter",
                             replace(CFG, target_in_orchestrator=False))
    assert (apart / "target" / "config.pbtxt").exists()
    assert _parameter((apart / "adaflash" / "config.pbtxt").read_text(), "target_in_orchestrator") == "False"


def test_the_drafter_runs_beside_the_target_unless_asked_apart(tmp_path):
    """By default the drafter runs in the orchestrator's process beside the target: its model is written (the template
    a published drafter copies) but the server does not load it; asked apart, or with the target a model of its own,
    the `drafter` model is loaded and the orchestrator calls it."""
    assert RepositoryConfig().drafter_in_orchestrator
    bare = _configs_only(tmp_path / "m")
    here = build_repository(tmp_path / "here", bare, "drafter", CFG)
    assert _parameter((here / "adaflash" / "config.pbtxt").read_text(), "drafter_in_orchestrator") == "True"
    assert (here / "drafter" / "config.pbtxt").exists() and models_to_load(here) == ["adaflash"]
    for cfg in (replace(CFG, drafter_in_orchestrator=False), replace(CFG, target_in_orchestrator=False)):
        apart = build_repository(tmp_path / "apart", bare, "drafter", cfg)
        assert _parameter((apart / "adaflash" / "config.pbtxt").read_text(), "drafter_in_orchestrator") == "False"
        assert "drafter" in models_to_load(apart)
    assert models_to_load(build_repository(tmp_path / "none", bare, None, CFG)) == ["adaflash"]


@pytest.mark.parametrize("here", LAYOUTS)
def test_a_gpu_repository_puts_the_models_on_the_named_gpu_in_bf16(tmp_path, here):
    """Written on a machine without a GPU for one with: the target's host and the drafter get a GPU instance on
    the device asked for, in the device's default dtype; the orchestrator without the target stays on the CPU."""
    gpu = replace(CFG, device="cuda:1", target_in_orchestrator=here)
    repo = build_repository(tmp_path / "model_repository", _configs_only(tmp_path), "drafter", gpu)
    for model in (_host(gpu), "drafter"):
        config = (repo / model / "config.pbtxt").read_text()
        assert "kind: KIND_GPU gpus: [ 1 ]" in config
        assert (_parameter(config, "device"), _parameter(config, "dtype")) == ("cuda", "bfloat16")
    if not here:
        assert "KIND_GPU" not in (repo / "adaflash" / "config.pbtxt").read_text()
    cpu = replace(CFG, device="cpu", dtype="bfloat16", target_in_orchestrator=here)
    config = (build_repository(tmp_path / "cpu_repository", _configs_only(tmp_path / "b"), "drafter", cpu)
              / _host(cpu) / "config.pbtxt").read_text()
    assert "kind: KIND_CPU" in config and _parameter(config, "dtype") == "bfloat16"


def test_a_bad_device_or_dtype_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="^dtype"):
        build_repository(tmp_path / "r", _configs_only(tmp_path), "drafter", replace(CFG, dtype="fp8"))
    with pytest.raises(ValueError, match="^device"):
        build_repository(tmp_path / "s", _configs_only(tmp_path / "b"), "drafter", replace(CFG, device="tpu"))


def test_a_kv_cache_budget_pages_the_caches(tmp_path):
    """A budget of 2.5 sequences of max_len (target KV and drafter context in fp32, counted from real caches of
    the tiny models) for max_active 4: the caches are paged, the budget's positions in pages of kv_page; a budget
    that holds max_active x max_len needs no paging; one below a sequence of max_len is refused."""
    bundle = tiny_random_bundle(seed=0)
    per_token = sum(c.k.nbytes + c.v.nbytes for c in (bundle.target.new_cache(1, 1), bundle.drafter.new_cache(1, 1)))
    budget = replace(CFG, device="cpu", kv_page=32, kv_cache_memory=str(int(2.5 * CFG.max_len * per_token)))
    repo = build_repository(tmp_path / "model_repository", _configs_only(tmp_path), "drafter", budget)
    for model in ("drafter", "adaflash"):
        config = (repo / model / "config.pbtxt").read_text()
        assert _parameter(config, "max_active") == "4"
        assert (_parameter(config, "kv_page"), _parameter(config, "kv_pages")) == ("32", str(int(2.5 * 512) // 32))
    roomy = replace(budget, kv_cache_memory=str(4 * CFG.max_len * per_token))
    repo = build_repository(tmp_path / "roomy", _configs_only(tmp_path / "a"), "drafter", roomy)
    assert _parameter((repo / "adaflash" / "config.pbtxt").read_text(), "kv_pages") == "0"
    with pytest.raises(ValueError, match="^kv_cache_memory: .* less than one sequence"):
        build_repository(tmp_path / "r", _configs_only(tmp_path / "b"), "drafter",
                         replace(budget, kv_cache_memory=str(per_token * 10)))
    with pytest.raises(ValueError, match="^kv_cache_memory"):
        build_repository(tmp_path / "s", _configs_only(tmp_path / "c"), "drafter",
                         replace(budget, kv_cache_memory="lots"))


def test_the_drafter_backend_reaches_the_drafter_model_and_a_misfit_stops_the_build(tmp_path):
    """`--drafter-backend` is the drafter model's parameter; onnx (ONNX Runtime's CPU package) is refused by name
    for a GPU or a half-precision repository, and so is a backend that does not exist."""
    pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
    model_dir = _configs_only(tmp_path)
    repo = build_repository(tmp_path / "model_repository", model_dir, "drafter",
                            replace(CFG, device="cpu", drafter_backend="onnx"))
    assert _parameter((repo / "drafter" / "config.pbtxt").read_text(), "drafter_backend") == "onnx"
    assert RepositoryConfig().drafter_backend == "torch"
    for misfit in (replace(CFG, device="cuda:0", drafter_backend="onnx"),
                   replace(CFG, device="cpu", dtype="bfloat16", drafter_backend="onnx"),
                   replace(CFG, drafter_backend="tensorrt")):
        with pytest.raises(ValueError, match="^drafter_backend: "):
            build_repository(tmp_path / "r", model_dir, "drafter", misfit)


def test_a_flag_field_is_an_option_pair_and_the_others_keep_their_types():
    """`adaflash serve` and the builder take an option per field: a flag as --x / --no-x (a typed option would read
    "False" as true), the others as their field's type."""
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    assert config_from_arguments(parser.parse_args([])) == RepositoryConfig()
    apart = config_from_arguments(parser.parse_args(["--no-target-in-orchestrator", "--max-active", "7"]))
    assert apart == replace(RepositoryConfig(), target_in_orchestrator=False, max_active=7)
