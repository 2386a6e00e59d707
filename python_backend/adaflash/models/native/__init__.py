"""fp32 kernels of a decode step on CPU, in C (`kernels.c`), built with the host's C compiler on first use.

Why: a decode or verify step multiplies a few rows by every weight, a product bound by reading the weight, and
the BLAS torch ships reads it at about half the speed two cores stream memory here (docs/history.md); its RMS
norm is six small torch operations, each costing more than the arithmetic, and its attention pads, masks and
gathers around a few queries. Every kernel (product, norms, attention, the whole layer) computes a token's row in
one order whatever else is in the call, so a token's results are bitwise the same alone or batched with others.

The library is compiled once per source and flags into a cache folder (`ADAFLASH_CACHE_DIR`, else
`$XDG_CACHE_HOME/adaflash`, else `~/.cache/adaflash`; built files are renamed in whole, so processes starting
at once are safe) and loaded with ctypes; it links the OpenMP runtime torch
has loaded, so it shares torch's threads. Where it cannot be had (not x86-64 with AVX2 and FMA, no compiler, a
failed build) or `ADAFLASH_NATIVE=0`, `available()` is False and callers keep torch's own operations.
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
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("kernels.c")
FLAGS = ["-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC", "-lm"]  # rounding as written
CPU_FLAGS = {"avx2", "fma"}
ENV_SWITCH = "ADAFLASH_NATIVE"

log = logging.getLogger(__name__)


def available() -> bool:
    """Whether the kernels run natively in this process (decided once), and not under tracing (torch.export
    sees only what torch computes)."""
    return _library() is not None and not torch.compiler.is_compiling()


PANEL = 16  # outputs side by side in `panels`, as kernels.c reads them


def panels(w: Tensor) -> Tensor:
    """w [out, in] (fp32, CPU) as `product` reads it: [ceil(out / PANEL), in, PANEL], outputs past `out` zero."""
    out, width = w.shape
    padded = torch.zeros((-(-out // PANEL) * PANEL, width), dtype=torch.float32)
    padded[:out] = w.detach()
    return padded.view(-1, PANEL, width).transpose(1, 2).contiguous()


def product(x: Tensor, panelled: Tensor, out: int, wide: bool | None = None) -> Tensor:
    """x [rows, in] @ w.T for contiguous fp32 CPU x and `panels(w)`, w [out, in]; only when `available()`.
    `wide`: with AVX-512 (None: where the host has it); the results are the same either way."""
    rows = x.shape[0]
    y = torch.empty((rows, out), dtype=torch.float32)
    _library().product(x.data_ptr(), panelled.data_ptr(), y.data_ptr(), rows, out, panelled.shape[1],
                       torch.get_num_threads(), WIDE if wide is None else wide)
    return y


def can_norm(x: Tensor, weight: Tensor) -> bool:
    """Whether `rms_norm` takes these: fp32 CPU x [T, D], or [T, H, D] whose heads lie side by side, and a
    contiguous fp32 weight [D] or [H, D]; no gradient to carry."""
    return (x.dtype == torch.float32 and weight.dtype == torch.float32 and x.device.type == "cpu"
            and weight.device.type == "cpu" and weight.is_contiguous() and x.dim() in (2, 3) and x.stride(-1) == 1
            and (x.dim() == 2 or x.stride(1) == x.shape[-1]) and weight.shape[-1] == x.shape[-1]
            and (weight.dim() == 1 or (x.dim() == 3 and tuple(weight.shape) == tuple(x.shape[1:])))
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)) and available())


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension, for what `can_norm` takes; contiguous result."""
    heads, dim = (x.shape[1] if x.dim() == 3 else 1), x.shape[-1]
    y = torch.empty(x.shape, dtype=torch.float32)
    _library().rmsnorm(x.data_ptr(), x.stride(0), weight.data_ptr(), dim if weight.dim() == 2 else 0, y.data_ptr(),
                       x.shape[0], heads, dim, eps, torch.get_num_threads())
    return y


def can_norm_rope(x: Tensor, weight: Tensor, cos: Tensor, sin: Tensor) -> bool:
    """Whether `norm_rope` takes these: q and k heads x [T, H, D] as `can_norm` takes them with weight [H, D], D a
    multiple of 16, and contiguous fp32 cos and sin of T x D values."""
    return (x.dim() == 3 and weight.dim() == 2 and x.shape[-1] % 16 == 0 and can_norm(x, weight)
            and all(t.dtype == torch.float32 and t.is_contiguous() and t.numel() == x.shape[0] * x.shape[-1]
                    for t in (cos, sin)))


def norm_rope(x: Tensor, weight: Tensor, cos: Tensor, sin: Tensor, eps: float) -> Tensor:
    """`layers.apply_rope(rms_norm(x, weight, eps), cos, sin)` in one call, bitwise, for what `can_norm_rope` takes."""
    tokens, heads, dim = x.shape
    y = torch.empty(x.shape, dtype=torch.float32)
    _library().norm_rope(x.data_ptr(), x.stride(0), weight.data_ptr(), cos.data_ptr(), sin.data_ptr(), y.data_ptr(),
                         tokens, heads, dim, eps, torch.get_num_threads())
    return y


@dataclass(frozen=True)
class AttentionBatch:
    """One forward's sequences as `attend` reads them, built once per forward for all its layers."""

    table: Tensor  # int64 [B, width]: each sequence's cache pages
    first: Tensor  # int64 [B]: its first row among the packed new tokens
    starts: Tensor  # int64 [B]: the position of that row
    counts: Tensor  # int64 [B]: its new tokens


def attention_batch(tables: list[list[int]], starts: list[int], counts: list[int]) -> AttentionBatch:
    width = max(len(t) for t in tables)
    first = [0]
    for c in counts[:-1]:
        first.append(first[-1] + c)
    return AttentionBatch(torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int64),
                          torch.tensor(first, dtype=torch.int64), torch.tensor(starts, dtype=torch.int64),
                          torch.tensor(counts, dtype=torch.int64))


def attends_over(store: Tensor) -> bool:
    """Whether `attend` takes the forwards over caches like `store` [layers, pages, KV, page, dim], whatever each
    adds: decodes, verifies and prefills alike. One path for every forward keeps a token's results bitwise the
    same whichever call computes them, so a prompt may be prefilled in the same forward as other sequences' verifies
    (`steps.step_batch`) and still give what it gives alone."""
    return (store.dtype == torch.float32 and store.device.type == "cpu" and store.is_contiguous()
            and store.shape[-1] % 8 == 0 and available())


def attend(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, batch: AttentionBatch,
           scale: float, causal: bool = True) -> Tensor:
    """Store the new tokens' keys k and values v [T, KV, dim] in the caches [pages, KV, page, dim], then attend
    with their queries q [T, H, dim] -> [T, H, dim]: causally, or each new token over all of its sequence's (a
    drafter's block). q, k and v: heads side by side, rows any stride."""
    tokens, heads, dim = q.shape
    out = torch.empty((tokens, heads, dim), dtype=torch.float32)
    _library().attend(q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
                      k_cache.data_ptr(), v_cache.data_ptr(), batch.table.data_ptr(), batch.table.shape[1],
                      batch.first.data_ptr(), batch.starts.data_ptr(), batch.counts.data_ptr(), batch.counts.shape[0],
                      heads, k_cache.shape[1], k_cache.shape[2], dim, scale, out.data_ptr(), torch.get_num_threads(),
                      WIDE, causal)
    return out


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's weights as `decode_layers` reads them (fp32, contiguous; the products' as `panels`)."""

    input_norm: Tensor  # [hidden]
    qkv: Tensor  # panels of [(heads + 2 kv_heads) dim, hidden], q, k and v joined
    qk_norm: Tensor  # [heads + kv_heads, dim], q's and k's norm weight per head
    o: Tensor  # panels of [hidden, heads dim]
    post_norm: Tensor  # [hidden]
    gate_up: Tensor  # panels of [2 inter, hidden], gate and up joined
    down: Tensor  # panels of [hidden, inter]

    def tensors(self) -> tuple[Tensor, ...]:
        return (self.input_norm, self.qkv, self.qk_norm, self.o, self.post_norm, self.gate_up, self.down)

    def usable(self) -> bool:
        return all(t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() for t in self.tensors())


class Layers:
    """Every layer's weights and their addresses, in `decode_layers`' order: made once per set of weights (the
    caller keys it by them), since gathering them costs a forward of few tokens more than a layer's arithmetic."""

    def __init__(self, weights: list[LayerWeights]) -> None:
        self.weights = weights  # keeps the joined tensors the addresses point into
        self.inter = weights[0].down.shape[1]
        self.addresses = torch.tensor([[t.data_ptr() for t in w.tensors()] for w in weights], dtype=torch.int64)


class LayerScratch:
    """The buffers `decode_layers` works in, made once per forward and shared by its layers."""

    def __init__(self, tokens: int, hidden: int, inter: int, heads: int, kv_heads: int, dim: int):
        empty = functools.partial(torch.empty, dtype=torch.float32)
        self.h, self.qkv = empty(tokens * hidden), empty(tokens * (heads + 2 * kv_heads) * dim)
        self.qk, self.att = empty(tokens * (heads + kv_heads) * dim), empty(tokens * heads * dim)
        self.gu, self.act = empty(tokens * 2 * inter), empty(tokens * inter)


def decode_layers(x: Tensor, layers: Layers, heads: int, kv_heads: int, dim: int, eps: float, cos: Tensor,
                  sin: Tensor, k_cache: Tensor, v_cache: Tensor, batch: AttentionBatch, scale: float,
                  captured: Tensor | None, capture_layers: list[int]) -> None:
    """Every Qwen3 decoder layer over the new tokens x [T, hidden] (contiguous, updated in place), storing their keys
    and values in the caches [layers, ...]: the native kernels in the order `target.DecoderLayer` calls them, in one
    call. captured[:, j * hidden : (j + 1) * hidden] (captured [T, len(capture_layers) * hidden], contiguous)
    receives x after layer capture_layers[j]."""
    tokens, hidden = x.shape
    scratch = LayerScratch(tokens, hidden, layers.inter, heads, kv_heads, dim)
    columns = dict.fromkeys(range(len(layers.weights)), 0)
    if captured is not None:
        base, width = captured.data_ptr(), hidden * captured.element_size()
        columns.update((layer, base + j * width) for j, layer in enumerate(capture_layers))
    wanted = torch.tensor(list(columns.values()), dtype=torch.int64)
    capture_stride = len(capture_layers) * hidden
    _library().decode_layers(
        x.data_ptr(), tokens, hidden, layers.inter, heads, kv_heads, dim, eps, len(layers.weights),
        layers.addresses.data_ptr(), wanted.data_ptr(), capture_stride, cos.data_ptr(), sin.data_ptr(),
        k_cache.data_ptr(), v_cache.data_ptr(), k_cache.stride(0), batch.table.data_ptr(), batch.table.shape[1],
        batch.first.data_ptr(), batch.starts.data_ptr(), batch.counts.data_ptr(), batch.counts.shape[0],
        k_cache.shape[3], scale,
        scratch.h.data_ptr(), scratch.qkv.data_ptr(), scratch.qk.data_ptr(), scratch.att.data_ptr(),
        scratch.gu.data_ptr(), scratch.act.data_ptr(), torch.get_num_threads(), WIDE)


@functools.cache
def _library():
    if os.environ.get(ENV_SWITCH, "1") == "0" or not _cpu_supports():
        return None
    try:
        library = ctypes.CDLL(str(_built()))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        detail = exc.stderr.decode(errors="replace") if isinstance(exc, subprocess.CalledProcessError) else ""
        log.warning("native kernels unavailable, torch's operations are used: %s %s", exc, detail)
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    library.product.argtypes = [p, p, p, i64, i64, i64, ctypes.c_int, ctypes.c_int]
    library.rmsnorm.argtypes = [p, i64, p, i64, p, i64, i64, i64, ctypes.c_float, ctypes.c_int]
    library.norm_rope.argtypes = [p, i64, p, p, p, p, i64, i64, i64, ctypes.c_float, ctypes.c_int]
    library.attend.argtypes = [p, i64, p, i64, p, i64, p, p, p, i64, p, p, p, i64, i64, i64, i64, i64, ctypes.c_float,
                               p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    library.decode_layers.argtypes = ([p, i64, i64, i64, i64, i64, i64, ctypes.c_float, i64, p, p, i64] + [p] * 4
                                      + [i64, p, i64, p, p, p, i64, i64, ctypes.c_float] + [p] * 6 + [ctypes.c_int] * 2)
    for fn in (library.product, library.rmsnorm, library.norm_rope, library.attend, library.decode_layers):
        fn.restype = None
    return library


def _cpu_supports() -> bool:
    return platform.machine() in ("x86_64", "AMD64") and CPU_FLAGS <= _cpu_flags()


@functools.cache
def _cpu_flags() -> frozenset[str]:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    return frozenset(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")),
                          []))


def _built() -> Path:
    """The compiled library, built now unless this source and these flags were built before."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise OSError("no C compiler (cc) on PATH")
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join([compiler, *FLAGS]).encode()).hexdigest()[:16]
    target = _cache_dir() / f"kernels-{key}.so"
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


WIDE = "avx512f" in _cpu_flags()  # `product` runs 16 lanes wide here (AVX-512), with the same sums as 8 lanes
