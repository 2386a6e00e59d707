"""The target LLM: prefill and verify calls of many sequences batched into one forward each.

Calls carry `op` (0 prefill, 1 verify, 2 release) and the sequence's correlation id; the
core's TargetService keeps each sequence's KV slot and sampling generator under that id.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils
from adaflash_server.launcher import spin_target_threads

spin_target_threads()  # before torch loads: the target's idle OpenMP threads spin briefly instead of sleeping

from adaflash.models.drafter import DrafterConfig  # noqa: E402
from adaflash.decoding.sampling import SamplingParams  # noqa: E402
from adaflash.serving.hosts import TargetService  # noqa: E402
from adaflash.models.target import Transformer  # noqa: E402

PREFILL, VERIFY, RELEASE = 0, 1, 2


def _get(request, name, default=None):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return default if t is None else t.as_numpy().reshape(-1)


def _error(message, unavailable=False):
    code = pb_utils.TritonError.UNAVAILABLE if unavailable else pb_utils.TritonError.INVALID_ARG
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config["parameters"].items()}
        target = Transformer.from_pretrained(params["target_dir"])
        capture = None
        if params["drafter_dir"]:
            with open(f"{params['drafter_dir']}/config.json") as f:
                capture = DrafterConfig.from_hf(json.load(f)).target_layer_ids
        self.service = TargetService(target, config["max_batch_size"], int(params["max_len"]), capture,
                                     float(params["idle_timeout_s"]))

    def execute(self, requests):
        self.service.release_stale()
        responses = [None] * len(requests)
        batches = {PREFILL: [], VERIFY: []}
        for i, request in enumerate(requests):
            key = request.correlation_id()
            op = int(_get(request, "op")[0])
            tokens = _get(request, "tokens", np.zeros(0, np.int32)).tolist()
            try:
                if op == PREFILL:
                    sampling = SamplingParams(
                        temperature=float(_get(request, "temperature", [0.0])[0]),
                        top_k=int(_get(request, "top_k", [0])[0]),
                        top_p=float(_get(request, "top_p", [1.0])[0]),
                        seed=int(_get(request, "random_seed", [0])[0]),
                    )
                    sampling.validate()
                    self.service.open(key, tokens, sampling)
                elif op == VERIFY:
                    self.service.check_verify(key, tokens)
                elif op == RELEASE:
                    self.service.release(key)
                    responses[i] = pb_utils.InferenceResponse(output_tensors=[])
                    continue
                else:
                    raise ValueError(f"op: unknown operation {op}")
            except (ValueError, KeyError) as exc:
                responses[i] = _error(str(exc))
                continue
            except RuntimeError as exc:
                responses[i] = _error(str(exc), unavailable=True)
                continue
            batches[op].append((i, key, tokens))
        for op, run in ((PREFILL, self.service.prefill), (VERIFY, self.service.verify)):
            if batches[op]:
                results = run([(key, tokens) for _, key, tokens in batches[op]])
                for (i, _, _), res in zip(batches[op], results):
                    responses[i] = self._response(res)
        return responses

    def _response(self, res):
        feats = np.zeros((0, 0), np.float32) if res.features is None else res.features.numpy()
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("committed", np.array([res.committed], dtype=np.int32)),
            pb_utils.Tensor("accepted", np.array([[res.accepted]], dtype=np.int32)),
            pb_utils.Tensor("expected_accepted", np.array([[res.expected_accepted]], dtype=np.float32)),
            pb_utils.Tensor("features", feats[None].astype(np.float32)),
        ])
