"""The speculation modes: what each proposes and how much of a proposal it verifies.

The registry is the one place a mode is defined; the planner reads these fields and never
a mode's name. No import beyond the standard library, so clients can take the list too.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Length(Enum):
    """How many proposed tokens a mode sends to verification."""

    ALL = "all"  # every proposed token, up to the sequence's cap
    PUBLISHED = "published"  # the AdaFlash paper's rule on the length head's (or the estimates') accepted fraction
    COST_AWARE = "cost-aware"  # the cost model's choice: whether to propose at all, what, and how much


@dataclass(frozen=True)
class Mode:
    name: str
    copies: bool  # proposes copies of the context's continuation (prompt lookup)
    drafter: bool  # proposes blocks of the DFlash drafter
    length: Length

    @property
    def proposes(self) -> bool:
        """Whether it proposes tokens to verify; plain decoding does not, so nothing is decided between its steps."""
        return self.copies or self.drafter


MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("ar", copies=False, drafter=False, length=Length.ALL),
    Mode("ngram", copies=True, drafter=False, length=Length.ALL),
    Mode("dflash", copies=False, drafter=True, length=Length.ALL),
    Mode("adaflash", copies=True, drafter=True, length=Length.COST_AWARE),
    Mode("adaflash-published", copies=False, drafter=True, length=Length.PUBLISHED),
)}
MODE_NAMES: tuple[str, ...] = tuple(MODES)
REFERENCE_MODE = "ar"  # plain decoding: what every other mode's greedy output must equal, and the speed baseline
DRAFTER_MODE_NAMES: tuple[str, ...] = tuple(n for n, m in MODES.items() if m.drafter)


def get_mode(name: str) -> Mode:
    """The mode called `name`; ValueError naming the choices otherwise."""
    if name not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODE_NAMES)}, got {name!r}")
    return MODES[name]


def modes_served(has_drafter: bool) -> tuple[str, ...]:
    """The modes a server or engine can run: those needing a drafter only when it has one."""
    return tuple(n for n, m in MODES.items() if has_drafter or not m.drafter)
