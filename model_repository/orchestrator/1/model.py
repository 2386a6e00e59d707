"""Decoupled BLS orchestrator: one coroutine per request runs prefill, then draft -> verify -> stream.

The loop itself is the core's `run_request`; this file turns its calls into BLS requests
(correlation id = the request's sequence id, START on a model's first call, END on release)
and its steps into streamed responses, and keeps the Prometheus metrics. Every payload is
encoded and decoded by protocol.py.
"""

import asyncio
import itertools
import json
import os

import torch
import triton_python_backend_utils as pb_utils

from adaflash.decoding.costs import CostModel
from adaflash.decoding.planner import Planner
from adaflash.decoding.policy import LengthController
from adaflash.decoding.sequence import validate_request
from adaflash.models.drafter import DEFAULT_BLOCK_SIZE, DrafterConfig
from adaflash.models.target import TargetConfig
from adaflash.serving import protocol
from adaflash.serving.admission import Admission, AdmissionCancelled, AdmissionRefused
from adaflash.serving.protocol import Op, TargetCall
from adaflash.serving.session import run_request

START, END = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START, pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
STEP_BUCKETS = [float(b) for b in range(17)]
WAIT_BUCKETS = [0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0]
INPUTS, _ = protocol.MODEL_TENSORS[protocol.ORCHESTRATOR]
TARGET_OUTPUTS = protocol.names(protocol.TARGET_RESULT)
DRAFTER_OUTPUTS = protocol.names(protocol.DRAFTER_RESULT)


def _inputs(request):
    found = ((s.name, pb_utils.get_input_tensor_by_name(request, s.name)) for s in INPUTS)
    return {name: t.as_numpy() for name, t in found if t is not None}


def _response(tensors):
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, v) for n, v in tensors.items()])


def _error(message, code):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


class BlsError(RuntimeError):
    pass


async def _call(model, tensors, outputs, key, flags, timeout):
    request = pb_utils.InferenceRequest(model_name=model, inputs=[pb_utils.Tensor(n, v) for n, v in tensors.items()],
                                        requested_output_names=outputs, correlation_id=key, flags=flags)
    try:
        response = await asyncio.wait_for(request.async_exec(), timeout)
    except asyncio.TimeoutError:
        raise BlsError(f"{model}: no answer in {timeout:g} s") from None
    if response.has_error():
        raise BlsError(f"{model}: {response.error().message()}")
    return {name: pb_utils.get_output_tensor_by_name(response, name).as_numpy() for name in outputs}


class Metrics:
    """Prometheus series on Triton's metrics endpoint, labelled by spec_mode."""

    def __init__(self):
        fam = pb_utils.MetricFamily
        self.requests = fam("adaflash_requests_total", "Finished generation requests", fam.COUNTER)
        self.tokens = fam("adaflash_tokens_total", "Tokens committed to outputs", fam.COUNTER)
        self.forwards = fam("adaflash_target_forwards_total", "Target forward passes (prefill and verify)", fam.COUNTER)
        self.active = fam("adaflash_active_sequences", "Sequences being generated", fam.GAUGE)
        self.accepted = fam("adaflash_accepted_tokens", "Accepted draft tokens per verify step", fam.HISTOGRAM)
        self.drafted = fam("adaflash_verified_draft_len", "Draft tokens sent to verification per step", fam.HISTOGRAM)
        # A family must outlive its series: both are kept.
        self.queued_family = fam("adaflash_queued_requests", "Requests waiting for a sequence slot", fam.GAUGE)
        self.queued = self.queued_family.Metric(labels={})
        self.queue_wait_family = fam("adaflash_queue_wait_seconds", "Time admitted requests waited for a sequence slot",
                                     fam.HISTOGRAM)
        self.queue_wait = self.queue_wait_family.Metric(labels={}, buckets=WAIT_BUCKETS)
        self._series = {}

    def series(self, family, **labels):
        key = (id(family), tuple(sorted(labels.items())))
        if key not in self._series:
            extra = {"buckets": STEP_BUCKETS} if family in (self.accepted, self.drafted) else {}
            self._series[key] = family.Metric(labels=labels, **extra)
        return self._series[key]

    def count(self, seq):
        mode = seq.request.mode
        self.series(self.requests, spec_mode=mode, finish_reason=seq.finish_reason or "").increment(1)
        self.series(self.tokens, spec_mode=mode).increment(len(seq.output))
        self.series(self.forwards, spec_mode=mode).increment(1 + len(seq.steps))
        for s in seq.steps:
            self.series(self.accepted, spec_mode=mode).observe(s.accepted)
            self.series(self.drafted, spec_mode=mode).observe(s.draft_len)


class TritonPythonModel:
    def initialize(self, args):
        torch.set_num_threads(1)  # bookkeeping only: leave the cores to the target and the drafter
        params = protocol.model_parameters(json.loads(args["model_config"]))
        with open(f"{params['target_dir']}/config.json") as f:
            self.target_config = TargetConfig.from_hf(json.load(f))
        self.has_drafter = bool(params["drafter_dir"])
        block_size, self.feature_width, cost = DEFAULT_BLOCK_SIZE, 0, None
        if self.has_drafter:
            with open(f"{params['drafter_dir']}/config.json") as f:
                dcfg = DrafterConfig.from_hf(json.load(f))
            block_size = dcfg.block_size
            self.feature_width = len(dcfg.target_layer_ids) * dcfg.hidden_size
            with open(params["cost_table"]) as f:
                cost = CostModel.from_json(json.load(f))
        self.planner = Planner(LengthController(cost, block_size))
        self.max_len = int(params["max_len"])
        self.metrics = Metrics()
        self.admission = Admission(int(params["max_active"]), int(params["max_queued"]),
                                   float(params["max_queue_wait_s"]), on_queue=self.metrics.queued.set)
        self.drafter_timeout = float(params["drafter_timeout_s"])
        self.target_timeout = float(params["target_timeout_s"])
        self.repository = os.path.dirname(args["model_repository"])
        self.cancelled = set()  # sequence ids whose client went away (told by postprocessing)
        self.ids = itertools.count(int.from_bytes(os.urandom(4), "little") << 20)

    async def execute(self, requests):
        await asyncio.gather(*(self._serve(r) for r in requests))
        return None

    def _parse(self, tensors):
        generation = protocol.decode_generation(tensors)
        validate_request(generation.request, self.target_config.vocab_size, self.max_len, self.planner.block_size,
                         self.has_drafter)
        return generation

    async def _serve(self, request):
        sender = request.get_response_sender()
        tensors = _inputs(request)
        cancel = protocol.decode_cancel(tensors)
        if cancel is not None:
            self.cancelled.add(cancel)
            sender.send(flags=FINAL)
            return
        try:
            generation = self._parse(tensors)
        except ValueError as exc:
            sender.send(_error(f"INVALID_ARGUMENT: {exc}", pb_utils.TritonError.INVALID_ARG), flags=FINAL)
            return
        if not await self._admit(sender):
            return
        req, stream = generation.request, generation.stream
        key = next(self.ids)
        opened = {"target": False, "drafter": False, "drafter_model": self._drafter_model()}
        gauge = self.metrics.series(self.metrics.active, spec_mode=req.mode)
        gauge.increment(1)
        sent = {"tokens": 0, "steps": 0}  # what the stream has carried so far
        final = _error("generation failed: interrupted", pb_utils.TritonError.INTERNAL)
        try:
            seq = await run_request(
                key, req, generation.stop_ids, self.planner, self.max_len,
                prefill=lambda tokens: self._target(key, TargetCall(Op.PREFILL, tokens, req.sampling), opened),
                verify=lambda feed: self._target(key, TargetCall(Op.VERIFY, feed), opened),
                draft=(lambda call: self._draft(call, opened)) if self.has_drafter else None,
                emit=lambda s, out_from, steps_from: self._emit(sender, s, stream, sent),
                cancelled=lambda: key in self.cancelled or sender.is_cancelled(),
                active=lambda: self.admission.active,
            )
            final = None if seq.finish_reason == "cancelled" else _response(
                protocol.encode_step_response(seq, sent["tokens"], sent["steps"], final=True))
            self.metrics.count(seq)
        except Exception as exc:  # noqa: BLE001 - report any failure to the client instead of hanging it
            final = _error(f"generation failed: {exc}", pb_utils.TritonError.INTERNAL)
        finally:
            self.cancelled.discard(key)
            gauge.increment(-1)
            # Released before the final response: once a request has its answer, nothing of it is left in
            # the models (a drain that waits for the answers can then stop the server at once).
            await self._release(key, opened)
            if final is None:
                sender.send(flags=FINAL)
            else:
                sender.send(final, flags=FINAL)
            self.admission.leave()  # after the release: the next request may take the models' slot at once

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
        self.metrics.queue_wait.observe(waited)
        return True

    async def _target(self, key, call, opened):
        flags = START if call.op is Op.PREFILL else 0
        out = await _call(protocol.TARGET, protocol.encode_target_call(call), TARGET_OUTPUTS, key, flags,
                          self.target_timeout)
        opened["target"] = True
        return protocol.decode_target_result(out, self.feature_width)

    async def _draft(self, call, opened):
        flags = 0 if opened["drafter"] else START
        opened["drafter"] = True
        out = await _call(opened["drafter_model"], protocol.encode_draft_call(call, self.admission.active),
                          DRAFTER_OUTPUTS, call.key, flags, self.drafter_timeout)
        return protocol.decode_draft(out)

    def _drafter_model(self):
        """The newest loaded drafter (`drafter`, or a published `drafter_<n>`): a request keeps it to the
        end, because the drafter's per-sequence context lives in that model."""
        if not self.has_drafter:
            return None
        newest_first = reversed(protocol.drafter_models_in(os.listdir(self.repository)))
        return next((name for name in newest_first if pb_utils.is_model_ready(name)), protocol.DRAFTER)

    async def _release(self, key, opened):
        """END the sequence in each model that saw it: frees its cache slot and Triton's sequence slot."""
        for model in ("target", "drafter"):
            if opened[model]:
                name = opened["drafter_model"] if model == "drafter" else protocol.TARGET
                try:
                    await _call(name, protocol.encode_release(), [], key, END, self.target_timeout)
                except Exception as exc:  # noqa: BLE001 - the models also reclaim idle sequences themselves
                    pb_utils.Logger.log_error(f"releasing sequence {key} in {name} failed: {exc}")

    async def _emit(self, sender, seq, stream, sent):
        """Stream what the last step produced; the final response waits for the release (`_serve`)."""
        if stream and not seq.finished and not sender.is_cancelled():
            sender.send(_response(protocol.encode_step_response(seq, sent["tokens"], sent["steps"], final=False)))
            sent["tokens"], sent["steps"] = len(seq.output), len(seq.steps)
