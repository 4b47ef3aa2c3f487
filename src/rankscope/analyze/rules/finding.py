"""What a rule answers: a :class:`Finding`, checked against its cause's templates when made;
and what every family reads alike (:func:`log_site`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from rankscope.analyze.causes import DRIVER_FACTS, Cause
from rankscope.analyze.context import Context
from rankscope.analyze.diagnosis import CollectiveInfo, EvidenceRef
from rankscope.analyze.parting import Parting

#: A finding's recipe when it is its cause's own (:attr:`Finding.recipe`).
CAUSE_RECIPE = "the cause's"


@dataclass(frozen=True, kw_only=True)
class Finding:
    """A cause with its facts, before it becomes a :class:`~rankscope.analyze.Diagnosis`.

    Made once, by the rule that decides it, and never changed after (a rule that adds to
    another's finding makes a new one, :func:`dataclasses.replace`). ``facts`` hold every fact
    the cause's reason and fix name but those the driver adds (:data:`DRIVER_FACTS`): a fact
    left out, or misspelt, raises here."""

    cause: Cause
    culprits: list[int]
    waiting: list[int]
    facts: dict[str, Any] = field(default_factory=dict)
    collective: CollectiveInfo | None = None
    refs: list[EvidenceRef] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    recipe: str | None = CAUSE_RECIPE
    """The recipe of the guide that covers this finding: the cause's own unless the evidence
    says otherwise (an exit the user's code asked for is no data loop ended: not D9)."""
    parting: Parting | None = None
    """The decision that parted the culprits where the rule read it itself (the branch that
    set the peer a call names); else the driver reads it from the ranks' paths."""

    def __post_init__(self) -> None:
        if not isinstance(self.cause, Cause):
            raise TypeError(f"a finding's cause is a Cause, not {self.cause!r}")
        missing = self.cause.facts - DRIVER_FACTS - set(self.facts)
        if missing:
            raise ValueError(
                f"a finding of {self.cause} lacks the facts {sorted(missing)} that its "
                f"templates name (it has {sorted(self.facts)})"
            )


@dataclass(frozen=True)
class Decided:
    """What a helper that decides a cause found: the cause, its culprits, the facts it adds to
    the rule's, and its notes."""

    cause: Cause
    culprits: list[int]
    facts: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    recipe: str | None = CAUSE_RECIPE
    """As :attr:`Finding.recipe`."""


@dataclass(frozen=True, kw_only=True)
class Failure:
    """A rank's own failure."""

    t_s: float
    rank: int
    cause: Cause
    message: str
    ref: EvidenceRef | None
    site: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)


#: A rule: the context of one run in, a finding or None (it passes) out.
Rule = Callable[[Context], "Finding | None"]

#: Every rule, by its place in the order: filled by :func:`rule` as the families' files load.
REGISTERED: dict[int, Rule] = {}


def rule(place: int) -> Callable[[Rule], Rule]:
    """Make a function a rule, asked at ``place`` in the order (lower first; the package's
    docstring lists the places taken). Two rules may not share a place."""

    def register(fn: Rule) -> Rule:
        taken = REGISTERED.get(place)
        if taken is not None and taken is not fn:
            raise ValueError(f"rule place {place} is taken by {taken.__name__}")
        REGISTERED[place] = fn
        return fn

    return register


def log_site(ctx: Context, errors: pd.DataFrame) -> str | None:
    """The user's line in the traceback above the first of these error lines."""
    for rank, message in zip(errors["rank"], errors["message"], strict=True):
        if pd.notna(rank):
            site = ctx.ev.traceback_site(int(rank), str(message))
            if site:
                return site
    return None
