"""The public model, a decoupled BLS orchestrator: a thin adapter of the core's served loop to Triton.

The loop, its checks, pacing and metrics are `adaflash.serving.orchestrator`'s (transport-free); this file maps
Triton's requests and response senders to it, makes its calls to the `target` and `drafter` models as BLS requests,
and places the target in this process when `target_in_orchestrator` says so. Every payload is protocol.py's.
"""

import asyncio
import json
import os
import queue
import threading
from functools import partial

import triton_python_backend_utils as pb_utils

from adaflash.serving.threads import spin_target_threads

spin_target_threads()  # before torch loads: the target's threads, when it runs here (else this process uses one)

import torch  # noqa: E402

from adaflash.decoding.backend import BackendError  # noqa: E402
from adaflash.serving import protocol  # noqa: E402
from adaflash.serving.metrics import CacheGauges  # noqa: E402
from adaflash.serving.orchestrator import build_orchestrator  # noqa: E402
from adaflash.serving.remote import DrafterInProcess, TargetInProcess  # noqa: E402
from adaflash.serving.slots import OccupancyReporter, load_drafter, load_target  # noqa: E402
from adaflash_contract.errors import UNAVAILABLE, RequestError  # noqa: E402

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _run_job(job):
    try:
        job()
    except Exception as exc:  # noqa: BLE001 - a client gone mid-stream must not stop the other streams
        pb_utils.Logger.log_error(f"sending a response or a metric failed: {exc}")


class TritonStream:
    """A request's response sender as the orchestrator's `Stream`."""

    def __init__(self, sender):
        self.sender = sender

    def send(self, tensors, final):
        flags = FINAL if final else 0
        if tensors is None:
            self.sender.send(flags=flags)
        else:
            out = [pb_utils.Tensor(n, v) for n, v in tensors.items()]
            self.sender.send(pb_utils.InferenceResponse(output_tensors=out), flags=flags)

    def refuse(self, error: RequestError):
        code = pb_utils.TritonError.UNAVAILABLE if error.status == UNAVAILABLE else pb_utils.TritonError.INVALID_ARG
        self._error(error.wire(), code)

    def fail(self, message):
        self._error(message, pb_utils.TritonError.INTERNAL)

    def _error(self, message, code):
        self.sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code)), flags=FINAL)

    def is_cancelled(self):
        return self.sender.is_cancelled()


class TritonPythonModel:
    def initialize(self, args):
        params = protocol.model_parameters(json.loads(args["model_config"]))
        self.target = self.drafter = None
        self.reporters = []
        if params["target_in_orchestrator"] == "True":
            self._models_here(params, args)
        torch.set_num_threads(1)  # bookkeeping only: leave the cores to the target (its thread keeps its count)
        # Responses and metric updates are calls into Triton (each a round trip to the server process). With the
        # target a model of its own they run on a thread of their own, in FIFO order, so that the step loop sends
        # the next call to the target first (one queue keeps each stream in order): `_later`.
        self.outbox = queue.SimpleQueue()
        if self.target is None:
            threading.Thread(target=self._run_outbox, name="outbox", daemon=True).start()
        self.timeouts = {protocol.TARGET: float(params["target_timeout_s"]),
                         protocol.DRAFTER: float(params["drafter_timeout_s"])}
        self.repository = os.path.dirname(args["model_repository"])
        self.orchestrator = build_orchestrator(params, self._call, self._newest_drafter, self.target,
                                               pb_utils.MetricFamily, self._later, pb_utils.Logger.log_error,
                                               self.drafter)

    async def execute(self, requests):
        self.orchestrator.start()
        await asyncio.gather(*(self._serve(r) for r in requests))
        return None

    async def _serve(self, request):
        tensors = {t.name(): t.as_numpy() for t in request.inputs()}
        await self.orchestrator.serve(tensors, json.loads(request.parameters()),
                                      TritonStream(request.get_response_sender()))

    def _models_here(self, params, args):
        """The target in this process, on the device Triton gave this instance, with its cost table, and the drafter
        beside it where `drafter_in_orchestrator` says so; each with the cache gauges its model would report (slots
        held, the leak check; the cache's blocks and bytes)."""
        place = protocol.model_placement(params, args["model_instance_kind"], args["model_instance_device_id"])
        self.target = TargetInProcess(partial(load_target, params, place))
        self._report(self.target.slots, protocol.TARGET)
        if params["drafter_in_orchestrator"] == "True" and params["drafter_dir"]:
            load = partial(load_drafter, params, place, params["drafter_dir"], self.target.slots.target)
            self.drafter = DrafterInProcess(self.target, load)
            self._report(self.drafter.slots, protocol.DRAFTER)

    def _report(self, slots, model):
        reporter = OccupancyReporter(slots, CacheGauges(pb_utils.MetricFamily, model).write)
        reporter.start()
        self.reporters.append(reporter)

    def finalize(self):
        self.orchestrator.stop()
        for reporter in self.reporters:
            reporter.stop()
        if self.target is not None:
            self.target.close()
        self.outbox.put(None)

    def _later(self, call, *args):
        """Run `call(*args)` on the outbox thread while the target is a model of its own; with the target here, at
        once, on the loop's thread: between the target's forwards, since a thread sending during a forward takes
        a core from the forward's threads (docs/history.md, round 14)."""
        if self.target is None:
            self.outbox.put(partial(call, *args))
        else:
            _run_job(partial(call, *args))

    def _run_outbox(self):
        while (job := self.outbox.get()) is not None:
            _run_job(job)

    async def _call(self, model, tensors):
        """One BLS request; BackendError when the model fails or does not answer in time."""
        outputs = protocol.result_names(protocol.Op(int(tensors["op"][0])))
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
        """The newest loaded drafter (`drafter`, or a published `drafter_<n>`; the one in this process where no
        model of them is), None when none is ready."""
        newest_first = reversed(protocol.drafter_models_in(os.listdir(self.repository)))
        here = protocol.DRAFTER if self.drafter is not None else None
        return next((name for name in newest_first if pb_utils.is_model_ready(name)), here)
