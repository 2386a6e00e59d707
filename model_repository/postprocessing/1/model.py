"""Turn the orchestrator's token ids into the text delta of this response; statistics pass through.

Triton's ensemble marks a cancelled client request only on steps scheduled after the
cancellation, so this step sees it and the running orchestrator does not: this step tells
the orchestrator (a `cancel_sequence` request), which then stops and frees the sequence.
Asking Triton is a round trip to the server process, so a stream is asked at most every
CANCEL_CHECK_S, not on each of its responses.
"""

import json
import time

import torch
import triton_python_backend_utils as pb_utils

from adaflash.models.tokenizer import load_tokenizer
from adaflash.serving import protocol
from adaflash.serving.api import Detokenizer

CANCEL_CHECK_S = 0.25
FORGET_AFTER_S = 60.0  # a stream not seen for this long ended without a final response here (error, cancel)


def _tensors(tensors):
    return [pb_utils.Tensor(n, v) for n, v in tensors.items()]


class TritonPythonModel:
    def initialize(self, args):
        torch.set_num_threads(1)  # tokenising only: leave the cores to the target and the drafter
        params = protocol.model_parameters(json.loads(args["model_config"]))
        self.detokenizer = Detokenizer(load_tokenizer(params["tokenizer_dir"]))
        self.next_check = {}  # sequence id -> time.monotonic() after which its cancellation is asked again

    def execute(self, requests):
        responses = []
        for request in requests:
            tensors = {t.name(): t.as_numpy() for t in request.inputs()}
            step = protocol.decode_step_response(tensors)
            if self._departed(request, step):
                self._cancel(step.sequence_id)
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED)))
                continue
            text = self.detokenizer.delta(step.echo_ids + step.output_ids, step.sent_len, step.final)
            out = protocol.encode_text_response(text, tensors)
            responses.append(pb_utils.InferenceResponse(output_tensors=_tensors(out)))
        return responses

    def _departed(self, request, step):
        """Whether the client cancelled: asked of Triton when the stream's check is due, first CANCEL_CHECK_S
        after its first response, never on its final one (the sequence has ended: nothing is left to free, and
        Triton drops a response to a departed client). Each question is a round trip to the server process, and
        asked on those two it delayed a request's first text and the next request of its client."""
        now = time.monotonic()
        if step.final:
            self.next_check.pop(step.sequence_id, None)
            return False
        due = self.next_check.get(step.sequence_id)
        if due is not None and now < due:
            return False
        self.next_check[step.sequence_id] = now + CANCEL_CHECK_S
        if due is None:  # the stream's first response
            return False
        if len(self.next_check) > 4 * 1024:
            self.next_check = {k: t for k, t in self.next_check.items() if t > now - FORGET_AFTER_S}
        return request.is_cancelled()

    def _cancel(self, sequence_id):
        request = pb_utils.InferenceRequest(model_name=protocol.ORCHESTRATOR, requested_output_names=[],
                                            inputs=_tensors(protocol.encode_cancel(sequence_id)))
        for response in request.exec(decoupled=True):
            if response.has_error():
                pb_utils.Logger.log_error(f"cancelling sequence {sequence_id}: {response.error().message()}")
