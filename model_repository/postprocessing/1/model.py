"""Turn the orchestrator's token ids into the text delta of this response; statistics pass through."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from adaflash.api import text_delta
from adaflash.tokenizer import load_tokenizer

PASS_THROUGH = ("num_output_tokens", "target_forwards", "accepted_per_step", "draft_len_per_step", "finish_reason")


class TritonPythonModel:
    def initialize(self, args):
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        self.tokenizer = load_tokenizer(params["tokenizer_dir"])

    def execute(self, requests):
        responses = []
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "output_ids").as_numpy().reshape(-1).tolist()
            sent = int(pb_utils.get_input_tensor_by_name(request, "sent_len").as_numpy().reshape(-1)[0])
            final = bool(pb_utils.get_input_tensor_by_name(request, "is_final").as_numpy().reshape(-1)[0])
            text = text_delta(self.tokenizer, ids, sent, final)
            out = [pb_utils.Tensor("text_output", np.array([[text.encode()]], dtype=object))]
            for name in PASS_THROUGH:
                out.append(pb_utils.Tensor(f"out_{name}", pb_utils.get_input_tensor_by_name(request, name).as_numpy()))
            responses.append(pb_utils.InferenceResponse(output_tensors=out))
        return responses
