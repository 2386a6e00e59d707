"""fp32 products of a few rows by a weight, in C (`rowdot.c`), built with the host's C compiler on first use.

Why: a decode or verify step multiplies 1-16 rows by every weight, a product bound by reading the weight, and
the BLAS torch ships reads it at about half the speed two cores stream memory here (docs/results.md). The
kernel sums every dot in one order whatever the row count, so a row's products are bitwise the same alone or
batched with others.

The library is compiled once per source and flags into a cache folder (`ADAFLASH_CACHE_DIR`, else
`$XDG_CACHE_HOME/adaflash`, else `~/.cache/adaflash`; built files are renamed in whole, so processes starting
at once are safe) and loaded with ctypes; it links the OpenMP runtime torch
has loaded, so it shares torch's threads. Where it cannot be had (not x86-64 with AVX2 and FMA, no compiler, a
failed build) or `ADAFLASH_NATIVE=0`, `available()` is False and callers keep torch's own products.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("rowdot.c")
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC"]
CPU_FLAGS = {"avx2", "fma"}
ENV_SWITCH = "ADAFLASH_NATIVE"

log = logging.getLogger(__name__)


def available() -> bool:
    """Whether `rowdot` runs natively in this process (decided once)."""
    return _kernel() is not None


def rowdot(x: Tensor, w: Tensor) -> Tensor:
    """x [rows, in] @ w.T for contiguous fp32 CPU tensors, w [out, in]; only when `available()`."""
    rows, out = x.shape[0], w.shape[0]
    y = torch.empty((rows, out), dtype=torch.float32)
    _kernel()(x.data_ptr(), w.data_ptr(), y.data_ptr(), rows, out, w.shape[1], torch.get_num_threads())
    return y


@functools.cache
def _kernel():
    if os.environ.get(ENV_SWITCH, "1") == "0" or not _cpu_supports():
        return None
    try:
        library = ctypes.CDLL(str(_built()))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        detail = exc.stderr.decode(errors="replace") if isinstance(exc, subprocess.CalledProcessError) else ""
        log.warning("native products unavailable, torch's are used: %s %s", exc, detail)
        return None
    fn = library.rowdot
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    fn.restype = None
    return fn


def _cpu_supports() -> bool:
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    return CPU_FLAGS <= set(flags)


def _built() -> Path:
    """The compiled library, built now unless this source and these flags were built before."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise OSError("no C compiler (cc) on PATH")
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join([compiler, *FLAGS]).encode()).hexdigest()[:16]
    target = _cache_dir() / f"rowdot-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", partial], check=True, capture_output=True, timeout=120)
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def _cache_dir() -> Path:
    given = os.environ.get("ADAFLASH_CACHE_DIR")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"  # RuntimeError without a home
    return Path(base) / "adaflash"
