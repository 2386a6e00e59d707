"""The speculation modes: what each proposes and how much of a proposal it verifies.

The registry is the one place a mode is defined; the core reads these fields and never a mode's name. A name is
resolved to its `Mode` once, where a request is parsed (`parse_mode`), and travels as a `Mode` from there. No import
beyond the standard library, so clients take the list from here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from adaflash_contract.errors import RequestError


class Length(Enum):
    """How many proposed tokens a mode sends to verification."""

    ALL = "all"  # every proposed token, up to the sequence's cap
    PUBLISHED = "published"  # the AdaFlash paper's rule on the length head's (or the estimates') accepted fraction
    COST_AWARE = "cost-aware"  # the cost model's choice: whether to propose at all, what, and how much


@dataclass(frozen=True)
class Mode:
    name: str
    copies: bool  # proposes copies of the context's continuation (prompt lookup)
    drafter: str | None  # the drafter proposer it drafts with (`adaflash.decoding.proposers`), None: none
    length: Length

    def __str__(self) -> str:
        return self.name

    @property
    def proposes(self) -> bool:
        """Whether it proposes tokens to verify; plain decoding does not, so nothing is decided between its steps."""
        return self.copies or self.drafter is not None


MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("ar", copies=False, drafter=None, length=Length.ALL),
    Mode("ngram", copies=True, drafter=None, length=Length.ALL),
    Mode("dflash", copies=False, drafter="dflash", length=Length.ALL),
    Mode("adaflash", copies=True, drafter="dflash", length=Length.COST_AWARE),
    Mode("adaflash-published", copies=False, drafter="dflash", length=Length.PUBLISHED),
)}
MODE_NAMES: tuple[str, ...] = tuple(MODES)
REFERENCE_MODE = "ar"  # plain decoding: what every other mode's greedy output must equal, and the speed baseline
DRAFTER_MODE_NAMES: tuple[str, ...] = tuple(n for n, m in MODES.items() if m.drafter)


def parse_mode(name: str | Mode, served: tuple[str, ...] = MODE_NAMES) -> Mode:
    """The mode called `name`, one of `served`: the one place a name becomes a `Mode`. RequestError naming the field
    spec_mode otherwise. A `Mode` passes as it is (a caller that holds one already)."""
    if isinstance(name, Mode) and name.name in served:
        return name
    if name not in served:
        raise RequestError("spec_mode", f"must be one of {', '.join(served)}, got {str(name)!r}")
    return MODES[name]


def modes_served(has_drafter: bool) -> tuple[str, ...]:
    """The modes a server or engine can run: those needing a drafter only when it has one."""
    return tuple(n for n, m in MODES.items() if has_drafter or m.drafter is None)
