"""The host allocator of a process that steps models: freed memory kept for the next step.

Why: every step allocates and frees tensors of the same sizes (logits, activations, the features kept for the
drafter). glibc's malloc hands the free top of its heap back to the kernel once it passes a threshold, and serves
blocks over a moving threshold with a mapping of their own, unmapped when freed; either way the next step's
tensors land on fresh pages, and the first touch of each is a page fault. Features kept across steps until their
sequence drafts fragment the heap, and can make it worse (docs/history.md, engine speed round 39: faults and their
kernel time per run, both ways). Kept, the freed memory serves the next step's tensors without a fault; the
process holds its working set's peak instead of giving it back between steps.
"""

from __future__ import annotations

import ctypes
import os
import platform

# mallopt's parameters (glibc's malloc.h).
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
SETTINGS = {
    # Blocks as large as this are mapped apart (weights, caches). Above glibc's dynamic maximum (32 MiB): a
    # prefill chunk's activations pass it on small models, whose forwards are short enough for their faults to
    # count.
    M_MMAP_THRESHOLD: 256 << 20,
    M_TRIM_THRESHOLD: 512 << 20,  # free memory at the heap's top kept before any goes back: more than one such block
    M_TOP_PAD: 16 << 20,  # extra asked of the kernel when the heap grows: fewer calls (pages fault only when used)
}
# Set by whoever runs the process: then the allocator is theirs to tune.
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_")


def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep freed memory (`SETTINGS`). Returns whether it did: not where the C library is
    not glibc, nor where the environment already tunes its malloc (`USER_SETTINGS`, or `GLIBC_TUNABLES`' malloc
    part). A preloaded allocator (jemalloc, tcmalloc) ignores these settings."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    tuned = any(name in os.environ for name in USER_SETTINGS) or "glibc.malloc." in tunables
    if platform.libc_ver()[0] != "glibc" or tuned:
        return False
    libc = ctypes.CDLL(None)
    libc.malloc_trim(0)  # what loading freed (the cost table's widest forwards) goes back first: keep from here
    return all(libc.mallopt(param, value) == 1 for param, value in SETTINGS.items())
