"""The shared-memory regions of Triton's Python backend: one per model process, in /dev/shm.

Why the launcher minds them: a server that stops, or a model that Triton reloads, removes its regions; a tritonserver
that is killed (SIGKILL, the OOM killer, the healer's restart of a server whose orchestrator died) leaves them, and
after enough restarts a container's /dev/shm (its `shm_size`) is full and no model can start. The launcher notes the
regions its server maps while it runs (`mapped_regions`) and, once the server is gone, removes those that no live
process maps (`remove_unmapped`): another server's regions, or ones still in use, are never touched.
"""

from __future__ import annotations

from pathlib import Path

REGION_PREFIX = "triton_python_backend_shm_region_"
SHM_DIR = Path("/dev/shm")


def mapped_regions(pid: int, prefix: str = REGION_PREFIX) -> set[Path]:
    """The region files process `pid` maps (empty when it is gone)."""
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:
        return set()
    return {Path(path) for line in lines if (path := line.split(maxsplit=5)[-1]).rsplit("/", 1)[-1].startswith(prefix)}


def mapped_by_anyone(prefix: str = REGION_PREFIX) -> set[Path]:
    """The region files any live process maps (Linux: read from /proc)."""
    found: set[Path] = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            found |= mapped_regions(int(proc.name), prefix)
    return found


def remove_unmapped(regions: set[Path], prefix: str = REGION_PREFIX) -> list[Path]:
    """Remove those of `regions` that no live process maps; returns them."""
    unused = sorted(regions - mapped_by_anyone(prefix))
    for region in unused:
        region.unlink(missing_ok=True)
    return unused


def region_bytes(folder: Path = SHM_DIR, prefix: str = REGION_PREFIX) -> int:
    """Bytes the regions in `folder` hold (every server's): what a container's `shm_size` bounds."""
    return sum(p.stat().st_size for p in folder.glob(f"{prefix}*") if p.is_file()) if folder.is_dir() else 0
