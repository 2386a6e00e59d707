"""Tokenise and check a generation request; errors name the field (INVALID_ARGUMENT)."""

import json

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from adaflash.serving.api import encode, parse_inputs
from adaflash.models.target import TargetConfig
from adaflash.models.tokenizer import load_tokenizer

OPTIONAL = ("stream", "temperature", "top_k", "top_p", "random_seed", "end_id", "stop_words", "spec_mode", "max_draft")


class TritonPythonModel:
    def initialize(self, args):
        torch.set_num_threads(1)  # tokenising only: leave the cores to the target and the drafter
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        self.tokenizer = load_tokenizer(params["tokenizer_dir"])
        with open(f"{params['tokenizer_dir']}/config.json") as f:
            self.target_config = TargetConfig.from_hf(json.load(f))
        self.max_prompt_tokens = int(params["max_prompt_tokens"])
        self.max_output_tokens = int(params["max_output_tokens"])
        self.default_mode = params["default_spec_mode"]
        self.modes = tuple(params["spec_modes"].split(","))

    def execute(self, requests):
        return [self._one(r) for r in requests]

    def _one(self, request):
        tensors = {"text_input": pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy(),
                   "max_tokens": pb_utils.get_input_tensor_by_name(request, "max_tokens").as_numpy()}
        for name in OPTIONAL:
            t = pb_utils.get_input_tensor_by_name(request, name)
            tensors[name] = None if t is None else t.as_numpy()
        try:
            inputs = parse_inputs(tensors, self.default_mode, self.modes, self.max_output_tokens)
            ids, stops = encode(self.tokenizer, inputs, self.max_prompt_tokens, self.target_config.vocab_size,
                                self.target_config.eos_token_ids)
        except ValueError as exc:
            # A gRPC stream carries per-request errors as text only, so the code leads the message.
            message = f"INVALID_ARGUMENT: {exc}"
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG))
        out = [
            ("input_ids", np.array([ids], dtype=np.int32)),
            ("stop_ids", np.array([stops], dtype=np.int32)),
            ("out_max_tokens", np.array([[inputs.max_tokens]], dtype=np.int32)),
            ("out_stream", np.array([[inputs.stream]], dtype=bool)),
            ("out_temperature", np.array([[inputs.temperature]], dtype=np.float32)),
            ("out_top_k", np.array([[inputs.top_k]], dtype=np.int32)),
            ("out_top_p", np.array([[inputs.top_p]], dtype=np.float32)),
            ("out_random_seed", np.array([[inputs.seed]], dtype=np.uint64)),
            ("out_spec_mode", np.array([[inputs.spec_mode.encode()]], dtype=object)),
            ("out_max_draft", np.array([[inputs.max_draft]], dtype=np.int32)),
        ]
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, v) for n, v in out])
