"""`adaflash train` at toy scale, in process: every stage runs on a tiny target built here and a few hundred prompts,
its drafter decodes every mode as plain decoding does, a finished run is not redone, a work folder serves one run,
the prompt file is split the same way every time, and the memory plan counts what training holds."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from helpers import fixed_costs

from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request
from adaflash.models.bundle import load_bundle, save_bundle, tiny_random_bundle
from adaflash.models.chat_template import CHATML, ChatTemplate
from adaflash.models.drafter import DrafterConfig
from adaflash.models.memory import drafter_parameters, target_parameters
from adaflash.models.target import TargetConfig
from adaflash.models.tokenizer import byte_tokenizer
from adaflash.training.command import main, torchrun_command
from adaflash.training.dflash import fit_drafter
from adaflash.training.distributed import World
from adaflash.training.memory import TrainingShape, training_plan
from adaflash.training.prompts import file_prompts
from adaflash_contract.modes import MODE_NAMES

REFERENCE = Path(__file__).parents[1] / "fixtures" / "reference"
WORDS = ("cache block token draft verify target model layer head loss alpha beta gamma delta sum product "
         "def return while for if else print list").split()
DOMAINS = ("chat", "code", "math")

# A run small enough for two CPU cores in seconds, every stage included (the recipe's defaults are for real runs).
TOY = ["--response-tokens", "32", "--generation-chunk", "64", "--block-size", "8", "--batch", "2",
       "--dflash-steps", "100", "--dflash-lr", "3e-3", "--dflash-anchors", "8", "--checkpoint-every", "20",
       "--opd-rounds", "2", "--opd-prompts-per-domain", "8", "--opd-steps", "12", "--opd-anchors", "8",
       "--opd-temperatures", "0", "--heads-steps", "60", "--heads-anchors", "8", "--head-dim", "16",
       "--heldout-per-domain", "4", "--eval-tokens", "32", "--no-progress"]


def toy_target(root: Path) -> Path:
    """The tiny random Qwen3 target over a byte tokenizer, saved as a Hugging Face folder; returns it."""
    bundle = tiny_random_bundle(seed=0)
    bundle.drafter = None
    return save_bundle(bundle, root / "models") / "target"


def toy_prompts(path: Path, n: int = 240, seed: int = 0) -> Path:
    """`n` prompts of a few words, the domains taking turns."""
    rng = random.Random(seed)
    rows = [{"prompt": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))), "domain": DOMAINS[i % 3]}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def train_args(target: Path, prompts: Path, out: Path, work: Path, *extra: str) -> list[str]:
    return ["--target", str(target), "--prompts", str(prompts), "--out", str(out), "--work", str(work), *TOY, *extra]


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("train")
    target, prompts = toy_target(root), toy_prompts(root / "prompts.jsonl")
    args = train_args(target, prompts, root / "out" / "drafter", root / "work", "--stage-drafters", str(root / "out"))
    assert main(args) == 0
    return {"root": root, "target": target, "prompts": prompts, "args": args, "out": root / "out" / "drafter",
            "report": json.loads((root / "work" / "report.json").read_text())}


def test_every_stage_runs_and_the_report_says_what_each_did(toy_run):
    report = toy_run["report"]
    assert list(report["stages"]) == ["regenerate", "dflash", "opd", "heads"]
    assert report["prompts"] == {"train": 228, "heldout": 12}
    assert len(report["stages"]["dflash"]["losses"]) == 100 and len(report["stages"]["opd"]["losses"]) == 24
    dflash = report["stages"]["dflash"]["losses"]
    assert sum(dflash[-20:]) < 0.7 * sum(dflash[:20])  # the drafter learnt the target's text
    assert list(report["tau"]) == ["initial", "dflash", "opd"]
    assert set(report["tau"]["opd"]) == {*DOMAINS, "all"}
    assert report["tau"]["opd"]["all"] > report["tau"]["initial"]["all"]
    assert report["stages"]["opd"]["tau_before"] == report["tau"]["dflash"]
    assert report["stages"]["heads"]["calibration"]["per_domain"].keys() <= set(DOMAINS)
    assert set(report["memory_plan"]) == {"regenerate", "dflash", "opd", "heads"}
    assert (toy_run["root"] / "work" / "report.png").exists()  # matplotlib is in the dev venv (the load extra)


def test_the_drafter_serves_every_mode_as_plain_decoding_decodes(toy_run):
    """Loaded as `adaflash serve --drafter` loads a drafter (a folder beside target/, here by its path), with both
    length heads; greedy text of every mode equals `ar`'s."""
    bundle = load_bundle(toy_run["target"].parent, str(toy_run["out"]))
    assert bundle.drafter.config.length_head and bundle.drafter.config.position_head
    assert (toy_run["out"] / "calibration.json").exists()
    for stage in ("drafter-dflash", "drafter-adaflash"):  # --stage-drafters: the stages' drafters, without heads
        assert not load_bundle(toy_run["target"].parent, str(toy_run["out"].parent / stage)).drafter.config.length_head
    prompts = [bundle.tokenizer.encode(" ".join(WORDS[i:i + 4])).ids for i in range(0, 16, 2)]
    engine = Engine(bundle.target, bundle.drafter, num_slots=len(prompts), max_len=96, cost_model=fixed_costs(8))
    outputs = {mode: [s.output for s in engine.generate([Request(p, 40, mode=mode, stop_ids=()) for p in prompts])]
               for mode in MODE_NAMES}
    for mode in MODE_NAMES:
        assert outputs[mode] == outputs["ar"], mode


def test_a_finished_run_is_not_redone(toy_run):
    before = (toy_run["out"] / "model.safetensors").read_bytes()
    metrics = (toy_run["root"] / "work" / "dflash" / "metrics.jsonl").read_text()
    assert main(toy_run["args"]) == 0
    assert (toy_run["out"] / "model.safetensors").read_bytes() == before
    assert (toy_run["root"] / "work" / "dflash" / "metrics.jsonl").read_text() == metrics


def test_a_work_folder_refuses_another_run(toy_run, capsys):
    other = toy_prompts(toy_run["root"] / "other.jsonl", n=60, seed=1)
    args = train_args(toy_run["target"], other, toy_run["root"] / "x", toy_run["root"] / "work")
    assert main(args) == 2
    assert "holds a run with other prompts" in capsys.readouterr().err
    assert main([*toy_run["args"], "--batch", "4"]) == 2
    assert "holds a run with batch 2" in capsys.readouterr().err


def test_the_held_out_split_is_fixed_and_conversations_take_the_chat_template(tmp_path):
    rows = [{"prompt": f"question {i}", "domain": "a" if i % 2 else "b"} for i in range(20)]
    rows += [{"messages": [{"role": "user", "content": "hello"}]}]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok, chat = byte_tokenizer(), ChatTemplate(CHATML)
    first = file_prompts(str(path), tok, chat, 64, heldout_per_domain=3)
    again = file_prompts(str(path), tok, chat, 64, heldout_per_domain=3)
    assert first.heldout == again.heldout and first.train == again.train
    assert sorted(d for d, _ in first.heldout) == ["a"] * 3 + ["b"] * 3  # a lone row of a domain is never held out
    conversation = [ids for d, ids in first.train if d == "all"][0]
    assert tok.decode(conversation) == chat.render([{"role": "user", "content": "hello"}])
    wrapped = file_prompts(str(path), tok, chat, 64, heldout_per_domain=3, wrap=True)
    assert tok.decode(wrapped.train[0][1]).startswith("<|im_start|>user\n")
    path.write_text('{"text": "no prompt"}\n')
    with pytest.raises(ValueError, match="needs `prompt` or `messages`"):
        file_prompts(str(path), tok, None, 64, 3)


def qwen3_8b() -> TargetConfig:
    """Qwen/Qwen3-8B's config.json, the fields the runner reads."""
    return TargetConfig.from_hf({
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000, "tie_word_embeddings": False, "max_position_embeddings": 40960})


def test_the_training_plan_counts_adam_states_and_the_frozen_target():
    target = qwen3_8b()
    drafter = DrafterConfig.from_hf(json.loads((REFERENCE / "dflash-qwen3-8b-b16.json").read_text()))
    shape = TrainingShape("bfloat16", 1024, 64, 50_000, 20_000, 8, 64, 512, 4000, 2000, 16, 2 * 2**30)
    plan = training_plan(target, drafter, shape)
    dflash = plan["dflash"]["bytes"]
    assert dflash["drafter weights, gradients, AdamW (fp32)"] == 16 * sum(drafter_parameters(drafter).values())
    assert dflash["target weights (frozen)"] == 2 * sum(target_parameters(target).values())
    assert plan["opd"]["total_bytes"] > plan["dflash"]["total_bytes"]  # the teacher's logits on top
    assert 30 * 2**30 < plan["dflash"]["total_bytes"] < 80 * 2**30  # fits one 80 GB device beside its drafter
    assert plan["dflash"]["flops"] > plan["regenerate"]["flops"] > 0


def test_a_batch_that_does_not_split_over_the_processes_is_refused():
    bundle = tiny_random_bundle(seed=1)
    with pytest.raises(ValueError, match="do not split over 2 processes"):
        fit_drafter(bundle.drafter, bundle.target, [([1, 2, 3, 4], 2)], steps=1, batch=3, world=World(0, 2))


def test_nproc_relaunches_the_same_arguments_under_torchrun():
    argv = ["--target", "t", "--nproc", "2", "--prompts", "p.jsonl", "--nproc=2", "--out", "o"]
    command = torchrun_command(2, argv)
    assert command[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "adaflash.training", "--target", "t", "--prompts", "p.jsonl", "--out", "o"]
