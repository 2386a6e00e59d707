"""The scale fixture (benchmarks/scale_fixture.py): Qwen3-0.6B's published shape, a tokenizer covering its
vocabulary, and at toy size a folder the engine loads and decodes losslessly in every mode."""

from __future__ import annotations

import json

import torch
from helpers import BENCHMARKS, load_script

from adaflash.decoding.engine import Engine
from adaflash.decoding.sampling import SamplingParams
from adaflash.evaluation.bench import run_bench
from adaflash.models.bundle import load_bundle
from adaflash.models.target import TargetConfig, Transformer
from adaflash_contract.modes import MODE_NAMES


def _fixture():
    return load_script(BENCHMARKS / "scale_fixture.py")


def test_the_target_has_qwen3_0_6b_published_size():
    """0.6B parameters, 0.44B of them outside the (tied) embedding, as Qwen3-0.6B's model card gives them."""
    with torch.device("meta"):
        target = Transformer(TargetConfig.from_hf(_fixture().QWEN3_0_6B))
    total = sum(p.numel() for p in target.parameters())
    embedding = target.model.embed_tokens.weight.numel()
    assert 0.55e9 < total < 0.65e9 and round((total - embedding) / 1e9, 2) == 0.44


def test_the_tokenizer_covers_the_vocabulary_up_to_the_special_tokens():
    fixture = _fixture()
    tok = fixture.covering_tokenizer(151936, 151643)
    vocab = tok.get_vocab()
    assert sorted(vocab.values()) == list(range(151643 + len(fixture.SPECIALS)))
    assert [vocab[s] for s in fixture.SPECIALS] == [151643, 151644, 151645]
    text = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)  # ü → ∑"
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text and max(ids) < 151643 and len(ids) < len(text.encode())


def test_the_tiny_fixture_loads_and_every_mode_equals_plain_decoding(tmp_path):
    fixture = _fixture()
    model_dir = fixture.write_fixture(tmp_path / "tiny", "tiny")
    bundle = load_bundle(model_dir)
    assert bundle.target.config.vocab_size == fixture.TINY["vocab_size"]
    assert bundle.drafter.config.target_layer_ids == fixture.TINY_DRAFTER["dflash_config"]["target_layer_ids"]
    engine = Engine(bundle.target, bundle.drafter, num_slots=4, max_len=256)
    prompts = [bundle.tokenizer.encode(f"prompt {i}: " + "abc " * (i + 1)).ids for i in range(4)]
    rows, equal = run_bench(engine, prompts, [None] * 4, list(MODE_NAMES), [1, 4], 12, SamplingParams(),
                            progress=False)
    assert equal and all(r["greedy_equal_to_ar"] for r in rows)


def test_the_scale_benchmark_runs_at_toy_size_and_checks_every_mode(tmp_path):
    """benchmarks/bench_scale.py end to end on the tiny shape (no llama.cpp): every part recorded, every mode equal
    to plain decoding, each prompt length timed."""
    bench = load_script(BENCHMARKS / "bench_scale.py")
    out = tmp_path / "scale.json"
    assert bench.main(["--shape", "tiny", "--model-dir", str(tmp_path / "tiny"), "--prompt-lengths", "16,64",
                       "--concurrency", "1,2", "--most-tokens", "128", "--max-tokens", "6", "--modes-prompt-tokens",
                       "16", "--modes-concurrency", "1,2", "--modes-max-tokens", "6", "--long-max-tokens", "4",
                       "--no-llama", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert set(record) == {"meta", "bandwidth", "ar", "memory", "modes", "long"}
    assert {(r["prompt_tokens_each"], r["concurrency"]) for r in record["ar"]} == {(16, 1), (16, 2), (64, 1), (64, 2)}
    assert record["modes"]["all_equal_to_ar"] and record["long"]["all_equal_to_ar"]
    assert {r["mode"] for r in record["long"]["rows"]} == set(MODE_NAMES)
