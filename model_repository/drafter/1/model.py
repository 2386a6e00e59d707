"""The DFlash drafter: one call per engine step drafts a block for every sequence it names in one forward.

The core's DrafterSlots keeps each sequence's injected-context cache under its key. The
drafter reads the target's embedding and LM head, loaded alone from the target's checkpoint
(the server's one full copy of the target is in the `target` model). The weights are in
`1/weights/`: a published drafter is a copy of this model under another name (drafter_2, ...)
with its own weights, loaded beside the running one. The `drafter_backend` parameter picks what runs the block
forward: PyTorch, or ONNX Runtime on a graph exported as the model loads (`adaflash.models.onnx_drafter`).
"""

import json
import os

import triton_python_backend_utils as pb_utils

from adaflash.serving import protocol
from adaflash.serving.metrics import CacheGauges
from adaflash.serving.protocol import Op
from adaflash.serving.slots import OccupancyReporter, load_drafter


def _inputs(request):
    return {t.name(): t.as_numpy() for t in request.inputs()}


def _response(tensors):
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, v) for n, v in tensors.items()])


class TritonPythonModel:
    def initialize(self, args):
        params = protocol.model_parameters(json.loads(args["model_config"]))
        weights = os.path.join(args["model_repository"], args["model_version"], "weights")
        place = protocol.model_placement(params, args["model_instance_kind"], args["model_instance_device_id"])
        self.slots = load_drafter(params, place, weights)
        self.gauges = CacheGauges(pb_utils.MetricFamily, args["model_name"])  # slots held, the context cache's blocks
        self.reporter = OccupancyReporter(self.slots, self.gauges.write)
        self.reporter.start()

    def finalize(self):
        self.reporter.stop()

    def execute(self, requests):
        return [self._one(r) for r in requests]

    def _one(self, request):
        tensors = _inputs(request)
        try:
            if protocol.decode_op(tensors, (Op.DRAFT, Op.RELEASE)) is Op.RELEASE:
                self.slots.release_all(protocol.decode_keys(tensors))
                return _response({})
            timed = self.slots.run(protocol.decode_draft_call(tensors))
        except (ValueError, KeyError) as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG))
        except RuntimeError as exc:  # no free slot
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc), pb_utils.TritonError.UNAVAILABLE))
        return _response(protocol.encode_draft(timed.value, timed.ms))
