"""Shape arithmetic the CUDA-graph steps (`graphs.py`) and the cost table and policy that price their padded shapes
(`decoding/costs.py`, `decoding/policy.py`) share, without the policy importing the graph machinery."""

from __future__ import annotations


def bucket(n: int) -> int:
    """The power of two a count is padded to."""
    return 1 << max(n - 1, 0).bit_length()
