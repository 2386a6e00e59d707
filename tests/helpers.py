"""Helpers the test modules share (fixtures live in conftest.py): seeded prompts, the target's own
continuations, a fixed cost model, an independent copy of a target, polling with a deadline, and a model process
killed under a running stream."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from adaflash.decoding.costs import CostModel
from adaflash.decoding.engine import Engine
from adaflash.decoding.sampling import SamplingParams
from adaflash.decoding.sequence import Request
from adaflash.evaluation.bench import departure_gap
from adaflash.models.target import Transformer


BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


def load_script(path: Path):
    """A script (a benchmark, not a package module) loaded from its file, under a name of its own."""
    spec = importlib.util.spec_from_file_location(f"{path.stem}_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_prompts(n: int, seed: int, vocab: int = 256, min_len: int = 4, max_len: int = 30) -> list[list[int]]:
    """`n` seeded random prompts of ids < `vocab`, lengths in [min_len, max_len]."""
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(n):
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        prompts.append(torch.randint(0, vocab, (length,), generator=g).tolist())
    return prompts


def self_generated(target: Transformer, prompts: list[list[int]], max_tokens: int,
                   sampling: SamplingParams = SamplingParams(), concurrency: int = 16) -> list[tuple[list[int], int]]:
    """(tokens, response_start) pairs of the target's own `ar` continuations, for drafter training."""
    engine = Engine(target, None, num_slots=concurrency, max_len=max(len(p) for p in prompts) + max_tokens + 32)
    reqs = [Request(prompt_ids=p, max_tokens=max_tokens, mode="ar", sampling=sampling) for p in prompts]
    seqs = engine.generate(reqs, concurrency=concurrency)
    return [(seq.tokens, len(p)) for seq, p in zip(seqs, prompts)]


def fixed_costs(num_slots: int = 16) -> CostModel:
    """A deterministic cost model shaped like the CPU measurements: a fixed forward overhead plus a small
    per-token cost, and a full-block drafter forward about half a verify, cheaper for shorter blocks.
    Keeps the adaflash choices reproducible."""
    sizes = [b for b in (1, 2, 4, 8, 16) if b <= num_slots]
    verify = {b: [(b * k, 2.0 + 0.012 * b * k) for k in (1, 2, 4, 8, 16)] for b in sizes}
    draft = {b: [(n, 0.5 + (0.7 + 0.1 * b) * n / 16) for n in (2, 4, 8, 16)] for b in sizes}
    return CostModel(verify=verify, draft=draft)


def cheap_drafter_costs(num_slots: int = 16) -> CostModel:
    """`fixed_costs` with a drafter that costs next to nothing: drafting pays wherever a drafted token may be
    accepted, so adaflash drafts on nearly every step, whatever a tiny drafter's acceptance (its probes alone, where
    drafting does not pay, find accepted tokens only by chance)."""
    cost = fixed_costs(num_slots)
    cost.draft = {b: [(n, 0.001) for n, _ in points] for b, points in cost.draft.items()}
    return cost


def clone_target(target: Transformer) -> Transformer:
    """A separate target with the same weights (its own cache), for independent references."""
    twin = Transformer(target.config)
    twin.load_state_dict(target.state_dict())
    return twin.eval()


def wait_until(condition: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    """Poll `condition` until it is true; fail naming `what` after `timeout_s`, so a stuck server or
    a dead worker thread fails the test instead of hanging it."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


Sample = tuple[str, dict[str, str], float]  # a Prometheus sample: name, labels, value


def scrape(metrics_url: str) -> list[Sample]:
    """Every sample on a server's Prometheus page."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    return [(name, dict(re.findall(r'(\w+)="([^"]*)"', labels)), float(value))
            for name, labels, value in re.findall(r"^([A-Za-z_:][\w:]*)(?:\{([^}]*)\})? (\S+)$", text, re.M)]


def metric_total(samples: list[Sample], name: str, **labels: str) -> float:
    """The sum of `name`'s series whose labels include `labels`."""
    return sum(value for n, have, value in samples if n == name and labels.items() <= have.items())


def metric_by(samples: list[Sample], name: str, label: str, **labels: str) -> dict[str, float]:
    """`metric_total` per value of `label`."""
    out: dict[str, float] = {}
    for n, have, value in samples:
        if n == name and label in have and labels.items() <= have.items():
            out[have[label]] = out.get(have[label], 0.0) + value
    return out


def modes_equal_up_to_ties(target: Transformer, drafter, prompts: list[list[int]], max_tokens: int,
                           tolerance: float) -> int:
    """Run every mode on `prompts` and check each output equals plain decoding's, or first departs from it at a
    near-tie (`departure_gap` at most `tolerance`). Returns how many outputs were equal."""
    from adaflash_contract.modes import MODE_NAMES

    engine = Engine(target, drafter, num_slots=len(prompts), max_len=max(map(len, prompts)) + max_tokens + 20,
                    cost_model=fixed_costs(len(prompts)))
    outputs = {mode: [s.output for s in engine.generate([Request(p, max_tokens, mode=mode, stop_ids=())
                                                          for p in prompts], concurrency=len(prompts))]
               for mode in MODE_NAMES}
    equal = 0
    for mode in MODE_NAMES:
        for prompt, ref, got in zip(prompts, outputs["ar"], outputs[mode]):
            gap = departure_gap(target, prompt, ref, got)
            assert gap <= tolerance, f"{mode} departs from ar with a logit gap of {gap}"
            equal += got == ref
    return equal


# A one-model repository for tests of the launcher and deployment: the Python backend echoes its input.
ECHO_CONFIG = """\
name: "echo"
backend: "python"
max_batch_size: 0
input [ { name: "IN", data_type: TYPE_INT32, dims: [ -1 ] } ]
output [ { name: "OUT", data_type: TYPE_INT32, dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
"""

ECHO_MODEL = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests
        ]
"""


def echo_repository(root: Path, config: str = ECHO_CONFIG, model: str = ECHO_MODEL) -> Path:
    """A model repository with one Python-backend model, `echo`, version 1."""
    (root / "echo" / "1").mkdir(parents=True)
    (root / "echo" / "config.pbtxt").write_text(config)
    (root / "echo" / "1" / "model.py").write_text(model)
    return root


class DeviceLog(TorchFunctionMode):
    """Every device a torch call's tensor outputs land on while the mode is active, pinned host memory aside
    (the staging block of a copy to the GPU that does not wait: `placement.indices`). A function mode, not a
    dispatch mode: under a dispatch mode PyTorch cannot make the lower-right causal bias (a Tensor subclass) that
    the fused CUDA attention path uses."""

    def __init__(self) -> None:
        super().__init__()
        self.devices: dict[torch.device, list[str]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and not (t.device.type == "cpu" and t.is_pinned()):
                self.devices.setdefault(t.device, []).append(str(func))
        return out


def joined_product_in(layout, rows: int):
    """A 512 x 128 linear with bias through `Joined`: checks that `rows` rows take `layout` and give the plain
    product; returns the holder module, its linear, the Joined and the rows for the caller's own checks."""
    from torch import nn

    from adaflash.models.layers import Joined, layout_for

    lin = nn.Linear(128, 512)
    holder = nn.Module()
    holder.proj = lin
    joined, x = Joined(["proj.weight"]), torch.randn(rows, 128)
    with torch.inference_mode():
        assert layout_for(x, lin.weight) is layout
        assert torch.allclose(joined.linear(holder, x, lin.bias), lin(x), atol=1e-5)
    return holder, lin, joined, x


def kill_mid_stream(server, model: str) -> list:
    """Start a long `ar` stream, SIGKILL `model`'s process once its first token came, and wait (a deadline) for the
    stream to end; returns the errors it ended with."""
    from adaflash_client import AdaFlashClient, GenerationError, GenerationParams
    from adaflash_server.launcher import stub_pids

    errors: list[GenerationError] = []
    started = threading.Event()

    def long_stream() -> None:
        with AdaFlashClient(server.grpc_url, timeout_s=90) as client:
            try:
                for _ in client.stream("a long one", GenerationParams(max_tokens=250, spec_mode="ar")):
                    started.set()
            except GenerationError as error:
                errors.append(error)

    worker = threading.Thread(target=long_stream, daemon=True)
    worker.start()
    assert started.wait(60), "no first token"
    os.kill(stub_pids(server.pid)[model][0], signal.SIGKILL)
    worker.join(90)
    assert not worker.is_alive(), f"the request running when {model} died never ended"
    return errors
