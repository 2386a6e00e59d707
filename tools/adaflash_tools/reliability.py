"""The reliability suite: overload, killed model processes, mass cancellation, malformed input and a soak,
against a server it starts on free loopback ports (the tiny random models unless --model-dir).

    .venv/bin/python -m adaflash_tools.reliability --json bench-out/reliability.json     # make soak
    .venv/bin/python -m adaflash_tools.reliability --short --json bench-out/suite.json    # minutes

Each scenario returns its figures and `passed`; the process exits non-zero when one did not pass.
`tests/integration/test_reliability_served.py` runs the short scale of every scenario. Traffic goes to loopback only and
is bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import signal
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio

from adaflash_server.repository import RepositoryConfig, build_repository, tiny_model_dir
from adaflash_client.client import AdaFlashClient, GenerationError, GenerationParams, is_final
from adaflash_server.launcher import ServerConfig, TritonServer, free_ports, stub_pids
from adaflash_server.openai_front import FrontServer
from adaflash_tools import chaos as chaotic
from adaflash_tools import fuzz as fuzzing
from adaflash_tools.probes import (
    CANARY,
    HANG_S,
    PROMPTS,
    Outcome,
    Readiness,
    canary,
    idle_counts,
    metric_sum,
    one_stream,
    ready,
    ready_while_failing_s,
    resident_kib,
    rounded,
    scrape,
    seconds_until_idle,
    wait_for,
)

MODELS = ("target", "drafter", "adaflash")  # the model processes the faults scenario kills in turn
SCENARIOS = ("malformed", "fuzz", "huge_bodies", "cancellations", "overload", "soak", "faults", "chaos")
APART = ("chaos",)  # scenarios run on a server of their own, the drafter in a model process of its own (`chaos.py`)


@dataclass
class Scale:
    """How much of each scenario to run; `short` fits in `make test`, `full` is `make soak`."""

    max_active: int
    max_queued: int
    overload_factor: int  # concurrent users per sequence slot (max_active)
    overload_s: float
    max_tokens: int
    cancellations: int
    fault_users: int
    soak_s: float
    memory_every_s: float
    fuzz_requests: int = 200  # generated requests, half to each front door (`fuzz.py`)
    chaos_s: float = 30  # `chaos.py`: how long the load runs while processes are killed (at least chaos_min_kills)
    chaos_min_kills: int = 3
    chaos_users: int = 3
    chaos_gap_s: tuple[float, float] = (1.0, 3.0)  # the pause before a kill, after the last recovery: drawn uniformly
    chaos_warmup_s: float = 3.0


FULL = Scale(max_active=64, max_queued=256, overload_factor=4, overload_s=60, max_tokens=32, cancellations=1000,
             fault_users=8, soak_s=1800, memory_every_s=10, fuzz_requests=6000, chaos_s=1800, chaos_min_kills=10,
             chaos_users=8, chaos_gap_s=(40.0, 90.0), chaos_warmup_s=180.0)
# Both runs kill each model's process in turn: the decoding loop (`adaflash`), the forward (the loop's own where the
# target runs there), the drafter with its fallback.
SHORT = Scale(max_active=4, max_queued=16, overload_factor=4, overload_s=5, max_tokens=16, cancellations=40,
              fault_users=2, soak_s=20, memory_every_s=2)


def repository_config(scale: Scale, drafter_apart: bool = False) -> RepositoryConfig:
    return RepositoryConfig(max_active=scale.max_active, max_queued=scale.max_queued,
                            max_batch_size=max(8, scale.max_active), max_len=512, max_prompt_tokens=64,
                            max_output_tokens=256, drafter_in_orchestrator=not drafter_apart)


# Metrics ---------------------------------------------------------------------------------------------------





def histogram(text: str, name: str) -> dict[float, float]:
    """Cumulative counts by upper bound of a histogram without labels beyond `le`."""
    out: dict[float, float] = {}
    for le, v in re.findall(rf'^{name}_bucket{{[^}}]*le="([^"]+)"[^}}]*}} (\S+)$', text, re.M):
        bound = math.inf if le == "+Inf" else float(le)
        out[bound] = out.get(bound, 0.0) + float(v)
    return out


def histogram_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The upper bound of the bucket holding quantile `q` of the observations made between two scrapes."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    return next(b for b, c in zip(bounds, counts) if c >= q * counts[-1])










def percentile(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 4) if values else None


# Streams ---------------------------------------------------------------------------------------------------





def clear_refusal(error: str) -> bool:
    """An error a client can act on: the queue's limits, named."""
    return "max_queued" in error or "max_queue_wait_s" in error


# Scenario: overload ----------------------------------------------------------------------------------------

def overload(server: TritonServer, scale: Scale) -> dict:
    """`overload_factor` x max_active users, each sending its next request when the last one ended, for
    `overload_s`: every request ends complete or with a refusal naming a queue limit; the queue and the
    slots never exceed their limits; the server serves after."""
    users = scale.overload_factor * scale.max_active
    params = GenerationParams(max_tokens=scale.max_tokens, spec_mode="adaflash")
    peaks = {"queued": 0.0, "active": 0.0}
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.25):
            text = scrape(server)
            peaks["queued"] = max(peaks["queued"], metric_sum(text, "adaflash_queued_requests"))
            peaks["active"] = max(peaks["active"], metric_sum(text, "adaflash_active_sequences"))

    async def run() -> list[Outcome]:
        client = grpcaio.InferenceServerClient(server.grpc_url)
        deadline = time.monotonic() + scale.overload_s
        outcomes: list[Outcome] = []

        async def user(u: int) -> None:
            i = u
            while time.monotonic() < deadline:
                outcomes.append(await one_stream(client, PROMPTS[i % len(PROMPTS)], params))
                i += users

        try:
            await asyncio.gather(*(user(u) for u in range(users)))
        finally:
            await client.close()
        return outcomes

    before = histogram(scrape(server), "adaflash_queue_wait_seconds")
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.monotonic()
    outcomes = asyncio.run(run())
    wall = time.monotonic() - start
    sampling.set()
    sampler.join()
    after = histogram(scrape(server), "adaflash_queue_wait_seconds")
    refused = [o for o in outcomes if not o.ok and clear_refusal(o.error)]
    other = [o.error for o in outcomes if not o.ok and not clear_refusal(o.error)]
    idle_s, counts = seconds_until_idle(server)
    served_after = bool(canary(server, 4))
    return {"users": users, "max_active": scale.max_active, "max_queued": scale.max_queued,
            "seconds": round(wall, 1), "requests": len(outcomes), "completed": sum(o.ok for o in outcomes),
            "refused_naming_a_limit": len(refused), "other_errors": len(other), "other_error_examples": other[:3],
            "peak_queued": peaks["queued"], "peak_active": peaks["active"],
            "queue_wait_p50_s_at_most": histogram_quantile(before, after, 0.5),
            "queue_wait_p99_s_at_most": histogram_quantile(before, after, 0.99),
            "ttft_p50_s": percentile([o.ttft_s for o in outcomes if o.ttft_s is not None], 50),
            "ttft_p99_s": percentile([o.ttft_s for o in outcomes if o.ttft_s is not None], 99),
            "output_tokens_per_s": round(sum(o.tokens for o in outcomes) / wall, 1),
            "s_to_idle_after": idle_s, "left_after": counts,
            "passed": not other and peaks["queued"] <= scale.max_queued and peaks["active"] <= scale.max_active
            and idle_s is not None and served_after and bool(outcomes)}


# Scenario: cancellations -----------------------------------------------------------------------------------

def cancellations(server: TritonServer, scale: Scale) -> dict:
    """Half of `cancellations` cancelled mid-stream (after 1 to 5 responses, 2 x max_active at a time, so
    some wait in the queue first), half while queued behind requests holding every slot; then nothing may
    be left: no active or queued sequence, no open cache slot in the target or the drafter."""
    mid_stream, mid_queue = scale.cancellations // 2, scale.cancellations - scale.cancellations // 2
    long = GenerationParams(max_tokens=repository_config(scale).max_output_tokens, spec_mode="adaflash")

    async def streams() -> list[Outcome]:
        client = grpcaio.InferenceServerClient(server.grpc_url)
        todo = iter(range(mid_stream))
        out: list[Outcome] = []

        async def worker() -> None:
            for i in todo:
                out.append(await one_stream(client, PROMPTS[i % len(PROMPTS)], long, cancel_after=1 + i % 5))

        try:
            await asyncio.gather(*(worker() for _ in range(2 * scale.max_active)))
        finally:
            await client.close()
        return out

    async def queued() -> tuple[list[Outcome], int]:
        """Rounds: holders take every slot, queued requests are sent and cancelled before any response."""
        client = grpcaio.InferenceServerClient(server.grpc_url)
        out, unanswered, left = [], 0, mid_queue
        try:
            while left:
                # Cancelled streams leave at their next response, and a request cancelled in the queue when it
                # is admitted (docs/reliability.md): each round starts from an idle server.
                await _until(lambda: not any(idle_counts(server).values()), 60)
                n = min(left, scale.max_queued)
                release_holders, release_queued = asyncio.Event(), asyncio.Event()
                holders = [asyncio.ensure_future(one_stream(client, PROMPTS[0], long, cancel=release_holders))
                           for _ in range(scale.max_active)]
                await _until(lambda: metric_sum(scrape(server), "adaflash_active_sequences") >= scale.max_active, 30)
                waiting = [asyncio.ensure_future(one_stream(client, PROMPTS[1], long, cancel=release_queued))
                           for _ in range(n)]
                await _until(lambda: metric_sum(scrape(server), "adaflash_queued_requests") >= n, 30)
                release_queued.set()
                results = await asyncio.gather(*waiting)
                unanswered += sum(o.cancelled and o.tokens == 0 for o in results)
                release_holders.set()
                out += results + list(await asyncio.gather(*holders))
                left -= n
        finally:
            await client.close()
        return out, unanswered

    start = time.monotonic()
    streamed = asyncio.run(streams())
    in_queue, unanswered = asyncio.run(queued())
    idle_s, counts = seconds_until_idle(server)
    served_after = bool(canary(server, 4))
    errors = [o.error for o in streamed + in_queue if not o.ok]
    return {"cancelled_mid_stream": sum(o.cancelled for o in streamed),
            "completed_before_their_cancel": sum(o.ok and not o.cancelled for o in streamed),
            "cancelled_in_queue_before_any_response": unanswered,
            "requests": len(streamed) + len(in_queue), "errors": len(errors), "error_examples": errors[:3],
            "seconds": round(time.monotonic() - start, 1), "s_to_idle_after": idle_s, "left_after": counts,
            "passed": not errors and idle_s is not None and served_after and unanswered == mid_queue}


async def _until(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(condition):
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout_s} s")
        await asyncio.sleep(0.05)


# Scenario: malformed input ---------------------------------------------------------------------------------

@dataclass
class Malformed:
    """One kind of bad request: the field its refusal must name (None: no field to name, e.g. garbage), and
    how it is sent over gRPC (raw tensors) and over HTTP (a JSON body, or raw bytes)."""

    kind: str
    field: str | None
    grpc: dict | None = None  # name -> (datatype, array)
    http: dict | bytes | None = None


def _t(s: bytes) -> tuple[str, np.ndarray]:
    return "BYTES", np.array([[s]], dtype=object)


def _i(v: int, dtype: str = "INT32") -> tuple[str, np.ndarray]:
    return dtype, np.array([[v]], dtype={"INT32": np.int32, "UINT64": np.uint64, "INT64": np.int64}[dtype])


def _f(v: float) -> tuple[str, np.ndarray]:
    return "FP32", np.array([[v]], dtype=np.float32)


def malformed_corpus(limits: RepositoryConfig) -> list[Malformed]:
    ok = {"text_input": _t(b"hi"), "max_tokens": _i(8)}
    okj = {"text_input": "hi", "max_tokens": 8}

    def both(kind, field, name, grpc_value, http_value) -> Malformed:
        return Malformed(kind, field, {**ok, name: grpc_value}, {**okj, name: http_value})

    huge = "x" * (1 << 20)
    return [
        both("empty prompt", "text_input", "text_input", _t(b""), ""),
        both("prompt over max_prompt_tokens", "text_input", "text_input", _t(b"x y " * limits.max_prompt_tokens),
             "x y " * limits.max_prompt_tokens),
        both("1 MiB prompt", "text_input", "text_input", _t(huge.encode()), huge),
        Malformed("invalid UTF-8 prompt", "text_input", {**ok, "text_input": _t(b"ab\xff\xfe")},
                  b'{"text_input": "ab\xff\xfe", "max_tokens": 8}'),
        both("bad_words as a number", "bad_words", "bad_words", _i(3), 3),
        both("repetition_penalty 0", "repetition_penalty", "repetition_penalty", _f(0.0), 0.0),
        both("presence_penalty infinite", "presence_penalty", "presence_penalty", _f(float("inf")), 1e39),
        both("min_tokens negative", "min_tokens", "min_tokens", _i(-1), -1),
        both("pad_id outside the vocabulary", "pad_id", "pad_id", _i(10**8), 10**8),
        both("beam_width 4", "beam_width", "beam_width", _i(4), 4),
        both("num_return_sequences 2", "num_return_sequences", "num_return_sequences", _i(2), 2),
        both("max_tokens 0", "max_tokens", "max_tokens", _i(0), 0),
        both("max_tokens negative", "max_tokens", "max_tokens", _i(-5), -5),
        both("max_tokens over max_output_tokens", "max_tokens", "max_tokens", _i(10**9), 10**9),
        both("max_tokens as a float", "max_tokens", "max_tokens", _f(8.0), 8.5),
        both("max_tokens as text", "max_tokens", "max_tokens", _t(b"eight"), "eight"),
        both("temperature negative", "temperature", "temperature", _f(-0.5), -0.5),
        both("temperature NaN", "temperature", "temperature", _f(float("nan")), "NaN"),
        both("temperature infinite", "temperature", "temperature", _f(float("inf")), 1e39),
        both("top_p 0", "top_p", "top_p", _f(0.0), 0.0),
        both("top_p above 1", "top_p", "top_p", _f(1.5), 1.5),
        both("top_p NaN", "top_p", "top_p", _f(float("nan")), "NaN"),
        both("top_k negative", "top_k", "top_k", _i(-3), -3),
        both("top_k as a float", "top_k", "top_k", _f(2.5), 2.5),
        both("random_seed as a float", "random_seed", "random_seed", _f(1.5), 1.5),
        both("random_seed negative", "random_seed", "random_seed", _i(-1, "INT64"), -1),
        both("end_id outside the vocabulary", "end_id", "end_id", _i(10**8), 10**8),
        both("unknown spec_mode", "spec_mode", "spec_mode", _t(b"eagle"), "eagle"),
        both("max_draft negative", "max_draft", "max_draft", _i(-2), -2),
        both("stream as text", "stream", "stream", _t(b"yes"), "yes"),
        both("stop_words as a number", "stop_words", "stop_words", _i(3), 3),
        Malformed("no text_input", "text_input", {"max_tokens": _i(8)}, {"max_tokens": 8}),
        Malformed("no max_tokens", "max_tokens", {"text_input": _t(b"hi")}, {"text_input": "hi"}),
        Malformed("unknown field", "foo", {**ok, "foo": _i(1)}, {**okj, "foo": 1}),
        Malformed("a field of the TensorRT-LLM contract not implemented", "lora_task_id",
                  {**ok, "lora_task_id": ("UINT64", np.array([[3]], np.uint64))}, {**okj, "lora_task_id": 3}),
        Malformed("batch of 2 prompts", "text_input", {**ok, "text_input": ("BYTES", np.array([[b"a"], [b"b"]], object))},
                  {**okj, "text_input": ["a", "b"]}),
        Malformed("empty batch", "text_input", {**ok, "text_input": ("BYTES", np.zeros((0, 1), object))},
                  {**okj, "text_input": []}),
        Malformed("max_tokens of 3 values", "max_tokens", {**ok, "max_tokens": ("INT32", np.array([[1, 2, 3]], np.int32))},
                  {**okj, "max_tokens": [1, 2, 3]}),
        Malformed("text_input as an object", "text_input", None, {**okj, "text_input": {"a": 1}}),
        Malformed("text_input null", "text_input", None, {**okj, "text_input": None}),
        Malformed("body not JSON", None, None, b"\x00\x9f\x92\x96 binary garbage \xff" * 16),
        Malformed("JSON array body", None, None, b'[1, 2, 3]'),
        Malformed("empty body", None, None, b""),
        Malformed("truncated JSON", None, None, b'{"text_input": "hi", "max_tok'),
    ]


def send_grpc(server: TritonServer, tensors: dict, model: str = "adaflash") -> tuple[bool, str]:
    """(refused, message) for one raw request to `model` on a stream of its own."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    errors: list = []
    done = threading.Event()

    def callback(result, error) -> None:
        if error is not None or is_final(result):
            errors.append(error)
            done.set()

    try:
        client.start_stream(callback=callback)
        inputs = []
        for name, (dtype, value) in tensors.items():
            t = grpcclient.InferInput(name, list(value.shape), dtype)
            t.set_data_from_numpy(value)
            inputs.append(t)
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        if not done.wait(HANG_S):
            return False, "no answer"
    except Exception as exc:  # noqa: BLE001 - tritonclient refusing to send is a refusal too
        return True, f"{type(exc).__name__}: {exc}"
    finally:
        client.stop_stream()
        client.close()
    error = errors[0]
    return (True, error.message()) if error is not None else (False, "accepted")


def send_http(server: TritonServer, body: dict | bytes) -> tuple[int, str]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"{server.http_url}/v2/models/adaflash/generate", data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=HANG_S) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def garbage_on_the_grpc_port(server: TritonServer) -> bool:
    """Random bytes where an HTTP/2 preface belongs; the server must drop the connection and serve on."""
    host, port = server.grpc_url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(random.Random(0).randbytes(4096))
        try:
            s.recv(1024)
        except OSError:
            pass
    return ready(server)


def malformed(server: TritonServer, scale: Scale) -> dict:
    """Every kind of bad request over both protocols: refused (gRPC error, HTTP 4xx) with the field named
    where there is one, and the server serves after each."""
    rows = []
    for case in malformed_corpus(repository_config(scale)):
        if case.grpc is not None:
            refused, message = send_grpc(server, case.grpc)
            rows.append(_malformed_row(case, "grpc", refused, None, message))
        if case.http is not None:
            status, body = send_http(server, case.http)
            rows.append(_malformed_row(case, "http", status >= 400, status, body))
    survived = garbage_on_the_grpc_port(server)
    rows.append({"kind": "random bytes on the gRPC port", "protocol": "grpc", "field": None, "refused": True,
                 "names_field": True, "message": "", "passed": survived})
    served_after = bool(canary(server, 4))
    failing = [r for r in rows if not r["passed"]]
    return {"kinds": len({r["kind"] for r in rows}), "requests": len(rows), "failing": failing,
            "rows": rows, "passed": not failing and served_after}


def fuzz(server: TritonServer, scale: Scale) -> dict:
    """Generated requests to both front doors (`fuzz.py`): none hangs, none is a server error, nothing is leaked
    after, and the server serves as before. The OpenAI front runs here, on a free port."""
    front = FrontServer(server.grpc_url, "127.0.0.1", free_ports(1)[0]).start()
    try:
        result = fuzzing.run(front.url, lambda tensors: send_grpc(server, tensors), scale.fuzz_requests)
    finally:
        front.stop()
    idle_s, counts = seconds_until_idle(server)
    served_after = bool(canary(server, 4))
    return result | {"idle_after_s": idle_s, "idle_counts": counts, "served_after": served_after,
                     "passed": not result["failing"] and idle_s is not None and served_after}


def huge_bodies(server: TritonServer, scale: Scale) -> dict:
    """Bodies far over the OpenAI endpoint's limit (one of 20 MB; twenty of 1 MB at once) while a 16-token completion
    runs on a connection of its own: each refused with 413, the completion answered meanwhile. The seconds are
    figures for the report (the machine's load moves them), not pass criteria."""
    front = FrontServer(server.grpc_url, "127.0.0.1", free_ports(1)[0], max_request_bytes=512 * 1024).start()
    try:
        model = fuzzing.served_name(front.url)
        small = json.dumps({"model": model, "prompt": "hello", "max_tokens": 16, "temperature": 0}).encode()
        fuzzing.send_openai(front.url, "completions", small)  # the first call's set-up
        alone = []
        for _ in range(3):
            started = time.monotonic()
            fuzzing.send_openai(front.url, "completions", small)
            alone.append(time.monotonic() - started)
        cases = {"one 20 MB body": [20_000_000], "twenty 1 MB bodies at once": [1_000_000] * 20}
        rows = {name: _refused_beside_a_completion(front.url, model, sizes, small) for name, sizes in cases.items()}
    finally:
        front.stop()
    served_after = bool(canary(server, 4))
    passed = served_after and all(r["refused_413"] == r["bodies"] and r["completion_status"] == 200
                                  for r in rows.values())
    return {"completion_alone_s": round(sorted(alone)[1], 3), "cases": rows, "served_after": served_after,
            "passed": passed}


def _refused_beside_a_completion(url: str, model: str, sizes: list[int], small: bytes) -> dict:
    def timed(body: bytes) -> tuple[int | None, float]:
        started = time.monotonic()
        status, _ = fuzzing.send_openai(url, "completions", body)
        return status, time.monotonic() - started

    bodies = [json.dumps({"model": model, "prompt": "x" * size, "max_tokens": 16}).encode() for size in sizes]
    with ThreadPoolExecutor(len(bodies) + 1) as pool:
        refusals = [pool.submit(timed, body) for body in bodies]
        time.sleep(0.05)
        completion = pool.submit(timed, small).result()
        refused = [f.result() for f in refusals]
    return {"bodies": len(bodies), "refused_413": sum(status == 413 for status, _ in refused),
            "slowest_refusal_s": round(max(s for _, s in refused), 3), "completion_status": completion[0],
            "completion_s": round(completion[1], 3)}


def _malformed_row(case: Malformed, protocol: str, refused: bool, status: int | None, message: str) -> dict:
    """Our models refuse with `INVALID_ARGUMENT: <field>: ...` (HTTP 400). Triton refuses some requests
    before any model sees them: a wrong data type or shape over gRPC (naming the input), and over HTTP a
    body it cannot parse or a JSON value of the wrong type, with status 500 and a message naming the parse
    failure, not the field (Triton 2.51's HTTP frontend; docs/reliability.md). Those must be refused."""
    by_models = "INVALID_ARGUMENT:" in message
    names = case.field is None or case.field in message
    ok = (400 <= status < 500 if status is not None else refused) and names if by_models else refused
    return {"kind": case.kind, "protocol": protocol, "field": case.field, "status": status, "refused": refused,
            "refused_by": "models" if by_models else "triton", "names_field": names, "message": message[:200],
            "passed": ok}


# Scenario: faults ------------------------------------------------------------------------------------------

class Traffic(threading.Thread):
    """Short greedy requests back to back; records when each ended and how."""

    def __init__(self, server: TritonServer) -> None:
        super().__init__(daemon=True)
        self.server, self.stopped, self.outcomes = server, threading.Event(), []

    def run(self) -> None:
        with AdaFlashClient(self.server.grpc_url, timeout_s=HANG_S) as client:
            while not self.stopped.is_set():
                try:
                    client.generate(CANARY, GenerationParams(max_tokens=8, spec_mode="adaflash"))
                    self.outcomes.append(Outcome(True, time.monotonic()))
                except GenerationError as error:
                    self.outcomes.append(Outcome(False, time.monotonic(), str(error)))
                    time.sleep(0.05)






def kill_and_recover(server: TritonServer, model: str, users: int) -> dict:
    before = canary(server, 8)
    traffic = [Traffic(server) for _ in range(users)]
    readiness = Readiness(server)
    for t in traffic:
        t.start()
    readiness.start()
    wait_for(lambda: any(o.ok for t in traffic for o in t.outcomes), HANG_S)
    killed = stub_pids(server.pid)[model][0]
    t0 = time.monotonic()
    os.kill(killed, signal.SIGKILL)
    not_ready = wait_for(lambda: not ready(server), 5.0)
    back = wait_for(lambda: ready(server) and server.pid is not None
                    and killed not in stub_pids(server.pid).get(model, [killed]), 180)
    served = wait_for(lambda: any(o.ok and o.ended > t0 + (back or 0) for t in traffic for o in t.outcomes), 60)
    for t in traffic:
        t.stopped.set()
    for t in traffic:
        t.join(HANG_S + 10)
    readiness.stopped.set()
    readiness.join()
    after = [o for t in traffic for o in t.outcomes if o.ended > t0]
    hung = [o for o in after if "DEADLINE_EXCEEDED" in o.error]
    window = ready_while_failing_s(readiness.polls, [o.ended for o in after if not o.ok], t0)
    same = canary(server, 8) == before
    return {"model": model, "s_to_not_ready": rounded(not_ready), "s_to_ready_again": rounded(back),
            "s_to_first_success_after_ready": rounded(served), "requests_after_kill": len(after),
            "failed_after_kill": sum(not o.ok for o in after), "hung": len(hung),
            "error_examples": sorted({o.error[:160] for o in after if not o.ok})[:2],
            "longest_ready_while_failing_s": window, "canary_unchanged": same,
            "passed": back is not None and served is not None and not hung and window <= 5.0 and same
            and (not_ready is not None or model == "drafter")
            and (model != "drafter" or all(o.ok for o in after))}  # without the drafter: plain decoding


def faults(server: TritonServer, scale: Scale) -> dict:
    """SIGKILL of each model process in turn under `fault_users` clients sending requests back to back; a model
    this repository does not run (`target` or `drafter`, when it runs in the orchestrator's process) is listed absent."""
    present = stub_pids(server.pid)
    rows = [kill_and_recover(server, m, scale.fault_users) for m in MODELS if m in present]
    return {"users": scale.fault_users, "rows": rows, "absent": [m for m in MODELS if m not in present],
            "passed": bool(rows) and all(r["passed"] for r in rows)}






# Scenario: soak --------------------------------------------------------------------------------------------



def soak(server: TritonServer, scale: Scale) -> dict:
    """70% of the sequence slots kept busy for `soak_s` by closed-loop users (each sends its next request
    when the last one ended), sampling every process's resident memory. Passes with 0 errors, every
    process's memory within 5% of its value after the warm-up (the first tenth), and the canary answered
    the same at the start and the end. The whole memory series is kept: growth at the end alone does not tell
    a leak (growing on) from an allocator settling (levelling off)."""
    users = max(1, round(0.7 * scale.max_active))
    params = GenerationParams(max_tokens=scale.max_tokens, spec_mode="adaflash")
    first = canary(server, 32)
    samples: list[tuple[float, dict[str, int]]] = []

    async def closed_loop() -> list[Outcome]:
        client = grpcaio.InferenceServerClient(server.grpc_url)
        start = time.monotonic()
        deadline, done = start + scale.soak_s, []

        async def user(u: int) -> None:
            i = u
            while time.monotonic() < deadline:
                done.append(await one_stream(client, PROMPTS[i % len(PROMPTS)], params))
                i += users

        async def sample() -> None:
            while time.monotonic() < deadline:
                samples.append((time.monotonic() - start, await asyncio.to_thread(resident_kib, server)))
                await asyncio.sleep(scale.memory_every_s)

        try:
            await asyncio.gather(sample(), *(user(u) for u in range(users)))
            samples.append((time.monotonic() - start, await asyncio.to_thread(resident_kib, server)))
        finally:
            await client.close()
        return done

    start = time.monotonic()
    outcomes = asyncio.run(closed_loop())
    wall = time.monotonic() - start
    last = canary(server, 32)
    growth = memory_growth(samples, warmup_s=scale.soak_s / 10)
    errors = [o.error for o in outcomes if not o.ok]
    return {"users": users, "seconds": round(wall, 1), "requests": len(outcomes),
            "requests_per_s": round(len(outcomes) / wall, 2), "errors": len(errors), "error_examples": errors[:3],
            "ttft_p50_s": percentile([o.ttft_s for o in outcomes if o.ttft_s], 50),
            "ttft_p99_s": percentile([o.ttft_s for o in outcomes if o.ttft_s], 99),
            "memory_kib_after_warmup_and_at_end": growth, "memory_samples": len(samples),
            "memory_kib_series": [[round(t, 1), kib] for t, kib in samples],
            "max_memory_growth": max((g["growth"] for g in growth.values()), default=None),
            "canary_unchanged": first == last,
            "passed": not errors and first == last and bool(growth) and all(g["growth"] < 0.05 for g in growth.values())}


def memory_growth(samples: list[tuple[float, dict[str, int]]], warmup_s: float) -> dict[str, dict]:
    """Per process: resident memory at the first sample after the warm-up, at the end, and the growth."""
    after = [s for t, s in samples if t >= warmup_s]
    if len(after) < 2:
        return {}
    first, last = after[0], after[-1]
    return {name: {"after_warmup": first[name], "end": last[name], "growth": round(last[name] / first[name] - 1, 4)}
            for name in first if name in last}


# Running the suite -----------------------------------------------------------------------------------------

def chaos(server: TritonServer, scale: Scale) -> dict:
    """Random kills of every process kind under a mixed load on both front doors (`chaos.py`); its server is one of
    its own (`APART`)."""
    return chaotic.run(server, chaotic.Settings(scale.chaos_s, scale.chaos_min_kills, scale.chaos_users,
                                                scale.chaos_gap_s, scale.chaos_warmup_s, scale.max_tokens))


SCENARIO_FUNCTIONS: dict[str, Callable[[TritonServer, Scale], dict]] = {
    "malformed": malformed, "fuzz": fuzz, "huge_bodies": huge_bodies, "cancellations": cancellations,
    "overload": overload, "soak": soak, "faults": faults, "chaos": chaos}


@dataclass
class Report:
    scale: str
    model_dir: str
    config: dict
    cpu_count: int | None = os.cpu_count()
    scenarios: dict[str, dict] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(s["passed"] for s in self.scenarios.values())


def start_server(root: Path, scale: Scale, model_dir: Path | None, drafter_apart: bool = False) -> TritonServer:
    repo = build_repository(root / "model_repository", model_dir or tiny_model_dir(root), "drafter",
                            repository_config(scale, drafter_apart))
    return TritonServer(ServerConfig(model_repository=repo, state_dir=root / "server")).start()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, help="target/ and drafter/ (default: the tiny random models)")
    p.add_argument("--short", action="store_true", help="the scale `make test` runs (minutes, not an hour)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}")
    p.add_argument("--soak-s", type=float, help="override the soak's duration")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--update", action="store_true", help="keep the other scenarios' results already in --json")
    p.add_argument("--work", type=Path, help="the repository, tiny models and the server's log (default: a temporary "
                                             "folder, removed after)")
    args = p.parse_args(argv)
    scale = SHORT if args.short else FULL
    if args.soak_s is not None:
        scale = Scale(**{**asdict(scale), "soak_s": args.soak_s})
    report = Report("short" if args.short else "full", str(args.model_dir or "tiny-random"), asdict(scale))
    if args.update and args.json.exists():
        report.scenarios = json.loads(args.json.read_text())["scenarios"]
    names = args.scenarios.split(",")
    with tempfile.TemporaryDirectory(prefix="adaflash-reliability-") as tmp:
        root = args.work or Path(tmp)
        for apart in (False, True):
            todo = [n for n in names if (n in APART) == apart]
            if not todo:
                continue
            server = start_server(root / ("apart" if apart else "shared"), scale, args.model_dir, drafter_apart=apart)
            try:
                for name in todo:
                    run_scenario(report, name, server, scale, args.json)
            finally:
                server.stop()
    return 0 if report.passed else 1


def run_scenario(report: Report, name: str, server: TritonServer, scale: Scale, out: Path) -> None:
    """One scenario, its summary printed and the report written after it (a long run's results survive its end)."""
    print(f"{name} ...", flush=True)
    report.scenarios[name] = SCENARIO_FUNCTIONS[name](server, scale) | {"run_at": time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    summary = {k: v for k, v in report.scenarios[name].items() if k not in ("rows", "failing")}
    print(f"{name}: {json.dumps(summary)}", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(asdict(report) | {"passed": report.passed}, indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
