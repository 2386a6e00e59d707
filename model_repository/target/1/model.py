"""The target LLM: prefill and verify calls of many sequences batched into one forward each.

Calls carry an `op` and the sequence's correlation id; the core's TargetSlots keeps each
sequence's KV slot and sampling generator under that id. The payloads are protocol.py's.
"""

import json

import triton_python_backend_utils as pb_utils

from adaflash.serving.threads import spin_target_threads

spin_target_threads()  # before torch loads: the target's idle OpenMP threads spin briefly instead of sleeping

from adaflash.models.drafter import DrafterConfig  # noqa: E402
from adaflash.models.target import Transformer  # noqa: E402
from adaflash.serving import protocol  # noqa: E402
from adaflash.serving.protocol import Op  # noqa: E402
from adaflash.serving.slots import TargetSlots  # noqa: E402

INPUTS, _ = protocol.MODEL_TENSORS[protocol.TARGET]


def _inputs(request):
    found = ((s.name, pb_utils.get_input_tensor_by_name(request, s.name)) for s in INPUTS)
    return {name: t.as_numpy() for name, t in found if t is not None}


def _response(tensors):
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, v) for n, v in tensors.items()])


def _error(exc, unavailable=False):
    code = pb_utils.TritonError.UNAVAILABLE if unavailable else pb_utils.TritonError.INVALID_ARG
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc), code))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = protocol.model_parameters(config)
        capture = None
        if params["drafter_dir"]:
            with open(f"{params['drafter_dir']}/config.json") as f:
                capture = DrafterConfig.from_hf(json.load(f)).target_layer_ids
        self.slots = TargetSlots(Transformer.from_pretrained(params["target_dir"]), config["max_batch_size"],
                                 int(params["max_len"]), capture, float(params["idle_timeout_s"]))

    def execute(self, requests):
        self.slots.release_stale()
        responses = [None] * len(requests)
        batches = {Op.PREFILL: [], Op.VERIFY: []}
        for i, request in enumerate(requests):
            key = request.correlation_id()
            try:
                call = protocol.decode_target_call(_inputs(request))
                if call.op is Op.PREFILL:
                    self.slots.open(key, call.tokens, call.sampling)
                elif call.op is Op.VERIFY:
                    self.slots.check_verify(key, call.tokens)
                else:
                    self.slots.release(key)
                    responses[i] = _response({})
                    continue
            except (ValueError, KeyError) as exc:
                responses[i] = _error(exc)
                continue
            except RuntimeError as exc:  # no free slot
                responses[i] = _error(exc, unavailable=True)
                continue
            batches[call.op].append((i, key, call.tokens))
        for op, run in ((Op.PREFILL, self.slots.prefill), (Op.VERIFY, self.slots.verify)):
            if batches[op]:
                results = run([(key, tokens) for _, key, tokens in batches[op]])
                for (i, _, _), result in zip(batches[op], results):
                    responses[i] = _response(protocol.encode_target_result(result))
        return responses
