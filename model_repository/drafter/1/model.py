"""The DFlash drafter: draft calls of many sequences in one forward, each cut to the length its mode picks.

Calls carry `op` (1 draft, 2 release) and the sequence's correlation id; the core's
DrafterService keeps each sequence's injected-context cache under that id. The drafter
uses the target's embedding and LM head, so the target weights are loaded here too.
The weights are in `1/weights/`: a published drafter is a copy of this model under another
name (drafter_2, ...) with its own weights, loaded beside the running one.
"""

import json
import os

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from adaflash.models.drafter import DFlashDrafter
from adaflash.decoding.policy import CostModel, LengthController
from adaflash.serving.hosts import DraftCall, DrafterService
from adaflash.models.target import Transformer

DRAFT, RELEASE = 1, 2


def _get(request, name):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config["parameters"].items()}
        target = Transformer.from_pretrained(params["target_dir"])
        drafter = DFlashDrafter.from_pretrained(os.path.join(args["model_repository"], args["model_version"], "weights"))
        with open(params["cost_table"]) as f:
            cost = CostModel.from_json(json.load(f))
        controller = LengthController(cost, drafter.config.block_size)
        self.service = DrafterService(drafter, target, config["max_batch_size"], int(params["max_len"]), controller,
                                      float(params["idle_timeout_s"]))

    def execute(self, requests):
        self.service.release_stale()
        responses = [None] * len(requests)
        calls, rows, hints = [], [], []
        for i, request in enumerate(requests):
            op = int(_get(request, "op").reshape(-1)[0])
            if op == RELEASE:
                self.service.release(request.correlation_id())
                responses[i] = pb_utils.InferenceResponse(output_tensors=[])
                continue
            if op != DRAFT:
                responses[i] = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"op: unknown operation {op}", pb_utils.TritonError.INVALID_ARG))
                continue
            feats = _get(request, "features")
            width = self.service.drafter.fc.weight.shape[1]
            calls.append(DraftCall(
                key=request.correlation_id(),
                features=torch.from_numpy(np.ascontiguousarray(feats.reshape(-1, width), dtype=np.float32)),
                anchor=int(_get(request, "anchor").reshape(-1)[0]),
                mode=_get(request, "spec_mode").reshape(-1)[0].decode(),
                cap=int(_get(request, "cap").reshape(-1)[0]),
                rates=_get(request, "rates").reshape(-1).astype(np.float64),
            ))
            hints.append(int(_get(request, "batch_hint").reshape(-1)[0]))
            rows.append(i)
        if calls:
            drafts, ratios = self.service.draft(calls, batch=max(max(hints), len(calls)))
            for i, d, r in zip(rows, drafts, ratios):
                responses[i] = pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("draft", np.array([d], dtype=np.int32)),
                    pb_utils.Tensor("head_ratio", np.array([[-1.0 if r is None else r]], dtype=np.float32)),
                ])
        return responses
