"""The DFlash drafter: draft calls of many sequences in one forward, each cut to the length its mode picks.

Calls carry an `op` and the sequence's correlation id; the core's DrafterSlots keeps each
sequence's injected-context cache under that id. The drafter uses the target's embedding and
LM head, so the target weights are loaded here too. The weights are in `1/weights/`: a
published drafter is a copy of this model under another name (drafter_2, ...) with its own
weights, loaded beside the running one.
"""

import json
import os

import triton_python_backend_utils as pb_utils

from adaflash.decoding.costs import CostModel
from adaflash.decoding.policy import LengthController
from adaflash.models.drafter import DFlashDrafter
from adaflash.models.target import Transformer
from adaflash.serving import protocol
from adaflash.serving.protocol import Op
from adaflash.serving.slots import DrafterSlots

INPUTS, _ = protocol.MODEL_TENSORS[protocol.DRAFTER]


def _inputs(request):
    found = ((s.name, pb_utils.get_input_tensor_by_name(request, s.name)) for s in INPUTS)
    return {name: t.as_numpy() for name, t in found if t is not None}


def _response(tensors):
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, v) for n, v in tensors.items()])


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = protocol.model_parameters(config)
        weights = os.path.join(args["model_repository"], args["model_version"], "weights")
        drafter = DFlashDrafter.from_pretrained(weights)
        with open(params["cost_table"]) as f:
            controller = LengthController(CostModel.from_json(json.load(f)), drafter.config.block_size)
        self.slots = DrafterSlots(drafter, Transformer.from_pretrained(params["target_dir"]), config["max_batch_size"],
                                  int(params["max_len"]), controller, float(params["idle_timeout_s"]))

    def execute(self, requests):
        self.slots.release_stale()
        responses = [None] * len(requests)
        calls, rows, hints = [], [], []
        for i, request in enumerate(requests):
            tensors = _inputs(request)
            try:
                op = protocol.decode_op(tensors, (Op.DRAFT, Op.RELEASE))
                if op is Op.RELEASE:
                    self.slots.release(request.correlation_id())
                    responses[i] = _response({})
                    continue
                call = protocol.decode_draft_call(tensors, request.correlation_id())
                hint = protocol.decode_batch_hint(tensors)
            except ValueError as exc:
                responses[i] = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG))
                continue
            calls.append(call)
            hints.append(hint)
            rows.append(i)
        if calls:
            for i, draft in zip(rows, self.slots.draft(calls, batch=max(max(hints), len(calls)))):
                responses[i] = _response(protocol.encode_draft(draft))
        return responses
