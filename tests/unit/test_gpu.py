"""On a CUDA GPU (`make gpu-check`; skipped elsewhere): the models and the engine on the device in bf16 (a
served repository: tests/integration/test_gpu_served.py). The rest of the suite runs on the CPU (conftest.py hides
GPUs from it), so its fp32 references stay exact."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from helpers import DeviceLog, clone_target, modes_equal_up_to_ties, random_prompts
from test_graphs import PAGING_IDS, PAGINGS, check_padded_drafts, check_padded_steps, drafter_twins

from adaflash.cli_args import DEFAULT_MODEL_DIR
from adaflash.decoding.engine import Engine
from adaflash_contract.modes import MODE_NAMES
from adaflash.decoding.sampling import SamplingParams
from adaflash.decoding.policy import VECTOR_ROWS
from adaflash.decoding.sequence import Request
from adaflash.models.bundle import load_bundle, tiny_random_bundle
from adaflash.models.placement import move_to, placement

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu-check)")
CUDA = placement("cuda", "bfloat16") if torch.cuda.is_available() else None
DEFAULT_MODELS = Path(__file__).resolve().parents[2] / DEFAULT_MODEL_DIR


def _on_cuda(bundle):
    return move_to(bundle.target, CUDA), move_to(bundle.drafter, CUDA)


def test_forwards_on_cuda_make_every_tensor_there() -> None:
    target, drafter = _on_cuda(tiny_random_bundle(seed=0))
    cache, context = target.new_cache(3, 64), drafter.new_cache(3, 64)
    log = DeviceLog()
    with log:
        out = target.forward(cache, [0, 1, 2], [[1, 2, 3, 4], [5, 6], [7]], capture_layers=[1, 2])
        target.forward(cache, [0, 1], [[8, 9, 10], [11, 12, 13]])
        drafter.append_context(context, [0, 1, 2], out.hidden, [4, 2, 1])
        drafter.draft(target, context, [0, 2], [3, 4], 8)
    assert {d.type for d in log.devices} == {"cuda"}, {str(d): ops[:5] for d, ops in log.devices.items()}


@pytest.mark.parametrize("paging", PAGINGS, ids=PAGING_IDS)
def test_steps_replayed_as_cuda_graphs_match_the_eager_forward(trained_tiny, paging) -> None:
    """fp32, so that the two paths differ by the kernels' rounding only (a padded step's shapes pick other
    kernels); every step of a shape after its first is a replay."""
    fp32 = placement("cuda", "float32")
    graphed, eager = (move_to(clone_target(trained_tiny.target), fp32) for _ in range(2))
    eager.step_graphs = False
    recorder = check_padded_steps(graphed, eager, paging, tolerance=1e-3)
    assert not recorder.failures and all(r.graph is not None for r in recorder.replays.values())


@pytest.mark.parametrize("paging", PAGINGS, ids=PAGING_IDS)
def test_drafts_replayed_as_cuda_graphs_match_the_eager_draft(trained_tiny, paging) -> None:
    fp32 = placement("cuda", "float32")
    target = move_to(clone_target(trained_tiny.target), fp32)
    graphed, eager = (move_to(d, fp32) for d in drafter_twins(trained_tiny, heads=True))
    recorder = check_padded_drafts(target, graphed, eager, paging, tolerance=1e-3)
    assert not recorder.failures and all(r.graph is not None for r in recorder.replays.values())


def test_every_mode_on_cuda_matches_plain_decoding_up_to_rounding_ties(trained_tiny) -> None:
    target, drafter = _on_cuda(trained_tiny)
    equal = modes_equal_up_to_ties(target, drafter, random_prompts(8, seed=5), 32, tolerance=0.03)
    assert equal > 0


@pytest.mark.skipif(not (DEFAULT_MODELS / "drafter" / "config.json").exists(), reason="models/default not built")
@pytest.mark.parametrize("sequences", [1, VECTOR_ROWS + 4])
def test_the_default_models_heads_plan_on_cuda(sequences: int) -> None:
    """The default drafter has the length heads, whose rates the planner reads on the host: one sequence plans in
    Python floats, VECTOR_ROWS and more in numpy (the first GPU run found a device tensor handed to numpy there)."""
    bundle = load_bundle(DEFAULT_MODELS, "drafter", CUDA)
    prompts = [bundle.tokenizer.encode(f"def f{i}(x):\n    return x * {i} + f{i}(").ids for i in range(sequences)]
    equal = modes_equal_up_to_ties(bundle.target, bundle.drafter, prompts, 48, tolerance=0.03)
    assert equal > 0


def test_sampled_decoding_with_every_processor_runs_on_cuda_and_a_seed_repeats(trained_tiny) -> None:
    """Temperature, top-k/top-p, penalties, min_tokens, bad words and log-probs in every mode on the device: the
    processors index device logits with tokens from the host, and the draws happen on a CPU generator. A seed
    repeats its tokens in `ar` (the speculative modes' draws follow their draft lengths, which adaflash times)."""
    target, drafter = _on_cuda(trained_tiny)
    engine = Engine(target, drafter, num_slots=4, max_len=256)
    sp = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=7, repetition_penalty=1.1, presence_penalty=0.2,
                        frequency_penalty=0.1, min_tokens=8, end_ids=(0,), bad_words=((5,), (3, 4)), log_probs=True)
    prompts = random_prompts(4, seed=9)
    for mode in MODE_NAMES:
        for seq in engine.generate([Request(p, 24, mode=mode, sampling=sp) for p in prompts], concurrency=4):
            assert 5 not in seq.output and len(seq.output) >= 8 and len(seq.log_probs) == len(seq.output), mode
    again = [[s.output for s in engine.generate([Request(p, 24, sampling=sp) for p in prompts], concurrency=4)]
             for _ in range(2)]
    assert again[0] == again[1]


@pytest.mark.skipif(not os.environ.get("ADAFLASH_GPU_MODEL_DIR"), reason="no real checkpoints named")
def test_real_checkpoints_load_and_decode_on_cuda() -> None:
    """ADAFLASH_GPU_MODEL_DIR: a model folder (target/ and drafter/, e.g. Qwen3-8B and its DFlash drafter)."""
    bundle = load_bundle(os.environ["ADAFLASH_GPU_MODEL_DIR"], "drafter", CUDA)
    ids = [bundle.tokenizer.encode("Write a Python function that reverses a string.").ids]
    equal = modes_equal_up_to_ties(bundle.target, bundle.drafter, ids, 64, tolerance=0.03)
    assert equal > 0
