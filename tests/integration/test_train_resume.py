"""`adaflash train` in processes of its own: a run killed (SIGKILL) in the middle of a stage resumes to the drafter an
uninterrupted run ends with, bit for bit; under torchrun with two processes (gloo, CPU) and the same global batch
and seed, every logged loss matches one process's within LOSS_TOLERANCE and so does held-out tau."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_train_command import toy_prompts, toy_target, train_args

# Relative to the loss: two processes sum each step's gradient in another order (DDP's all-reduce), so the weights
# part by float rounding (measured: ~1e-7 after the DFlash stage, ~1e-6 after distillation), never by a step.
LOSS_TOLERANCE = 1e-4
TAU_TOLERANCE = 0.02
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # the same kernels' threads in every run (torchrun's default too)
TRAIN = [sys.executable, "-m", "adaflash.training"]
ADAFLASH = str(Path(sys.executable).parent / "adaflash")


def losses(work: Path) -> dict[str, list[float]]:
    """Every training stage's logged losses, by metrics file."""
    files = ["dflash/metrics.jsonl", "opd/round-1/metrics.jsonl", "opd/round-2/metrics.jsonl", "heads/metrics.jsonl"]
    return {f: [json.loads(line)["loss"] for line in (work / f).read_text().splitlines()] for f in files}


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict:
    """One process, start to end without a stop."""
    root = tmp_path_factory.mktemp("straight")
    target, prompts = toy_target(root), toy_prompts(root / "prompts.jsonl")
    subprocess.run([*TRAIN, *train_args(target, prompts, root / "drafter", root / "work")], env=ENV, check=True,
                   timeout=600)
    return {"root": root, "target": target, "prompts": prompts}


def kill_in_the_middle_of_a_stage(args: list[str], work: Path) -> None:
    """Start a run and SIGKILL it once the DFlash stage wrote its first checkpoint, before that stage ends."""
    stage = work / "dflash"
    proc = subprocess.Popen(args, env=ENV)
    try:
        deadline = time.monotonic() + 300
        while not (stage / "checkpoint.pt").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        proc.kill()  # SIGKILL: no handler, no flush
        proc.wait()
    assert (stage / "checkpoint.pt").exists() and not (stage / "done.json").exists(), "not killed mid-stage"


def assert_close(work: Path, reference: Path) -> float:
    """Every logged loss within LOSS_TOLERANCE of the reference run's, held-out tau within TAU_TOLERANCE; returns
    the largest relative loss difference."""
    got, want = losses(work), losses(reference)
    worst = 0.0
    for name, curve in want.items():
        assert len(got[name]) == len(curve), name
        for a, b in zip(curve, got[name]):
            worst = max(worst, abs(a - b) / max(1.0, abs(a)))
    assert worst <= LOSS_TOLERANCE
    tau = json.loads((work / "report.json").read_text())["tau"]
    for point, figures in json.loads((reference / "report.json").read_text())["tau"].items():
        for domain, value in figures.items():
            assert abs(tau[point][domain] - value) <= TAU_TOLERANCE, (point, domain)
    return worst


def test_a_run_killed_in_the_middle_of_a_stage_resumes_to_the_same_drafter(straight, tmp_path):
    args = [*TRAIN, *train_args(straight["target"], straight["prompts"], tmp_path / "drafter", tmp_path / "work")]
    kill_in_the_middle_of_a_stage(args, tmp_path / "work")
    subprocess.run(args, env=ENV, check=True, timeout=600)
    for name in ("model.safetensors", "adaflash/heads.safetensors"):
        assert (tmp_path / "drafter" / name).read_bytes() == (straight["root"] / "drafter" / name).read_bytes(), name
    assert losses(tmp_path / "work") == losses(straight["root"] / "work")
    resumed = json.loads((tmp_path / "work" / "report.json").read_text())
    assert resumed["tau"] == json.loads((straight["root"] / "work" / "report.json").read_text())["tau"]


def test_a_run_killed_at_one_process_resumes_at_two(straight, tmp_path):
    """The checkpoint holds no trace of the world size: the same global batch goes on over two processes."""
    args = train_args(straight["target"], straight["prompts"], tmp_path / "drafter", tmp_path / "work")
    kill_in_the_middle_of_a_stage([*TRAIN, *args], tmp_path / "work")
    subprocess.run([ADAFLASH, "train", "--nproc", "2", *args], env=ENV, check=True, timeout=600)
    print(f"largest relative loss difference, resumed at 2 processes against 1: "
          f"{assert_close(tmp_path / 'work', straight['root'] / 'work'):.2e}")


def test_two_processes_under_torchrun_train_as_one_does(straight, tmp_path):
    """`adaflash train --nproc 2` (which starts torchrun) against the one-process run, same global batch and seed."""
    args = train_args(straight["target"], straight["prompts"], tmp_path / "drafter", tmp_path / "work")
    subprocess.run([ADAFLASH, "train", "--nproc", "2", *args], env=ENV, check=True, timeout=600)
    assert json.loads((tmp_path / "work" / "report.json").read_text())["world_size"] == 2
    print(f"largest relative loss difference, 2 processes against 1: "
          f"{assert_close(tmp_path / 'work', straight['root'] / 'work'):.2e}")
