"""Run the Triton Inference Server bundled in nvidia-pytriton for AdaFlash: start, wait ready, stop."""

from adaflash_server.launcher import (
    ServerConfig,
    TritonServer,
    TritonServerError,
    find_bundled_server,
)

__all__ = ["ServerConfig", "TritonServer", "TritonServerError", "find_bundled_server"]
