"""What the reliability scenarios observe a server by, shared by the suite (`reliability.py`) and the chaos scenario
(`chaos.py`): its readiness, its metrics, a greedy canary, a request's outcome on a gRPC stream, its processes'
resident memory, and waits with deadlines."""

from __future__ import annotations

import asyncio
import bisect
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tritonclient.grpc.aio as grpcaio

from adaflash_client.client import AdaFlashClient, GenerationParams, build_inputs, is_final, parse_chunk
from adaflash_server.launcher import TritonServer, stub_pids

CANARY = "The canary: greedy, the same answer every time."


PROMPTS = [f"Request {i}: {w}" for i, w in enumerate(
    ["def fibonacci(n):", "Translate to French: good morning", "Summarise: the cat sat on the mat.",
     "Q: what is 17 * 23? A:", "import numpy as np\n", "Once upon a time", "SELECT name FROM", "1, 2, 3, 5, 8,"])]


HANG_S = 120.0  # a request still open after this long is counted as hung


POLL_S = 0.02


def scrape(server: TritonServer) -> str:
    return urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()


def metric_sum(text: str, name: str) -> float:
    """The sum of a family's series (0 when it has none yet)."""
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def idle_counts(server: TritonServer) -> dict[str, float]:
    """What must be back to 0 when no request runs: sequences, queued requests, open cache slots."""
    text = scrape(server)
    return {"active_sequences": metric_sum(text, "adaflash_active_sequences"),
            "queued_requests": metric_sum(text, "adaflash_queued_requests"),
            "open_slots": metric_sum(text, "adaflash_open_slots")}


def seconds_until_idle(server: TritonServer, timeout_s: float = 60.0) -> tuple[float | None, dict[str, float]]:
    start = time.monotonic()
    while True:
        counts = idle_counts(server)
        if not any(counts.values()):
            return round(time.monotonic() - start, 2), counts
        if time.monotonic() - start > timeout_s:
            return None, counts
        time.sleep(0.1)


def ready(server: TritonServer) -> bool:
    try:
        return urllib.request.urlopen(f"{server.http_url}/v2/health/ready", timeout=2).status == 200
    except (urllib.error.URLError, OSError):
        return False


def canary(server: TritonServer, max_tokens: int) -> str:
    with AdaFlashClient(server.grpc_url, timeout_s=HANG_S) as client:
        return client.generate(CANARY, GenerationParams(max_tokens=max_tokens, spec_mode="ar")).text


@dataclass
class Outcome:
    ok: bool
    ended: float  # time.monotonic()
    error: str = ""
    ttft_s: float | None = None
    tokens: int = 0
    cancelled: bool = False


async def one_stream(client: grpcaio.InferenceServerClient, prompt: str, params: GenerationParams,
                     cancel_after: int | None = None, cancel: asyncio.Event | None = None,
                     stream: bool = True) -> Outcome:
    """A request on a gRPC stream read to its end, or cancelled after `cancel_after` responses with tokens or when
    `cancel` is set; a request open longer than HANG_S ends as an error saying so. `stream` False: the request asks
    for its whole answer in one response."""
    async def requests():
        yield {"model_name": "adaflash", "inputs": build_inputs(prompt, params, stream=stream)}

    start, seen, ttft, tokens = time.perf_counter(), 0, None, 0
    it = client.stream_infer(requests(), stream_timeout=HANG_S)

    async def read() -> Outcome:
        nonlocal seen, ttft, tokens
        async for result, error in it:
            if error is not None:
                return Outcome(False, time.monotonic(), error.message())
            chunk = parse_chunk(result)
            if chunk is not None and chunk.num_output_tokens:
                seen, tokens = seen + 1, chunk.num_output_tokens
                ttft = ttft if ttft is not None else time.perf_counter() - start
                if cancel_after is not None and seen >= cancel_after:
                    it.cancel()
                    return Outcome(True, time.monotonic(), ttft_s=ttft, tokens=tokens, cancelled=True)
            if is_final(result):
                return Outcome(True, time.monotonic(), ttft_s=ttft, tokens=tokens)
        return Outcome(False, time.monotonic(), "the stream ended without a final response")

    reader = asyncio.ensure_future(read())
    waits = [reader] + ([asyncio.ensure_future(cancel.wait())] if cancel is not None else [])
    try:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if reader in done:
            return reader.result()
        it.cancel()
        return Outcome(True, time.monotonic(), ttft_s=ttft, tokens=tokens, cancelled=True)
    except Exception as exc:  # noqa: BLE001 - a transport error (deadline, connection) is an outcome here
        return Outcome(False, time.monotonic(), f"{type(exc).__name__}: {exc}")
    finally:
        for w in waits:
            w.cancel()


class Readiness(threading.Thread):
    """Polls the server's readiness every POLL_S: (time, ready)."""

    def __init__(self, server: TritonServer) -> None:
        super().__init__(daemon=True)
        self.server, self.stopped, self.polls = server, threading.Event(), []

    def run(self) -> None:
        while not self.stopped.wait(POLL_S):
            self.polls.append((time.monotonic(), ready(self.server)))


def ready_while_failing_s(polls: list[tuple[float, bool]], failures: list[float], since: float) -> float:
    """The longest time a client could be failed while the server said it was ready: for each failure,
    how long the server had been reporting ready (counted from `since`, the fault) when it happened. `polls` in time
    order; linear in the polls, so that a run of an hour's polls and thousands of failures takes no time."""
    times = [pt for pt, _ in polls]
    run_start: list[float] = []  # the time of the first poll of the ready run each poll belongs to
    for i, (pt, ok) in enumerate(polls):
        run_start.append(run_start[-1] if ok and i and polls[i - 1][1] else pt)
    longest = 0.0
    for t in failures:
        i = bisect.bisect_right(times, t) - 1
        if i < 0 or not polls[i][1]:
            continue
        longest = max(longest, t - max(run_start[i], since))
    return round(longest, 2)


def wait_for(condition: Callable[[], bool], timeout_s: float) -> float | None:
    """Seconds until `condition()` held (None: not within `timeout_s`)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if condition():
            return time.monotonic() - start
        time.sleep(POLL_S)
    return None


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def resident_kib(server: TritonServer) -> dict[str, int]:
    """Resident memory of the server and of each model process (KiB, from /proc)."""
    pids = {"tritonserver": [server.pid]} | stub_pids(server.pid)
    out = {}
    for name, ps in pids.items():
        for i, pid in enumerate(ps):
            status = Path(f"/proc/{pid}/status").read_text()
            out[name if i == 0 else f"{name}#{i}"] = int(re.search(r"^VmRSS:\s+(\d+)", status, re.M).group(1))
    return out
