"""Turn the orchestrator's token ids into the text delta of this response; statistics pass through.

Triton's ensemble marks a cancelled client request only on steps scheduled after the
cancellation, so this step sees it and the running orchestrator does not: this step tells
the orchestrator (a `cancel_sequence` request), which then stops and frees the sequence.
"""

import json

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from adaflash.serving.api import text_delta
from adaflash.models.tokenizer import load_tokenizer

PASS_THROUGH = ("num_output_tokens", "target_forwards", "accepted_per_step", "draft_len_per_step", "finish_reason")


class TritonPythonModel:
    def initialize(self, args):
        torch.set_num_threads(1)  # tokenising only: leave the cores to the target and the drafter
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        self.tokenizer = load_tokenizer(params["tokenizer_dir"])

    def execute(self, requests):
        responses = []
        for request in requests:
            if request.is_cancelled():
                self._cancel(pb_utils.get_input_tensor_by_name(request, "sequence_id").as_numpy())
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED)))
                continue
            ids = pb_utils.get_input_tensor_by_name(request, "output_ids").as_numpy().reshape(-1).tolist()
            sent = int(pb_utils.get_input_tensor_by_name(request, "sent_len").as_numpy().reshape(-1)[0])
            final = bool(pb_utils.get_input_tensor_by_name(request, "is_final").as_numpy().reshape(-1)[0])
            text = text_delta(self.tokenizer, ids, sent, final)
            out = [pb_utils.Tensor("text_output", np.array([[text.encode()]], dtype=object))]
            for name in PASS_THROUGH:
                out.append(pb_utils.Tensor(f"out_{name}", pb_utils.get_input_tensor_by_name(request, name).as_numpy()))
            responses.append(pb_utils.InferenceResponse(output_tensors=out))
        return responses

    def _cancel(self, sequence_id):
        request = pb_utils.InferenceRequest(model_name="orchestrator", requested_output_names=[],
                                            inputs=[pb_utils.Tensor("cancel_sequence", sequence_id.reshape(1, 1))])
        for response in request.exec(decoupled=True):
            if response.has_error():
                pb_utils.Logger.log_error(f"cancelling sequence {sequence_id}: {response.error().message()}")
