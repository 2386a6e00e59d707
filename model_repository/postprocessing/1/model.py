"""Turn the orchestrator's token ids into the text delta of this response; statistics pass through.

Triton's ensemble marks a cancelled client request only on steps scheduled after the
cancellation, so this step sees it and the running orchestrator does not: this step tells
the orchestrator (a `cancel_sequence` request), which then stops and frees the sequence.
"""

import json

import torch
import triton_python_backend_utils as pb_utils

from adaflash.models.tokenizer import load_tokenizer
from adaflash.serving import protocol
from adaflash.serving.api import text_delta

INPUTS, _ = protocol.MODEL_TENSORS["postprocessing"]


def _tensors(tensors):
    return [pb_utils.Tensor(n, v) for n, v in tensors.items()]


class TritonPythonModel:
    def initialize(self, args):
        torch.set_num_threads(1)  # tokenising only: leave the cores to the target and the drafter
        params = protocol.model_parameters(json.loads(args["model_config"]))
        self.tokenizer = load_tokenizer(params["tokenizer_dir"])

    def execute(self, requests):
        responses = []
        for request in requests:
            tensors = {s.name: pb_utils.get_input_tensor_by_name(request, s.name).as_numpy() for s in INPUTS}
            step = protocol.decode_step_response(tensors)
            if request.is_cancelled():
                self._cancel(step.sequence_id)
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED)))
                continue
            text = text_delta(self.tokenizer, step.output_ids, step.sent_len, step.final)
            out = protocol.encode_text_response(text, tensors)
            responses.append(pb_utils.InferenceResponse(output_tensors=_tensors(out)))
        return responses

    def _cancel(self, sequence_id):
        request = pb_utils.InferenceRequest(model_name=protocol.ORCHESTRATOR, requested_output_names=[],
                                            inputs=_tensors(protocol.encode_cancel(sequence_id)))
        for response in request.exec(decoupled=True):
            if response.has_error():
                pb_utils.Logger.log_error(f"cancelling sequence {sequence_id}: {response.error().message()}")
