"""Round 28's records: the native kernels of an earlier commit, built beside this checkout's, for A/Bs in one process
(the machine's speed drifts by tens of percent over minutes, so two processes run apart do not compare)."""

from __future__ import annotations

import ctypes
import subprocess
import tempfile
from pathlib import Path

from adaflash.models import native


def kernels_at(revision: str) -> ctypes.CDLL:
    """The kernels.c of `revision`, compiled with this checkout's flags, its functions typed as this checkout's
    (`attend` then had neither `wide` nor `causal`)."""
    source = subprocess.run(["git", "show", f"{revision}:python_backend/adaflash/models/native/kernels.c"],
                            check=True, capture_output=True).stdout
    folder = Path(tempfile.mkdtemp())
    (folder / "kernels.c").write_bytes(source)
    subprocess.run(["cc", *native.FLAGS, str(folder / "kernels.c"), "-o", str(folder / "kernels.so")], check=True)
    old, new = ctypes.CDLL(str(folder / "kernels.so")), native._library()
    for name in ("product", "rmsnorm", "norm_rope", "decode_layers", "attend"):
        getattr(old, name).argtypes, getattr(old, name).restype = getattr(new, name).argtypes, None
    old.attend.argtypes = new.attend.argtypes[:-2]
    return old
