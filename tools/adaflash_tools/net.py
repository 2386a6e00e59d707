"""Small standard-library checks of a local service, shared by the tools (`image_check.py` imports nothing else of
the project)."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from pathlib import Path


def accepts(host: str, port: int) -> bool:
    """Whether something listens on `host`:`port` (a connection is accepted within a second)."""
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def http_ok(url: str) -> bool:
    try:
        return urllib.request.urlopen(url, timeout=2).status == 200
    except (urllib.error.URLError, OSError):
        return False


def log_tail(path: Path, chars: int = 3000) -> str:
    """The end of a log, for an error message."""
    return path.read_text(errors="replace")[-chars:] if path.exists() else f"({path} missing)"
