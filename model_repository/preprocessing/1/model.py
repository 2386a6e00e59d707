"""Check and tokenise a generation request; errors name the field (INVALID_ARGUMENT)."""

import json

import torch
import triton_python_backend_utils as pb_utils

from adaflash.decoding.modes import modes_served
from adaflash.models.chat_template import load_chat_template
from adaflash.models.target import TargetConfig
from adaflash.models.tokenizer import load_tokenizer
from adaflash.serving import protocol
from adaflash.serving.api import encode


class TritonPythonModel:
    def initialize(self, args):
        torch.set_num_threads(1)  # tokenising only: leave the cores to the target and the drafter
        params = protocol.model_parameters(json.loads(args["model_config"]))
        self.tokenizer = load_tokenizer(params["tokenizer_dir"])
        self.chat = load_chat_template(params["tokenizer_dir"])
        with open(f"{params['tokenizer_dir']}/config.json") as f:
            self.target_config = TargetConfig.from_hf(json.load(f))
        self.max_prompt_tokens = int(params["max_prompt_tokens"])
        modes = modes_served(bool(params["drafter_dir"]))
        self.limits = protocol.RequestLimits(int(params["max_output_tokens"]), modes, params["default_spec_mode"])

    def execute(self, requests):
        return [self._one(r) for r in requests]

    def _one(self, request):
        try:
            protocol.refuse_parameters(json.loads(request.parameters()))
            values = protocol.parse_request({t.name(): t.as_numpy() for t in request.inputs()}, self.limits)
            encoded = encode(self.tokenizer, values, self.max_prompt_tokens, self.target_config.vocab_size,
                             self.target_config.eos_token_ids, self.chat)
        except ValueError as exc:
            # A gRPC stream carries per-request errors as text only, so the code leads the message.
            error = pb_utils.TritonError(f"INVALID_ARGUMENT: {exc}", pb_utils.TritonError.INVALID_ARG)
            return pb_utils.InferenceResponse(error=error)
        tensors = protocol.encode_generation(encoded, values)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, v) for n, v in tensors.items()])
