"""The target LLM: one call per engine step prefills or verifies every sequence it names in one forward.

The core's TargetSlots keeps each sequence's KV slot and sampling generator under its key.
The payloads are protocol.py's.
"""

import json

import triton_python_backend_utils as pb_utils

from adaflash.serving.threads import spin_target_threads

spin_target_threads()  # before torch loads: the target's idle OpenMP threads spin briefly instead of sleeping

from adaflash.serving import protocol  # noqa: E402
from adaflash.serving.metrics import CacheGauges  # noqa: E402
from adaflash.serving.slots import OccupancyReporter, load_target  # noqa: E402

OPS = (protocol.Op.STEP, protocol.Op.RELEASE, protocol.Op.COSTS)


def _inputs(request):
    return {t.name(): t.as_numpy() for t in request.inputs()}


def _response(tensors):
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, v) for n, v in tensors.items()])


def _error(exc, code):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc), code))


class TritonPythonModel:
    def initialize(self, args):
        params = protocol.model_parameters(json.loads(args["model_config"]))
        place = protocol.model_placement(params, args["model_instance_kind"], args["model_instance_device_id"])
        # The orchestrator's planner asks for the cost table (Op.COSTS) before its first step.
        self.slots, self.cost = load_target(params, place)
        self.gauges = CacheGauges(pb_utils.MetricFamily, args["model_name"])  # slots held, the KV cache's blocks
        self.reporter = OccupancyReporter(self.slots, self.gauges.write)
        self.reporter.start()

    def finalize(self):
        self.reporter.stop()

    def execute(self, requests):
        return [self._one(r) for r in requests]

    def _one(self, request):
        try:
            tensors = _inputs(request)
            if protocol.decode_op(tensors, OPS) is protocol.Op.COSTS:
                return self._costs()
            call = protocol.decode_target_call(tensors)
            timed = self.slots.run(call)
        except (ValueError, KeyError) as exc:
            return _error(exc, pb_utils.TritonError.INVALID_ARG)
        except RuntimeError as exc:  # no free slot
            return _error(exc, pb_utils.TritonError.UNAVAILABLE)
        if call.op is protocol.Op.RELEASE:
            return _response({})
        return _response(protocol.encode_target_result(timed.value, timed.ms))

    def _costs(self):
        if self.cost is None:
            return _error("no cost table: this server has no drafter", pb_utils.TritonError.UNSUPPORTED)
        return _response(protocol.encode_cost_table(self.cost))
