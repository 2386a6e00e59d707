"""The served step loop behind the public model: requests in, streamed responses out, one `Scheduler` for all.

Transport-free, as TensorRT-LLM's BLS `decode.py`: the Triton model (`model_repository/adaflash/1/model.py`) hands
each request's tensors and a `Stream` to `Orchestrator.serve`, and supplies the call to the other models. A
request is parsed (`protocol.parse_request`), tokenised (`api.encode`), checked once (`Limits.check`), admitted
through the bounded queue and run by the loop, which per step calls the target once for every running sequence and
each drafter model at most once, then answers each advanced sequence's stream, its text detokenised here, paced
(`pacing.py`). A refusal is a `RequestError`, which the stream sends by its status and field.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from adaflash.decoding.backend import BackendError
from adaflash.decoding.costs import CostModel
from adaflash.decoding.limits import Limits
from adaflash.decoding.scheduler import Scheduler
from adaflash.decoding.sequence import Sequence
from adaflash.decoding.speculation import build_speculation
from adaflash.models.chat_template import load_chat_template
from adaflash.models.drafter import DEFAULT_BLOCK_SIZE, DrafterConfig
from adaflash.models.target import TargetConfig
from adaflash.models.tokenizer import load_tokenizer
from adaflash.serving import protocol
from adaflash.serving.admission import Admission, AdmissionCancelled, AdmissionRefused
from adaflash.serving.api import Detokenizer, TextStops, encode, longest_token, prompt_characters
from adaflash.serving.metrics import Metrics
from adaflash.serving.pacing import response_gap, response_rate
from adaflash.serving.remote import Call, DrafterInProcess, RemoteBackend, Target
from adaflash_contract.errors import UNAVAILABLE, RequestError
from adaflash_contract.modes import modes_served

CANCEL_CHECK_S = 0.25  # how often the loop asks the server whether a client went away (each ask is a round trip)

Later = Callable[..., None]  # runs `call(*args)` now or on a thread of its own, in order (`Orchestrator.later`)


class Stream(Protocol):
    """One request's response channel (Triton's response sender)."""

    def send(self, tensors: protocol.Tensors | None, final: bool) -> None:
        """A response (None: only the end of the stream)."""

    def refuse(self, error: RequestError) -> None:
        """The request's only and final response: refused, by the error's status and field."""

    def fail(self, message: str) -> None:
        """The final response: the generation failed (an internal error)."""

    def is_cancelled(self) -> bool:
        """Whether the client went away."""


@dataclass
class Client:
    """One request's stream: where its responses go and what they carried so far."""

    stream: Stream
    served: protocol.ServedRequest
    done: asyncio.Future
    sent_tokens: int = 0
    sent_steps: int = 0
    sent_at: float = float("-inf")  # time.monotonic() of the last response


@dataclass(frozen=True)
class Pacing:
    """A stream's responses at most every `interval_s`, all streams together at most `rate` a second (0: no limit)."""

    interval_s: float = 0.0
    rate: float = 0.0


class Orchestrator:
    def __init__(self, scheduler: Scheduler, defaults: protocol.RequestDefaults, text: TextSide, admission: Admission,
                 metrics: Metrics, pacing: Pacing, later: Later, fetch_costs: Callable[[], Awaitable] | None = None,
                 log: Callable[[str], None] = print) -> None:
        """`fetch_costs`: asks the target for its cost table before the first step (None: none needed)."""
        self.scheduler, self.defaults, self.text = scheduler, defaults, text
        self.admission, self.metrics, self.pacing, self.later = admission, metrics, pacing, later
        self.fetch_costs, self.log = fetch_costs, log
        self.clients: dict[int, Client] = {}
        self.next_cancel_check = 0.0
        self.ids = itertools.count(int.from_bytes(os.urandom(4), "little") << 20)
        self.wake: asyncio.Event | None = None
        self.loop: asyncio.Task | None = None

    def start(self) -> None:
        """Run the step loop on the running event loop, unless it runs already."""
        if self.loop is None or self.loop.done():
            self.wake = asyncio.Event()
            self.loop = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self.loop is not None:
            self.loop.cancel()

    async def serve(self, tensors: protocol.Tensors, parameters: dict, stream: Stream) -> None:
        """Run one request to its final response."""
        arrived = time.perf_counter()  # its latencies count from here, as vLLM's from arrival
        try:
            served = self.text.parse(tensors, parameters, self.defaults, self.scheduler.limits)
            self.scheduler.limits.check(served.request)
            await self._admit(stream)
        except RequestError as exc:
            stream.refuse(exc)
            return
        except AdmissionCancelled:
            stream.send(None, final=True)
            return
        req = served.request
        if served.stop_texts:
            req.stop_text = TextStops(self.text.tokenizer, served.stop_texts)
        seq = Sequence(id=next(self.ids), request=req, tokens=list(req.prompt_ids), generator=None,
                       stop_ids=served.stop_ids, submitted_at=arrived)
        client = Client(stream, served, asyncio.get_running_loop().create_future())
        self.clients[seq.id] = client
        self.later(self.metrics.started, seq)
        self.scheduler.add(seq)
        self.wake.set()
        await client.done

    async def _admit(self, stream: Stream) -> None:
        """Wait for a sequence slot in the bounded queue; RequestError (unavailable) when refused."""
        try:
            waited = await self.admission.enter(cancelled=stream.is_cancelled)
        except AdmissionRefused as exc:
            raise RequestError("", str(exc), UNAVAILABLE) from None
        self.later(self.metrics.waited, waited)

    async def _run(self) -> None:
        """The step loop: sleeps while there is no work."""
        while True:
            if not self.scheduler.has_work:
                self.later(self.metrics.flush)
                self.wake.clear()
                await self.wake.wait()
            try:
                if self.fetch_costs is not None and self.scheduler.policy.cost is None:
                    self.scheduler.policy.cost = await self.fetch_costs()
                touched = await self._cancel_departed()
                touched += await self.scheduler.step()
            except BackendError as exc:  # no cost table yet: the requests fail, a later one asks again
                touched = await self.scheduler.fail_all(str(exc))
            except Exception as exc:  # noqa: BLE001 - a defect: end every request with it instead of hanging them
                self.log(f"step failed: {exc!r}")
                touched = await self.scheduler.fail_all(f"internal error: {exc}")
            self._respond(touched)
            self.later(self.metrics.flush, True)

    async def _cancel_departed(self) -> list[Sequence]:
        """End the sequences whose client went away, asked every CANCEL_CHECK_S."""
        if time.monotonic() < self.next_cancel_check:
            return []
        self.next_cancel_check = time.monotonic() + CANCEL_CHECK_S
        seqs = [*self.scheduler.waiting, *self.scheduler.running.values()]
        gone = [s for s in seqs if self.clients[s.id].stream.is_cancelled()]
        if gone:
            await self.scheduler.cancel(gone)
        return gone

    def _respond(self, touched: list[Sequence]) -> None:
        streams = sum(1 for c in self.clients.values() if c.served.stream)
        now, gap = time.monotonic(), response_gap(streams, self.pacing.interval_s, self.pacing.rate)
        for seq in touched:
            client = self.clients.get(seq.id)
            if client is None:
                continue
            if seq.finished:
                self._finish(seq, client)
            elif client.served.stream and now - client.sent_at >= gap:
                self.later(client.stream.send, self._response(seq, client, final=False), False)
                client.sent_tokens, client.sent_steps, client.sent_at = len(seq.output), len(seq.steps), now

    def _response(self, seq: Sequence, client: Client, final: bool) -> protocol.Tensors:
        """The response's tensors: the text since the last one (a multi-byte character is never split) and the
        statistics."""
        text = self.text.detokenizer.delta(client.served.text_ids(seq, final), client.sent_tokens, final)
        return protocol.encode_response(seq, text, client.sent_tokens, client.sent_steps, final, client.served)

    def _finish(self, seq: Sequence, client: Client) -> None:
        """The final response; the loop released the sequence in the models before."""
        if seq.finish_reason == "cancelled":
            self.later(client.stream.send, None, True)
        elif seq.finish_reason == "error":
            self.later(client.stream.fail, f"generation failed: {seq.error}")
        else:
            self.later(client.stream.send, self._response(seq, client, final=True), True)
        self.later(self.metrics.finished, seq)
        del self.clients[seq.id]
        self.admission.leave()
        client.done.set_result(None)


@dataclass
class TextSide:
    """The target's tokenizer and chat template: a request's text in, its responses' text out."""

    tokenizer: object
    chat: object
    config: TargetConfig

    def __post_init__(self) -> None:
        self.detokenizer = Detokenizer(self.tokenizer)
        self.longest_token = longest_token(self.tokenizer)

    def parse(self, tensors: protocol.Tensors, parameters: dict, defaults: protocol.RequestDefaults,
              limits: Limits) -> protocol.ServedRequest:
        """The request's fields parsed and its text tokenised; RequestError naming the field. A prompt too long by
        its characters alone is refused before it is tokenised."""
        protocol.refuse_parameters(parameters)
        values = protocol.parse_request(tensors, defaults)
        limits.check_prompt_text(prompt_characters(values), self.longest_token)
        encoded = encode(self.tokenizer, values, self.config.vocab_size, self.config.eos_token_ids, self.chat)
        return protocol.served_request(encoded, values)


def build_orchestrator(params: dict[str, str], call: Call, newest_drafter: Callable[[], str | None],
                       target: Target | None, metric_family: object, later: Later,
                       log: Callable[[str], None] = print, drafter: DrafterInProcess | None = None) -> Orchestrator:
    """The orchestrator of a model repository's parameters (the builder's fields, `protocol.model_parameters`).
    `target`: the target in this process (None: the `target` model, through `call`); `drafter`: the drafter in this
    process (None: the drafter models, through `call`)."""
    with open(f"{params['target_dir']}/config.json") as f:
        config = TargetConfig.from_hf(json.load(f))
    has_drafter = bool(params["drafter_dir"])
    block_size = DEFAULT_BLOCK_SIZE
    if has_drafter:
        with open(f"{params['drafter_dir']}/config.json") as f:
            block_size = DrafterConfig.from_hf(json.load(f)).block_size
    max_len, max_active = int(params["max_len"]), int(params["max_active"])
    limits = Limits(config.vocab_size, max_len, block_size, modes_served(has_drafter), protocol.model_paging(params),
                    int(params["max_output_tokens"]), int(params["max_prompt_tokens"]))
    metrics = Metrics(metric_family)
    backend = RemoteBackend(call, newest_drafter, log=log, target=target,
                            called=lambda model, op, n: later(metrics.called, model, op.name.lower(), n),
                            drafter=drafter)
    policy = build_speculation(getattr(target, "cost", None), block_size, max_len, has_drafter, served=True)
    admission = Admission(max_active, int(params["max_queued"]), float(params["max_queue_wait_s"]),
                          on_queue=partial(later, metrics.queued_now))
    pacing = Pacing(float(params["stream_interval_ms"]) / 1000, response_rate(float(params["max_responses_per_s"])))
    fetch_costs = partial(_fetch_costs, call) if has_drafter else None
    text = TextSide(load_tokenizer(params["target_dir"]), load_chat_template(params["target_dir"]), config)
    return Orchestrator(Scheduler(backend, policy, limits, max_active), protocol.RequestDefaults(
        params["default_spec_mode"]), text, admission, metrics, pacing, later, fetch_costs, log)


async def _fetch_costs(call: Call) -> CostModel:
    """The target's cost table, measured where its forwards run (a server without a drafter needs none)."""
    return protocol.decode_cost_table(await call(protocol.TARGET, protocol.encode_costs_call()))
