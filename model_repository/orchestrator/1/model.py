"""Decoupled BLS orchestrator: one coroutine per request runs prefill, then draft -> verify -> stream.

The loop itself is the core's `run_request`; this file turns its calls into BLS requests
(correlation id = the request's sequence id, START on a model's first call, END on release)
and its steps into streamed responses, and keeps the Prometheus metrics.
"""

import asyncio
import itertools
import json
import os

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from adaflash.models.drafter import DrafterConfig
from adaflash.decoding.engine import Request, validate_request
from adaflash.decoding.policy import CostModel, LengthController
from adaflash.decoding.sampling import SamplingParams
from adaflash.serving.session import run_request
from adaflash.models.target import TargetConfig
from adaflash.decoding.steps import StepResult
from adaflash_build.repository import DRAFTER_NAME

PREFILL, VERIFY, RELEASE, DRAFT = 0, 1, 2, 1
START, END = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START, pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
STEP_BUCKETS = [float(b) for b in range(17)]
INPUTS = ("input_ids", "stop_ids", "max_tokens", "stream", "temperature", "top_k", "top_p", "random_seed",
          "spec_mode", "max_draft")


def _scalar(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]


def _tensor(name, value, dtype):
    return pb_utils.Tensor(name, np.asarray(value, dtype=dtype).reshape(1, -1))


class BlsError(RuntimeError):
    pass


async def _call(model, inputs, outputs, key, flags, timeout):
    request = pb_utils.InferenceRequest(model_name=model, inputs=inputs, requested_output_names=outputs,
                                        correlation_id=key, flags=flags)
    try:
        response = await asyncio.wait_for(request.async_exec(), timeout)
    except asyncio.TimeoutError:
        raise BlsError(f"{model}: no answer in {timeout:g} s") from None
    if response.has_error():
        raise BlsError(f"{model}: {response.error().message()}")
    return {name: pb_utils.get_output_tensor_by_name(response, name).as_numpy() for name in outputs}


def _step_result(out, feature_width):
    feats = out["features"].reshape(-1, feature_width) if feature_width else None
    return StepResult(committed=out["committed"].reshape(-1).tolist(), accepted=int(out["accepted"].reshape(-1)[0]),
                      expected_accepted=float(out["expected_accepted"].reshape(-1)[0]),
                      features=None if feats is None else torch.from_numpy(np.ascontiguousarray(feats)))


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
        self._series = {}

    def series(self, family, **labels):
        key = (id(family), tuple(sorted(labels.items())))
        if key not in self._series:
            extra = {"buckets": STEP_BUCKETS} if family in (self.accepted, self.drafted) else {}
            self._series[key] = family.Metric(labels=labels, **extra)
        return self._series[key]


class TritonPythonModel:
    def initialize(self, args):
        torch.set_num_threads(1)  # bookkeeping only: leave the cores to the target and the drafter
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config["parameters"].items()}
        with open(f"{params['target_dir']}/config.json") as f:
            self.target_config = TargetConfig.from_hf(json.load(f))
        self.has_drafter = bool(params["drafter_dir"])
        block_size, self.feature_width, cost = 16, 0, None
        if self.has_drafter:
            with open(f"{params['drafter_dir']}/config.json") as f:
                dcfg = DrafterConfig.from_hf(json.load(f))
            block_size = dcfg.block_size
            self.feature_width = len(dcfg.target_layer_ids) * dcfg.hidden_size
            with open(params["cost_table"]) as f:
                cost = CostModel.from_json(json.load(f))
        self.controller = LengthController(cost, block_size)
        self.max_len = int(params["max_len"])
        self.max_active = int(params["max_active"])
        self.drafter_timeout = float(params["drafter_timeout_s"])
        self.target_timeout = float(params["target_timeout_s"])
        self.repository = os.path.dirname(args["model_repository"])
        self.active = 0
        self.cancelled = set()  # sequence ids whose client went away (told by postprocessing)
        self.ids = itertools.count(int.from_bytes(os.urandom(4), "little") << 20)
        self.metrics = Metrics()

    async def execute(self, requests):
        await asyncio.gather(*(self._serve(r) for r in requests))
        return None

    def _parse(self, request):
        missing = [n for n in INPUTS if pb_utils.get_input_tensor_by_name(request, n) is None]
        if missing:
            raise ValueError(f"{missing[0]}: required")
        stream = bool(_scalar(request, "stream"))
        mode = _scalar(request, "spec_mode").decode()
        max_draft = int(_scalar(request, "max_draft"))
        req = Request(
            prompt_ids=pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy().reshape(-1).tolist(),
            max_tokens=int(_scalar(request, "max_tokens")),
            mode=mode,
            sampling=SamplingParams(float(_scalar(request, "temperature")), int(_scalar(request, "top_k")),
                                    float(_scalar(request, "top_p")), int(_scalar(request, "random_seed"))),
            max_draft=None if max_draft < 0 else max_draft,
        )
        validate_request(req, self.target_config.vocab_size, self.max_len, self.controller.block_size,
                         self.has_drafter)
        stops = frozenset(pb_utils.get_input_tensor_by_name(request, "stop_ids").as_numpy().reshape(-1).tolist())
        return req, stops, stream

    async def _serve(self, request):
        sender = request.get_response_sender()
        cancel = pb_utils.get_input_tensor_by_name(request, "cancel_sequence")
        if cancel is not None:
            self.cancelled.add(int(cancel.as_numpy().reshape(-1)[0]))
            sender.send(flags=FINAL)
            return
        try:
            req, stops, stream = self._parse(request)
        except ValueError as exc:
            error = pb_utils.TritonError(f"INVALID_ARGUMENT: {exc}", pb_utils.TritonError.INVALID_ARG)
            sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
            return
        if self.active >= self.max_active:
            message = f"UNAVAILABLE: server at capacity: {self.active} active sequences (max_active {self.max_active})"
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message, pb_utils.TritonError.UNAVAILABLE)),
                        flags=FINAL)
            return
        key = next(self.ids)
        opened = {"target": False, "drafter": False, "drafter_model": self._drafter_model()}
        self.active += 1
        gauge = self.metrics.series(self.metrics.active, spec_mode=req.mode)
        gauge.increment(1)
        sent = [0]
        try:
            seq = await run_request(
                key, req, stops, self.controller, self.max_len,
                prefill=lambda tokens: self._prefill(key, req, tokens, opened),
                verify=lambda feed: self._verify(key, feed),
                draft=(lambda call: self._draft(call, opened)) if self.has_drafter else None,
                emit=lambda s, out_from, steps_from: self._emit(sender, s, stream, sent, steps_from),
                cancelled=lambda: key in self.cancelled or sender.is_cancelled(),
                active=lambda: self.active,
            )
            if seq.finish_reason == "cancelled":
                sender.send(flags=FINAL)
            elif not stream:
                self._send(sender, seq, 0, 0, final=True)
            self._count(seq)
        except Exception as exc:  # noqa: BLE001 - report any failure to the client instead of hanging it
            error = pb_utils.TritonError(f"generation failed: {exc}", pb_utils.TritonError.INTERNAL)
            sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
        finally:
            self.cancelled.discard(key)
            self.active -= 1
            gauge.increment(-1)
            await self._release(key, opened)

    async def _prefill(self, key, req, tokens, opened):
        sp = req.sampling
        inputs = [
            _tensor("op", [PREFILL], np.int32), _tensor("tokens", tokens, np.int32),
            _tensor("temperature", [sp.temperature], np.float32), _tensor("top_k", [sp.top_k], np.int32),
            _tensor("top_p", [sp.top_p], np.float32), _tensor("random_seed", [sp.seed], np.uint64),
        ]
        out = await _call("target", inputs, ["committed", "accepted", "expected_accepted", "features"], key, START,
                          self.target_timeout)
        opened["target"] = True
        return _step_result(out, self.feature_width)

    async def _verify(self, key, feed):
        inputs = [_tensor("op", [VERIFY], np.int32), _tensor("tokens", feed, np.int32)]
        out = await _call("target", inputs, ["committed", "accepted", "expected_accepted", "features"], key, 0,
                          self.target_timeout)
        return _step_result(out, self.feature_width)

    async def _draft(self, call, opened):
        inputs = [
            _tensor("op", [DRAFT], np.int32),
            pb_utils.Tensor("features", call.features.numpy().astype(np.float32)[None]),
            _tensor("anchor", [call.anchor], np.int32), _tensor("spec_mode", [call.mode.encode()], object),
            _tensor("cap", [call.cap], np.int32), _tensor("rates", call.rates, np.float32),
            _tensor("batch_hint", [self.active], np.int32),
        ]
        flags = 0 if opened["drafter"] else START
        opened["drafter"] = True
        out = await _call(opened["drafter_model"], inputs, ["draft", "head_ratio"], call.key, flags,
                          self.drafter_timeout)
        return out["draft"].reshape(-1).tolist()

    def _drafter_model(self):
        """The newest loaded drafter (`drafter`, or a published `drafter_<n>`): a request keeps it to the
        end, because the drafter's per-sequence context lives in that model."""
        if not self.has_drafter:
            return None
        found = [(int(m.group(1) or 1), name) for name in os.listdir(self.repository)
                 if (m := DRAFTER_NAME.fullmatch(name))]
        ready = (name for _, name in sorted(found, reverse=True) if pb_utils.is_model_ready(name))
        return next(ready, "drafter")

    async def _release(self, key, opened):
        """END the sequence in each model that saw it: frees its cache slot and Triton's sequence slot."""
        inputs = {"target": [_tensor("op", [RELEASE], np.int32), _tensor("tokens", [], np.int32)],
                  "drafter": [_tensor("op", [RELEASE], np.int32)]}
        for model in ("target", "drafter"):
            if opened[model]:
                name = opened["drafter_model"] if model == "drafter" else model
                try:
                    await _call(name, inputs[model], [], key, END, self.target_timeout)
                except Exception as exc:  # noqa: BLE001 - the models also reclaim idle sequences themselves
                    pb_utils.Logger.log_error(f"releasing sequence {key} in {name} failed: {exc}")

    async def _emit(self, sender, seq, stream, sent, steps_from):
        if stream and not sender.is_cancelled():
            self._send(sender, seq, sent[0], steps_from, final=seq.finished)
            sent[0] = len(seq.output)

    def _send(self, sender, seq, sent_len, steps_from, final):
        steps = seq.steps[steps_from:]
        out = [
            _tensor("output_ids", seq.output, np.int32), _tensor("sent_len", [sent_len], np.int32),
            _tensor("is_final", [final], bool), _tensor("num_output_tokens", [len(seq.output)], np.int32),
            _tensor("target_forwards", [1 + len(seq.steps)], np.int32),
            _tensor("accepted_per_step", [s.accepted for s in steps], np.int32),
            _tensor("draft_len_per_step", [s.draft_len for s in steps], np.int32),
            _tensor("finish_reason", [(seq.finish_reason or "").encode()], object),
            _tensor("sequence_id", [seq.id], np.uint64),
        ]
        sender.send(pb_utils.InferenceResponse(output_tensors=out), flags=FINAL if final else 0)

    def _count(self, seq):
        mode = seq.request.mode
        m = self.metrics
        m.series(m.requests, spec_mode=mode, finish_reason=seq.finish_reason or "").increment(1)
        m.series(m.tokens, spec_mode=mode).increment(len(seq.output))
        m.series(m.forwards, spec_mode=mode).increment(1 + len(seq.steps))
        for s in seq.steps:
            m.series(m.accepted, spec_mode=mode).observe(s.accepted)
            m.series(m.drafted, spec_mode=mode).observe(s.draft_len)
