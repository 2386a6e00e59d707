"""Typed request errors: a refusal names its field, so each front door maps it by the field, not by its text.

Over Triton an error is a status and a message; the message of a refused request is `RequestError.wire()`'s,
`"<STATUS>: <field>: <why>"`, and `RequestError.from_wire` reads it back: the one encoding of the field, kept here
beside the one decoding.
"""

from __future__ import annotations

INVALID_ARGUMENT = "INVALID_ARGUMENT"  # the request is at fault: a field's value, or what its values need together
UNAVAILABLE = "UNAVAILABLE"  # the server cannot take it now (the admission queue is full or timed out)
STATUSES = (INVALID_ARGUMENT, UNAVAILABLE)


class RequestError(ValueError):
    """A request the server refuses: `field` is the request field at fault (its TensorRT-LLM input name; "" for none,
    such as a full queue), `message` says why, `status` whether the request or the server's load is the cause. A
    ValueError, so callers that only need the text keep working."""

    def __init__(self, field: str, message: str, status: str = INVALID_ARGUMENT) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field, self.message, self.status = field, message, status

    def wire(self) -> str:
        """The message a front door sends: status, field, why."""
        return f"{self.status}: {self}"

    @classmethod
    def from_wire(cls, text: str) -> RequestError | None:
        """The error `wire` wrote into `text` (None: `text` holds none). Triton may put words of its own before it."""
        for status in STATUSES:
            at = text.find(f"{status}: ")
            if at < 0:
                continue
            rest = text[at + len(status) + 2:]
            field, sep, message = rest.partition(": ")
            if sep and field.isidentifier():
                return cls(field, message, status)
            return cls("", rest, status)
        return None
