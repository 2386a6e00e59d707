"""The public model, a decoupled BLS orchestrator: one step loop for every active request (the core's Scheduler).

A request is checked and tokenised (`protocol.parse_request`, `api.encode`), admitted through the
bounded queue and handed to the loop, which per step calls the target once for every running
sequence and each drafter model at most once, then streams a response per advanced sequence, its
text detokenised here (`api.Detokenizer`). The target runs in this process (`target_in_orchestrator`)
or is the `target` model. This file maps the loop's calls to BLS requests and its sequences to
responses, and keeps the Prometheus metrics. Every payload is protocol.py's.
"""

import asyncio
import itertools
import json
import os
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass
from functools import partial

import triton_python_backend_utils as pb_utils

from adaflash.serving.threads import spin_target_threads

spin_target_threads()  # before torch loads: the target's threads, when it runs here (else this process uses one)

import torch  # noqa: E402

from adaflash.decoding.gate import SERVED_MIN_SEQUENCES, PlanGate, arms_for  # noqa: E402
from adaflash.decoding.modes import modes_served  # noqa: E402
from adaflash.decoding.planner import Planner  # noqa: E402
from adaflash.decoding.policy import LengthController  # noqa: E402
from adaflash.decoding.scheduler import BackendError, Scheduler  # noqa: E402
from adaflash.decoding.sequence import Sequence, validate_request  # noqa: E402
from adaflash.models.chat_template import load_chat_template  # noqa: E402
from adaflash.models.drafter import DEFAULT_BLOCK_SIZE, DrafterConfig  # noqa: E402
from adaflash.models.target import TargetConfig  # noqa: E402
from adaflash.models.tokenizer import load_tokenizer  # noqa: E402
from adaflash.serving import protocol  # noqa: E402
from adaflash.serving.admission import Admission, AdmissionCancelled, AdmissionRefused  # noqa: E402
from adaflash.serving.api import Detokenizer, TextStops, encode  # noqa: E402
from adaflash.serving.pacing import response_gap, response_rate  # noqa: E402
from adaflash.serving.remote import RemoteBackend, TargetInProcess  # noqa: E402
from adaflash.serving.slots import OccupancyReporter, load_target  # noqa: E402
from adaflash.serving.tally import Tally  # noqa: E402

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
WAIT_BUCKETS = [0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0]
CANCEL_CHECK_S = 0.25  # how often the loop asks Triton whether a client went away (each ask is a round trip)
METRICS_FLUSH_S = 0.25  # counters reach Triton at most this late (serving/tally.py)


def _inputs(request):
    return {t.name(): t.as_numpy() for t in request.inputs()}


def _response(tensors):
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, v) for n, v in tensors.items()])


def _error(message, code):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


def _run_job(job):
    try:
        job()
    except Exception as exc:  # noqa: BLE001 - a client gone mid-stream must not stop the other streams
        pb_utils.Logger.log_error(f"sending a response or a metric failed: {exc}")


def _key(family, labels):
    """A series' key: its family's attribute name and its labels in order."""
    return family, tuple(sorted(labels.items()))


@dataclass
class Client:
    """One request's stream: where its responses go and what they carried so far."""

    sender: object
    generation: protocol.Generation
    done: asyncio.Future
    sent_tokens: int = 0
    sent_steps: int = 0
    sent_at: float = float("-inf")  # time.monotonic() of the last response


class Metrics:
    """Prometheus series on Triton's metrics endpoint, labelled by spec_mode. A family must outlive its
    series: both are kept. Counters are gathered in a Tally and written by `flush`; gauges are written as they
    change (a level read between two flushes must be the level, and a tally of +1 and -1 writes nothing)."""

    def __init__(self):
        fam = pb_utils.MetricFamily
        self.requests = fam("adaflash_requests_total", "Finished generation requests", fam.COUNTER)
        self.tokens = fam("adaflash_tokens_total", "Tokens committed to outputs", fam.COUNTER)
        self.forwards = fam("adaflash_target_forwards_total", "Target forward passes (prefill and verify)", fam.COUNTER)
        self.active = fam("adaflash_active_sequences", "Sequences being generated", fam.GAUGE)
        # Per verify step, counted by value (at most one update per value a request met, not one per step: each
        # update is a round trip to the server process, and per-step histograms took the step loop's time).
        self.steps_by_accepted = fam("adaflash_verify_steps_total",
                                     "Verify steps, by the draft tokens they accepted (accepted)", fam.COUNTER)
        self.steps_by_draft_len = fam("adaflash_verify_steps_by_draft_len_total",
                                      "Verify steps, by the draft tokens they verified (draft_len)", fam.COUNTER)
        self.accepted = fam("adaflash_accepted_tokens_total", "Accepted draft tokens", fam.COUNTER)
        self.drafted = fam("adaflash_verified_draft_tokens_total", "Draft tokens sent to verification", fam.COUNTER)
        self.queued = fam("adaflash_queued_requests", "Requests waiting for a sequence slot", fam.GAUGE)
        self.queue_wait_family = fam("adaflash_queue_wait_seconds", "Time admitted requests waited for a sequence slot",
                                     fam.HISTOGRAM)
        self.queue_wait = self.queue_wait_family.Metric(labels={}, buckets=WAIT_BUCKETS)
        # The mean sequences per call is their ratio (a histogram's every observation would be a round trip).
        self.calls = fam("adaflash_model_calls_total", "Calls to the target and drafter models", fam.COUNTER)
        self.call_sequences = fam("adaflash_model_call_sequences_total",
                                  "Sequences the calls to the target and drafter models carried", fam.COUNTER)
        self._series = {}
        self.tally = Tally(METRICS_FLUSH_S)
        self.series("queued")  # 0 from the start

    def series(self, family, **labels):
        """`family`: the attribute naming it."""
        return self._series_of(_key(family, labels))

    def _series_of(self, key):
        if key not in self._series:
            family, labels = key
            self._series[key] = getattr(self, family).Metric(labels=dict(labels))
        return self._series[key]

    def _add(self, family, n, **labels):
        self.tally.add(_key(family, labels), n)

    def flush(self, when_due=False):
        """Write the gathered updates; `when_due`: only when the last flush is METRICS_FLUSH_S old."""
        now = time.monotonic()
        if not when_due or self.tally.due(now):
            self.tally.flush(lambda key, n: self._series_of(key).increment(n), now)

    def queued_now(self, n):
        self.series("queued").set(n)

    def started(self, mode):
        self.series("active", spec_mode=mode).increment(1)

    def finished(self, seq):
        mode = seq.request.mode
        self.series("active", spec_mode=mode).increment(-1)
        if seq.finish_reason == "error":
            return
        self._add("requests", 1, spec_mode=mode, finish_reason=seq.finish_reason or "")
        self._add("tokens", len(seq.output), spec_mode=mode)
        self._add("forwards", 1 + len(seq.steps), spec_mode=mode)
        self._add("accepted", sum(s.accepted for s in seq.steps), spec_mode=mode)
        self._add("drafted", sum(s.draft_len for s in seq.steps), spec_mode=mode)
        for accepted, n in Counter(s.accepted for s in seq.steps).items():
            self._add("steps_by_accepted", n, spec_mode=mode, accepted=str(accepted))
        for draft_len, n in Counter(s.draft_len for s in seq.steps).items():
            self._add("steps_by_draft_len", n, spec_mode=mode, draft_len=str(draft_len))

    def called(self, model, op, sequences):
        self._add("calls", 1, model=model, op=op)
        self._add("call_sequences", sequences, model=model, op=op)


class TritonPythonModel:
    def initialize(self, args):
        params = protocol.model_parameters(json.loads(args["model_config"]))
        self.target = None
        if params["target_in_orchestrator"] == "True":
            self.target = self._target_here(params, args)
        torch.set_num_threads(1)  # bookkeeping only: leave the cores to the target (its thread keeps its count)
        with open(f"{params['target_dir']}/config.json") as f:
            self.target_config = TargetConfig.from_hf(json.load(f))
        self.has_drafter = bool(params["drafter_dir"])
        self.tokenizer = load_tokenizer(params["target_dir"])
        self.chat = load_chat_template(params["target_dir"])
        self.detokenizer = Detokenizer(self.tokenizer)
        self.max_prompt_tokens = int(params["max_prompt_tokens"])
        self.limits = protocol.RequestLimits(int(params["max_output_tokens"]), modes_served(self.has_drafter),
                                             params["default_spec_mode"])
        block_size = DEFAULT_BLOCK_SIZE
        if self.has_drafter:
            with open(f"{params['drafter_dir']}/config.json") as f:
                block_size = DrafterConfig.from_hf(json.load(f)).block_size
        # The cost table comes from the target (measured in its process) before the first step.
        self.planner = Planner(LengthController(self.target.cost if self.target else None, block_size))
        self.max_len = int(params["max_len"])
        self.metrics = Metrics()
        # Responses and metric updates are calls into Triton (each a round trip to the server process). With the
        # target a model of its own they run on a thread of their own, in FIFO order, so that the step loop sends
        # the next call to the target first (one queue keeps each stream in order): `_later`.
        self.outbox = queue.SimpleQueue()
        if self.target is None:
            threading.Thread(target=self._run_outbox, name="outbox", daemon=True).start()
        max_active = int(params["max_active"])
        self.admission = Admission(max_active, int(params["max_queued"]), float(params["max_queue_wait_s"]),
                                   on_queue=partial(self._later, self.metrics.queued_now))
        self.stream_interval_s = float(params["stream_interval_ms"]) / 1000
        self.response_rate = response_rate(float(params["max_responses_per_s"]))
        self.timeouts = {protocol.TARGET: float(params["target_timeout_s"]),
                         protocol.DRAFTER: float(params["drafter_timeout_s"])}
        self.repository = os.path.dirname(args["model_repository"])
        backend = RemoteBackend(self._call, self._newest_drafter, log=pb_utils.Logger.log_error, target=self.target,
                                called=lambda model, op, n: self._later(self.metrics.called, model, op.name.lower(), n))
        self.scheduler = Scheduler(backend, self.planner, self.planner.controller.cost, max_active, self.max_len,
                                   self.has_drafter, paging=protocol.model_paging(params),
                                   gate=self._gate(self.planner.controller.cost))
        self.clients = {}  # sequence id -> Client
        self.next_cancel_check = 0.0
        self.ids = itertools.count(int.from_bytes(os.urandom(4), "little") << 20)
        self.wake = None
        self.loop = None

    async def execute(self, requests):
        self._start_loop()
        await asyncio.gather(*(self._serve(r) for r in requests))
        return None

    def _target_here(self, params, args):
        """The target in this process, on the device Triton gave this instance, with its cost table and the leak
        check the `target` model would report."""
        place = protocol.model_placement(params, args["model_instance_kind"], args["model_instance_device_id"])
        target = TargetInProcess(partial(load_target, params, place))
        family = pb_utils.MetricFamily("adaflash_open_slots", "Sequences holding a cache slot of the model",
                                       pb_utils.MetricFamily.GAUGE)
        self.occupancy = family, family.Metric(labels={"model": protocol.TARGET})
        self.reporter = OccupancyReporter(target.slots, self.occupancy[1].set)
        self.reporter.start()
        return target

    def finalize(self):
        if self.loop is not None:
            self.loop.cancel()
        if self.target is not None:
            self.reporter.stop()
            self.target.close()
        self.outbox.put(None)

    def _later(self, call, *args):
        """Run `call(*args)` on the outbox thread while the target is a model of its own; with the target here, at
        once, on the loop's thread: between the target's forwards, since a thread sending during a forward takes
        a core from the forward's threads (docs/results.md, round 14)."""
        if self.target is None:
            self.outbox.put(partial(call, *args))
        else:
            _run_job(partial(call, *args))

    def _run_outbox(self):
        while (job := self.outbox.get()) is not None:
            _run_job(job)

    @staticmethod
    def _send(sender, payload, flags):
        """payload: a response's tensors, an error message, or None (nothing but the flags)."""
        if payload is None:
            sender.send(flags=flags)
        elif isinstance(payload, str):
            sender.send(_error(payload, pb_utils.TritonError.INTERNAL), flags=flags)
        else:
            sender.send(_response(payload), flags=flags)

    def _start_loop(self):
        if self.loop is None or self.loop.done():
            self.wake = asyncio.Event()
            self.loop = asyncio.get_running_loop().create_task(self._run())

    async def _serve(self, request):
        """Admit one request and wait until the loop has sent its final response."""
        sender = request.get_response_sender()
        try:
            generation = self._generation(request)
            validate_request(generation.request, self.target_config.vocab_size, self.max_len, self.planner.block_size,
                             self.has_drafter)
            self.scheduler.check_capacity(generation.request)
        except ValueError as exc:
            sender.send(_error(f"INVALID_ARGUMENT: {exc}", pb_utils.TritonError.INVALID_ARG), flags=FINAL)
            return
        if not await self._admit(sender):
            return
        req = generation.request
        if generation.stop_texts:
            req.stop_text = TextStops(self.tokenizer, generation.stop_texts)
        seq = Sequence(id=next(self.ids), request=req, tokens=list(req.prompt_ids), generator=None,
                       stop_ids=generation.stop_ids, submitted_at=time.perf_counter())
        client = Client(sender, generation, asyncio.get_running_loop().create_future())
        self.clients[seq.id] = client
        self._later(self.metrics.started, req.mode)
        self.scheduler.add(seq)
        self.wake.set()
        await client.done

    def _generation(self, request):
        """The request checked and tokenised; ValueError naming the field."""
        protocol.refuse_parameters(json.loads(request.parameters()))
        values = protocol.parse_request(_inputs(request), self.limits)
        encoded = encode(self.tokenizer, values, self.max_prompt_tokens, self.target_config.vocab_size,
                         self.target_config.eos_token_ids, self.chat)
        return protocol.generation_of(encoded, values)

    async def _admit(self, sender):
        """Wait for a sequence slot in the bounded queue; False (the client told) when refused or cancelled."""
        try:
            waited = await self.admission.enter(cancelled=sender.is_cancelled)
        except AdmissionRefused as exc:
            sender.send(_error(f"UNAVAILABLE: {exc}", pb_utils.TritonError.UNAVAILABLE), flags=FINAL)
            return False
        except AdmissionCancelled:
            sender.send(flags=FINAL)
            return False
        self._later(self.metrics.queue_wait.observe, waited)
        return True

    async def _run(self):
        """The step loop: sleeps while there is no work."""
        while True:
            if not self.scheduler.has_work:
                self._later(self.metrics.flush)
                self.wake.clear()
                await self.wake.wait()
            try:
                await self._fetch_costs()
                touched = await self._cancel_departed()
                touched += await self.scheduler.step()
            except BackendError as exc:  # no cost table yet: the requests fail, a later one asks again
                touched = await self.scheduler.fail_all(str(exc))
            except Exception as exc:  # noqa: BLE001 - a defect: end every request with it instead of hanging them
                pb_utils.Logger.log_error(f"step failed: {exc!r}")
                touched = await self.scheduler.fail_all(f"internal error: {exc}")
            self._respond(touched)
            self._later(self.metrics.flush, True)

    async def _fetch_costs(self):
        """Ask the target model for its cost table, once (a server without a drafter needs none)."""
        if self.has_drafter and self.scheduler.cost is None:
            cost = protocol.decode_cost_table(await self._call(protocol.TARGET, protocol.encode_costs_call()))
            self.planner.controller.cost = self.scheduler.cost = cost
            self.scheduler.gate = self._gate(cost)  # (its arms follow the table; no step ran before it came)

    def _gate(self, cost):
        """The plan gate for the target's cost table (None: not fetched yet)."""
        return PlanGate(SERVED_MIN_SEQUENCES, arms_for(self.planner.copies, cost is not None and cost.padded))

    async def _cancel_departed(self):
        """End the sequences whose client went away, asked of Triton every CANCEL_CHECK_S."""
        if time.monotonic() < self.next_cancel_check:
            return []
        self.next_cancel_check = time.monotonic() + CANCEL_CHECK_S
        seqs = [*self.scheduler.waiting, *self.scheduler.running.values()]
        gone = [s for s in seqs if self.clients[s.id].sender.is_cancelled()]
        if gone:
            await self.scheduler.cancel(gone)
        return gone

    def _respond(self, touched):
        streams = sum(1 for c in self.clients.values() if c.generation.stream)
        now, gap = time.monotonic(), response_gap(streams, self.stream_interval_s, self.response_rate)
        for seq in touched:
            client = self.clients.get(seq.id)
            if client is None:
                continue
            if seq.finished:
                self._finish(seq, client)
            elif client.generation.stream and now - client.sent_at >= gap:
                self._later(self._send, client.sender, self._response(seq, client, final=False), 0)
                client.sent_tokens, client.sent_steps, client.sent_at = len(seq.output), len(seq.steps), now

    def _response(self, seq, client, final):
        """The response's tensors: the text since the last one (a multi-byte character is never split) and the
        statistics."""
        text = self.detokenizer.delta(client.generation.text_ids(seq, final), client.sent_tokens, final)
        return protocol.encode_response(seq, text, client.sent_tokens, client.sent_steps, final, client.generation)

    def _finish(self, seq, client):
        """The final response; the loop released the sequence in the models before."""
        if seq.finish_reason == "cancelled":
            payload = None
        elif seq.finish_reason == "error":
            payload = f"generation failed: {seq.error}"
        else:
            payload = self._response(seq, client, final=True)
        self._later(self._send, client.sender, payload, FINAL)
        self._later(self.metrics.finished, seq)
        del self.clients[seq.id]
        self.admission.leave()
        client.done.set_result(None)

    async def _call(self, model, tensors):
        """One BLS request; BackendError when the model fails or does not answer in time."""
        op = protocol.Op(int(tensors["op"][0]))
        outputs = protocol.result_names(op)
        timeout = self.timeouts[protocol.TARGET if model == protocol.TARGET else protocol.DRAFTER]  # or drafter_<n>
        request = pb_utils.InferenceRequest(model_name=model, inputs=[pb_utils.Tensor(n, v) for n, v in tensors.items()],
                                            requested_output_names=outputs)
        try:
            response = await asyncio.wait_for(request.async_exec(), timeout)
        except asyncio.TimeoutError:
            raise BackendError(f"{model}: no answer in {timeout:g} s") from None
        except Exception as exc:  # noqa: BLE001 - e.g. the model is not loaded
            raise BackendError(f"{model}: {exc}") from None
        if response.has_error():
            raise BackendError(f"{model}: {response.error().message()}")
        return {t.name(): t.as_numpy() for t in response.output_tensors()}

    def _newest_drafter(self):
        """The newest loaded drafter (`drafter`, or a published `drafter_<n>`), None when none is ready."""
        newest_first = reversed(protocol.drafter_models_in(os.listdir(self.repository)))
        return next((name for name in newest_first if pb_utils.is_model_ready(name)), None)
