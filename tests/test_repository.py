"""The repository builder: it fills the templates and copies code, and loads no model (the target model
measures the cost table when it starts, in the process that serves), so a server holds one copy of the target."""

from __future__ import annotations

import shutil

from helpers import fixed_costs

from adaflash.models.bundle import save_bundle, tiny_random_bundle
from adaflash_build.repository import RepositoryConfig, build_repository

CFG = RepositoryConfig(max_active=4, max_batch_size=8, max_len=512, max_prompt_tokens=64, max_output_tokens=256)


def _configs_only(tmp_path):
    """A model folder with the configs and tokenizer but no weights: enough to build, not to load."""
    full = save_bundle(tiny_random_bundle(seed=0), tmp_path / "full")
    bare = tmp_path / "bare"
    shutil.copytree(full, bare, ignore=shutil.ignore_patterns("*.safetensors"))
    return bare


def _parameter(config: str, key: str) -> str:
    line = next(line for line in config.splitlines() if f'key: "{key}"' in line)
    return line.split('string_value: "')[1].split('"')[0]


def test_the_builder_reads_no_weights_and_leaves_the_costs_to_the_target(tmp_path):
    repo = build_repository(tmp_path / "model_repository", _configs_only(tmp_path), "drafter", CFG)
    assert _parameter((repo / "target" / "config.pbtxt").read_text(), "cost_table") == ""
    assert not (tmp_path / "model_repository.cost.json").exists()


def test_a_given_cost_table_is_handed_to_the_target(tmp_path):
    given = tmp_path / "given.json"
    fixed_costs(4).save(given)
    repo = build_repository(tmp_path / "model_repository", _configs_only(tmp_path), "drafter", CFG, given)
    path = _parameter((repo / "target" / "config.pbtxt").read_text(), "cost_table")
    assert path and open(path).read() == given.read_text()
