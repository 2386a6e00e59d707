"""Chaos under load: a steady mixed load on both front doors while the server's processes are killed at random.

The load: closed-loop users, each sending its next request when the last one ended, every request drawn at random:
over gRPC (the `adaflash` model's stream) or the OpenAI endpoint (completions or chat), streaming or not, in any
decoding mode, and now and then cancelled after its first responses. The faults: at random times SIGKILL of one of
the processes a deployment runs (the orchestrator `adaflash`, the drafter's own model process, `tritonserver`), a
kind drawn from a shuffled bag so that every kind is hit as often as the others. The server is the suite's, with the
drafter in a process of its own so that all three kinds exist (by default the drafter runs in the orchestrator's
process, which the orchestrator's kill covers).

What must hold: every request ends (a result or an error, none left open past `HANG_S`); readiness turns false within
5 s of a kill (the drafter's excepted: requests decode without it, exactly, so the server is rightly still ready);
service is back within 30 s of each kill by itself; no request fails outside a fault (from its kill until service is
back); no window over 5 s in which the server says ready while requests fail; the server's resident memory at the end
within 5% of its level after the warm-up; nothing left running or held once the load stops; a greedy canary answers
the same before and after. `reliability.py` runs it as the scenario `chaos` (`make soak`: 30 minutes, at least 10
kills; `make test`: one kill of each kind).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import threading
import time
from dataclasses import asdict, dataclass

import aiohttp
import tritonclient.grpc.aio as grpcaio

from adaflash_client.client import GenerationParams
from adaflash_contract.modes import MODE_NAMES
from adaflash_server import shm
from adaflash_server.launcher import TritonServer, free_ports, stub_pids
from adaflash_server.openai_front import FrontServer
from adaflash_tools import fuzz as fuzzing
from adaflash_tools import probes

MODELS = ("adaflash", "drafter")  # the model processes: the orchestrator, the drafter
KINDS = (*MODELS, "tritonserver")  # the processes killed
NOT_READY_S = 5.0  # readiness must turn false this soon after a kill (not the drafter's)
RECOVERED_S = 30.0  # service must be back this soon after a kill
READY_WHILE_FAILING_S = 5.0
MEMORY_GROWTH = 0.05
# gRPC's reconnect backoff grows to 2 minutes, and channels to one address share its state: a client of a restarted
# server would fail for seconds after it is ready again. The load's clients retry as the OpenAI front's channel does.
GRPC_CHANNEL = [("grpc.max_reconnect_backoff_ms", 1000)]


@dataclass(frozen=True)
class Settings:
    """How long and how hard (`reliability.Scale` gives the suite's two scales)."""

    seconds: float  # the load runs this long while processes are killed (and until min_kills kills)
    min_kills: int
    users: int
    gap_s: tuple[float, float]  # the pause before a kill, after the last recovery: drawn uniformly
    warmup_s: float
    max_tokens: int


@dataclass
class Request:
    """One request of the load and how it ended."""

    door: str  # "grpc" or "openai"
    stream: bool
    mode: str
    started: float  # time.monotonic()
    ended: float = 0.0
    ok: bool = False
    cancelled: bool = False
    error: str = ""

    @property
    def hung(self) -> bool:
        return "DEADLINE_EXCEEDED" in self.error or "TimeoutError" in self.error


class Load(threading.Thread):
    """`users` closed-loop users on an event loop of their own, until stopped."""

    def __init__(self, grpc_url: str, front_url: str, model: str, users: int, max_tokens: int, seed: int,
                 chat: bool) -> None:
        super().__init__(name="chaos-load", daemon=True)
        self.grpc_url, self.front_url, self.model, self.chat = grpc_url, front_url, model, chat
        self.users, self.max_tokens, self.rng = users, max_tokens, random.Random(seed)
        self.requests: list[Request] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        asyncio.run(self._users())

    def stop(self) -> None:
        self.stopped.set()
        self.join(probes.HANG_S + 30)

    def succeeded_since(self, t: float) -> bool:
        """A request sent at `t` or later ended with its answer."""
        return any(r.ok and r.started >= t for r in reversed(self.requests[-200:]))

    async def _users(self) -> None:
        timeout = aiohttp.ClientTimeout(total=probes.HANG_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await asyncio.gather(*(self._user(u, session) for u in range(self.users)))

    async def _user(self, u: int, session: aiohttp.ClientSession) -> None:
        grpc: grpcaio.InferenceServerClient | None = None
        i = u
        while not self.stopped.is_set():
            door, stream = self.rng.choice(["grpc", "openai"]), self.rng.random() < 0.7
            request = Request(door, stream, self.rng.choice(MODE_NAMES), time.monotonic())
            cancel_after = self.rng.randint(1, 3) if stream and self.rng.random() < 0.2 else None
            prompt = probes.PROMPTS[i % len(probes.PROMPTS)]
            i += self.users
            if door == "grpc":
                grpc = grpc or grpcaio.InferenceServerClient(self.grpc_url, channel_args=GRPC_CHANNEL)
                await self._grpc(grpc, request, prompt, cancel_after)
                if not request.ok:  # a client whose server went away reconnects with a backoff: start afresh
                    await grpc.close()
                    grpc = None
            else:
                await self._openai(session, request, prompt, cancel_after)
            request.ended = time.monotonic()
            self.requests.append(request)
            if not request.ok:
                await asyncio.sleep(0.1)  # a client's pause before it tries again, not a tight loop on a dead server
        if grpc is not None:
            await grpc.close()

    async def _grpc(self, client: grpcaio.InferenceServerClient, request: Request, prompt: str,
                    cancel_after: int | None) -> None:
        params = GenerationParams(max_tokens=self.max_tokens, spec_mode=request.mode)
        outcome = await probes.one_stream(client, prompt, params, cancel_after=cancel_after, stream=request.stream)
        request.ok, request.cancelled, request.error = outcome.ok, outcome.cancelled, outcome.error

    async def _openai(self, session: aiohttp.ClientSession, request: Request, prompt: str,
                      cancel_after: int | None) -> None:
        chat = self.chat and self.rng.random() < 0.5
        body = {"model": self.model, "max_tokens": self.max_tokens, "stream": request.stream,
                "spec_mode": request.mode, "temperature": 0}
        body |= {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
        url = f"{self.front_url}/{'chat/completions' if chat else 'completions'}"
        try:
            async with session.post(url, json=body) as response:
                if response.status != 200:
                    request.error = f"HTTP {response.status}: {(await response.text())[:160]}"
                elif not request.stream:
                    request.ok = "choices" in await response.json()
                    request.error = "" if request.ok else "an answer without choices"
                else:
                    await self._events(response, request, cancel_after)
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as exc:
            request.error = f"{type(exc).__name__}: {exc}"

    @staticmethod
    async def _events(response: aiohttp.ClientResponse, request: Request, cancel_after: int | None) -> None:
        """Server-sent events to `[DONE]`, or closed after `cancel_after` of them (the client gone mid-stream)."""
        seen = 0
        async for line in response.content:
            data = line.decode().strip().removeprefix("data: ")
            if not data:
                continue
            if data == "[DONE]":
                request.ok = True
                return
            if "error" in json.loads(data):
                request.error = f"error event: {data[:160]}"
                return
            seen += 1
            if cancel_after is not None and seen >= cancel_after:
                request.ok = request.cancelled = True
                response.close()
                return
        request.error = "the event stream ended without [DONE]"


@dataclass
class Kill:
    """One fault and the server's recovery from it, in seconds after the kill."""

    kind: str
    at_s: float  # after the chaos began
    pid: int
    to_not_ready_s: float | None
    to_ready_s: float | None
    to_served_s: float | None  # a request sent after readiness came back ended with its answer

    def passed(self) -> bool:
        recovered = self.to_served_s is not None and self.to_served_s <= RECOVERED_S  # served after ready: the later
        return recovered and (self.kind == "drafter" or self.to_not_ready_s is not None)


def has_chat(front_url: str, model: str) -> bool:
    """Whether the target has a chat template (the tiny random models have none): chat requests are part of the load
    only then."""
    body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    status, _ = fuzzing.send_openai(front_url, "chat/completions", json.dumps(body).encode())
    return status == 200


def process_pid(server: TritonServer, kind: str) -> int | None:
    if kind == "tritonserver":
        return server.pid
    pids = stub_pids(server.pid).get(kind, []) if server.pid else []
    return pids[0] if pids else None


def whole(server: TritonServer, kinds: tuple[str, ...]) -> bool:
    """Every process of the layout is up (after a kill, the replacement of the one killed)."""
    return server.pid is not None and all(process_pid(server, k) for k in kinds)


def kill_and_recover(server: TritonServer, kind: str, load: Load, began: float) -> Kill:
    pid = process_pid(server, kind)
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    not_ready = probes.wait_for(lambda: not probes.ready(server), NOT_READY_S)
    back = probes.wait_for(lambda: process_pid(server, kind) not in (None, pid) and whole(server, MODELS)
                          and probes.ready(server), 120)
    ready_at = time.monotonic()
    served = probes.wait_for(lambda: load.succeeded_since(ready_at), 60) if back is not None else None
    to_served = None if served is None else time.monotonic() - killed_at
    return Kill(kind, round(killed_at - began, 1), pid, probes.rounded(not_ready), probes.rounded(back),
                probes.rounded(to_served))


def server_memory(server: TritonServer) -> dict[str, int]:
    kib = probes.resident_kib(server)
    return kib | {"total": sum(kib.values()), "dev_shm": shm.region_bytes() // 1024}


def unexplained_failures(requests: list[Request], kills: list[Kill], began: float) -> list[Request]:
    """Failed requests whose time overlaps no fault (from a kill until service was back, and a second after)."""
    windows = [(killed_at(k, began), began + k.at_s + (k.to_served_s if k.to_served_s is not None else 1e9) + 1.0)
               for k in kills]
    return [r for r in requests if not r.ok and not any(r.started <= end and r.ended >= start
                                                          for start, end in windows)]


def killed_at(kill: Kill, began: float) -> float:
    """When `kill` happened (time.monotonic()), its `at_s` being rounded to a tenth: never after it."""
    return began + kill.at_s - 0.05


def kill_spans(kills: list[Kill], began: float) -> list[tuple[float, float]]:
    """Each kill's time until the next one's: the failures a kill's readiness is judged by."""
    starts = [killed_at(k, began) for k in kills]
    return list(zip(starts, [*starts[1:], float("inf")]))


def run(server: TritonServer, settings: Settings, seed: int = 0) -> dict:
    if not whole(server, KINDS):
        raise ValueError(f"chaos kills {', '.join(KINDS)}: this server runs "
                         f"{', '.join(['tritonserver', *stub_pids(server.pid)])} (start it with drafter_apart)")
    rng = random.Random(seed)
    before = probes.canary(server, 8)
    front = FrontServer(server.grpc_url, "127.0.0.1", free_ports(1)[0]).start()
    model = fuzzing.served_name(front.url)
    load = Load(server.grpc_url, front.url, model, settings.users, settings.max_tokens, seed, has_chat(front.url, model))
    readiness = probes.Readiness(server)
    kills: list[Kill] = []
    memory: list[tuple[float, dict[str, int]]] = []
    began = time.monotonic()
    try:
        load.start()
        readiness.start()
        probes.wait_for(lambda: load.succeeded_since(began), probes.HANG_S)
        time.sleep(settings.warmup_s)
        memory.append((time.monotonic() - began, server_memory(server)))
        deadline, bag = began + settings.seconds, []
        while len(kills) < settings.min_kills or time.monotonic() < deadline:
            time.sleep(rng.uniform(*settings.gap_s))
            if len(kills) >= settings.min_kills and time.monotonic() >= deadline:
                break
            bag = bag or rng.sample(KINDS, len(KINDS))
            kills.append(kill_and_recover(server, bag.pop(), load, began))
            print(f"chaos: {json.dumps(asdict(kills[-1]))}", flush=True)
            if kills[-1].to_ready_s is None:
                break  # the server did not come back: nothing more to learn from killing it again
        time.sleep(min(settings.gap_s))  # the load on the last recovered server
        memory.append((time.monotonic() - began, server_memory(server)))
    finally:
        load.stop()
        readiness.stopped.set()
        readiness.join()
        front.stop()
    return summary(server, load, kills, memory, readiness.polls, began, before)


def summary(server: TritonServer, load: Load, kills: list[Kill], memory: list, polls: list, began: float,
            canary_before: str) -> dict:
    requests = load.requests
    idle_s, counts = probes.seconds_until_idle(server)
    same = probes.canary(server, 8) == canary_before
    failed = [r for r in requests if not r.ok]
    hung = [r for r in requests if r.hung]
    unexplained = unexplained_failures(requests, kills, began)
    windows = [probes.ready_while_failing_s(polls, [r.ended for r in failed if since <= r.ended < until], since)
               for since, until in kill_spans(kills, began)]
    (_, first), (_, last) = memory[0], memory[-1]
    growth = {name: round(last[name] / first[name] - 1, 4) for name in first if name in last and first[name]}
    rows = [asdict(k) | {"ready_while_failing_s": w, "passed": k.passed()} for k, w in zip(kills, windows)]
    by = {f"{d} {'stream' if s else 'whole'}": sum(r.door == d and r.stream == s for r in requests)
          for d in ("grpc", "openai") for s in (True, False)}
    passed = (len(kills) > 0 and all(r["passed"] for r in rows) and not hung and not unexplained
              and max(windows, default=0.0) <= READY_WHILE_FAILING_S and growth.get("total", 1.0) < MEMORY_GROWTH
              and idle_s is not None and same)
    return {"seconds": round(time.monotonic() - began, 1), "users": load.users,
            "requests": len(requests), "requests_by_door": by,
            "modes": sorted({r.mode for r in requests}), "cancelled": sum(r.cancelled for r in requests),
            "failed": len(failed), "failed_outside_faults": len(unexplained), "hung": len(hung),
            "error_examples": sorted({r.error[:120] for r in failed})[:6],
            "unexplained_examples": [asdict(r) | {"started": round(r.started - began, 2), "ended": round(r.ended - began, 2)}
                                     for r in unexplained[:3]],
            "kills": len(kills), "kills_by_kind": {k: sum(x.kind == k for x in kills) for k in KINDS},
            "max_s_to_not_ready": max((k.to_not_ready_s or 0.0 for k in kills if k.kind != "drafter"), default=None),
            "max_s_to_served": None if any(k.to_served_s is None for k in kills)
            else max((k.to_served_s for k in kills), default=None),
            "max_ready_while_failing_s": max(windows, default=None),
            "memory_kib_after_warmup_and_at_end": [memory[0], memory[-1]], "memory_growth": growth,
            "idle_after_s": idle_s, "idle_counts": counts, "canary_unchanged": same, "rows": rows,
            "passed": passed}
