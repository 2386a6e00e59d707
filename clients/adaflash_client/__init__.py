"""Python client and CLI for the `adaflash` Triton model (gRPC, streamed tokens)."""

from adaflash_client.client import (
    SPEC_MODES,
    AdaFlashClient,
    Chunk,
    Completion,
    GenerationError,
    GenerationParams,
    ModelContract,
    Tls,
    build_inputs,
    connect,
    fit_inputs,
    is_final,
    parse_chunk,
)

__all__ = [
    "SPEC_MODES",
    "AdaFlashClient",
    "Chunk",
    "Completion",
    "GenerationError",
    "GenerationParams",
    "ModelContract",
    "Tls",
    "build_inputs",
    "connect",
    "fit_inputs",
    "is_final",
    "parse_chunk",
]
