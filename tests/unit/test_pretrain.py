"""The default-target pipeline at toy scale on the committed corpus fixture: tokenizer, streams, training, folder."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

from adaflash.decoding.engine import Engine, Request
from adaflash.models.bundle import load_bundle, tiny_random_bundle
from adaflash.models.target import Transformer
from adaflash.models.tokenizer import BYTE_SPECIALS
from adaflash.corpus import DOMAINS
from adaflash.training.dflash import fit_drafter
from adaflash.training.dflash import main as train_drafter_main
from adaflash.training.pretrain import PretrainConfig, main, pretrain, tokenize_corpus, train_tokenizer

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"
TOY = json.loads((Path(__file__).parents[1] / "fixtures" / "pretrain-toy.json").read_text())


def test_pipeline_writes_a_folder_that_transformers_and_the_runner_agree_on(tmp_path):
    out = tmp_path / "models" / "target"
    assert main(["all", "--data", str(CORPUS), "--work", str(tmp_path / "work"), "--out", str(out),
                 "--vocab-size", "400", "--config", str(Path(__file__).parents[1] / "fixtures" / "pretrain-toy.json")]) == 0
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (out / name).exists(), name
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert all(tok.token_to_id(s) is not None for s in BYTE_SPECIALS)
    text = "def f(x):\n    return x * 2  # ünïcode"
    assert tok.decode(tok.encode(text).ids) == text
    ids = torch.tensor([tok.encode(text).ids])
    runner = Transformer.from_pretrained(out)
    hf = AutoModelForCausalLM.from_pretrained(out).float().eval()
    with torch.no_grad():
        assert (runner.train_logits(ids) - hf(ids).logits).abs().max().item() <= 1e-4
    heldout = json.loads((tmp_path / "work" / "heldout.json").read_text())
    assert set(heldout) == set(DOMAINS) and all(v > 0 for v in heldout.values())
    metrics = [json.loads(line) for line in (tmp_path / "work" / "target-run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 7))

    # The drafter stage on the same folder: regenerated data, training, the published format.
    assert train_drafter_main(["--model-dir", str(tmp_path / "models"), "--data", str(CORPUS), "--prompts-per-domain",
                               "2", "--response-tokens", "12", "--steps", "4", "--block-size", "8",
                               "--work", str(tmp_path / "work" / "drafter")]) == 0
    bundle = load_bundle(tmp_path / "models", "drafter-dflash")
    assert bundle.drafter.config.block_size == 8 and bundle.drafter.config.num_target_layers == 2
    prompt = tok.encode("def add(a, b):").ids
    engine = Engine(bundle.target, bundle.drafter, num_slots=2, max_len=64)
    ar, dflash = engine.generate([Request(prompt, 20, mode="ar"), Request(prompt, 20, mode="dflash")])
    assert dflash.output == ar.output


def test_interrupted_training_resumes_to_the_same_weights(tmp_path):
    tok_path = tmp_path / "tokenizer.json"
    tokenizer = train_tokenizer(CORPUS, tok_path, vocab_size=300, chars_per_domain=20_000)
    tokenize_corpus(CORPUS, tokenizer, tmp_path / "tokens")
    cfg = PretrainConfig(**TOY)
    straight, done = pretrain(tmp_path / "tokens", tok_path, tmp_path / "a", cfg, progress=False)
    assert done
    _, done = pretrain(tmp_path / "tokens", tok_path, tmp_path / "b", cfg, progress=False, max_new_steps=4)
    assert not done
    resumed, done = pretrain(tmp_path / "tokens", tok_path, tmp_path / "b", cfg, progress=False)
    assert done
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_interrupted_drafter_training_resumes_to_the_same_weights(tmp_path):
    def fresh():
        bundle = tiny_random_bundle(seed=3)
        torch.manual_seed(0)
        return bundle, [(torch.randint(0, 200, (40,)).tolist(), 10) for _ in range(3)]

    bundle, seqs = fresh()
    fit_drafter(bundle.drafter, bundle.target, seqs, steps=8, run_dir=tmp_path / "a")
    straight = bundle.drafter.state_dict()
    bundle, seqs = fresh()
    assert len(fit_drafter(bundle.drafter, bundle.target, seqs, steps=8, run_dir=tmp_path / "b", max_new_steps=5)) == 5
    bundle, seqs = fresh()
    assert len(fit_drafter(bundle.drafter, bundle.target, seqs, steps=8, run_dir=tmp_path / "b")) == 3
    for (name, a), b in zip(straight.items(), bundle.drafter.state_dict().values()):
        assert torch.equal(a, b), name
    steps = [json.loads(line)["step"] for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 9))
