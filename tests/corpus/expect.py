"""Each corpus script's expected answer, and how a diagnosis is checked against it.

Used by ``tests/test_corpus.py`` and by ``bench/diagnosis_accuracy.py`` (which loads this file
by its path).
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
_EXPECT = re.compile(r"^# expect: (\{.*\})\s*$", re.M)
#: How each corpus job runs: a short stall timeout, stopped after the capture.
RUN = {"stall_timeout_s": 3.0, "on_stall": "stop", "collective_timeout_s": 60.0}


@dataclass(frozen=True)
class Case:
    name: str
    path: Path
    ranks: int
    verdict: str
    cause: str | None = None
    recipe: str | None = None
    culprits: list[int] | None = None
    site: str | None = None
    """Tag of the line (``# site: <tag>``) where the diagnosis must place the culprit."""
    chain: list[int] = field(default_factory=list)
    """Ranks the diagnosis's chain of waits must name."""
    thread: bool = False
    """The culprit's call came from a thread other than its main one: a note says so."""
    activity: str | None = None
    caught: str | None = None
    """The library whose handler caught the collective's error: the card's reason names it."""
    """What the culprit was blocked on, as the stacks say (lock, sleep, queue, ...)."""
    parting: str | None = None
    """Tag of the line of the decision that sent the culprits another way (``parting.site``)."""
    values: list[str] = field(default_factory=list)
    """Names the parting line must give values of (on some rank)."""
    unread: list[str] = field(default_factory=list)
    """Files with no source to read (``<string>``: exec'd text) that the card must say it could
    not read, where it would name a line."""
    nodes: int = 1
    """Simulated nodes (``ranks`` per node)."""
    run: dict[str, Any] = field(default_factory=dict)
    """JobSpec settings of this case on top of :data:`RUN`: ``{"on_stall": "keep"}`` for a
    story that needs the job to go on after its stall is proven, as it does by default."""

    def spec_settings(self) -> dict[str, Any]:
        """How this case's job runs: :data:`RUN` and the case's own settings."""
        return {**RUN, **self.run}

    needs: list[str] = field(default_factory=list)
    """Packages the script imports beyond torch (a framework: ``lightning``, ``transformers``,
    ``accelerate``, ``deepspeed``); the case is skipped, naming them, where one is missing."""

    @property
    def framework(self) -> str:
        """The framework the case runs under (``lightning``, ``transformers``: the Hugging Face
        Trainer, ``deepspeed``, ``accelerate``), ``torch`` for a plain torch script."""
        order = ("lightning", "transformers", "deepspeed", "accelerate")
        return next((n for n in order if n in self.needs), "torch")

    def missing(self) -> list[str]:
        """The packages of :attr:`needs` this interpreter cannot import."""
        return [name for name in self.needs if importlib.util.find_spec(name) is None]

    first: dict[str, Any] | None = None
    """Where the ranks' paths first part: ``{"pg": name or desc, "seq": N}`` (and ``"kind":
    "p2p"`` where the calls are point-to-point ones, numbered apart; ``"culprits"`` where the
    class named there is checked too), as ``Diagnosis.first_divergence`` must give it."""

    def line(self, tag: str) -> str:
        """``file.py:N`` of the line marked ``# site: <tag>``: in the script, or in the small
        library the corpus scripts import (``corpus_lib``)."""
        for path in [self.path, *sorted((HERE / "corpus_lib").glob("*.py"))]:
            for no, text in enumerate(path.read_text().splitlines(), 1):
                if f"# site: {tag}" in text:
                    return f"{path.name}:{no}"
        raise AssertionError(f"no line marked 'site: {tag}' in {self.path.name} or corpus_lib")


def cases() -> list[Case]:
    out = []
    for path in sorted(HERE.glob("*.py")):
        m = _EXPECT.search(path.read_text())
        if m is None:
            continue
        want: dict[str, Any] = json.loads(m.group(1))
        out.append(Case(name=path.stem, path=path, **want))
    return out


def check(case: Case, d: Any) -> list[str]:
    """What the diagnosis ``d`` gets wrong about ``case`` (empty: all right)."""
    wrong = []
    if d.verdict != case.verdict:
        wrong.append(f"verdict {d.verdict} (expected {case.verdict})")
    if case.cause is not None and d.cause != case.cause:
        wrong.append(f"cause {d.cause} (expected {case.cause})")
    if case.recipe is not None and d.recipe != case.recipe:
        wrong.append(f"recipe {d.recipe} (expected {case.recipe})")
    if case.culprits is not None and d.culprit_ranks != case.culprits:
        wrong.append(f"culprits {d.culprit_ranks} (expected {case.culprits})")
    text = d.render()
    if case.site is not None and case.line(case.site) not in text:
        wrong.append(f"the culprit's site {case.line(case.site)} is not in the diagnosis")
    named = {r for link in d.chain for r in link["ranks"]}
    if case.chain and not set(case.chain) <= named:
        wrong.append(f"chain names ranks {sorted(named)} (expected {case.chain} among them)")
    if case.thread and not any("thread" in n and "not its main thread" in n for n in d.notes):
        wrong.append("no note names the thread that made the call")
    if case.activity is not None and not any(w in d.reason for w in _ACTIVITY_WORDS[case.activity]):
        wrong.append(f"the reason does not say the culprit was {case.activity}: {d.reason}")
    if case.caught is not None and f"caught in the library {case.caught} by" not in d.reason:
        wrong.append(f"the reason does not name {case.caught} as what caught the error")
    if case.parting is not None:
        got = (d.parting or {}).get("site")
        if got != case.line(case.parting):
            why = next((n for n in d.notes if "parted is not known" in n), "")
            wrong.append(f"parting line {got} (expected {case.line(case.parting)}) {why}")
    missing_values = [v for v in case.values if v not in (d.parting or {}).get("values", {})]
    if missing_values:
        wrong.append(f"the parting line has no value of {missing_values}")
    if case.first is not None:
        wrong.extend(_first_wrong(case.first, getattr(d, "first_divergence", None)))
    if case.needs and case.site is not None and case.verdict == "hang":
        # a framework's case: the culprits' call is named by the user's line that led into the
        # framework, not by the framework's line that made the call
        classes = (d.first_divergence or {}).get("classes", [])
        own = [
            c for c in classes if set(c.get("ranks", [])) & set(d.culprit_ranks) and c.get("op")
        ]  # a class that made no call there (it had left) has no call to name
        named = [f"{c.get('via') or ''} {c.get('site') or ''}" for c in own]
        if own and not any(case.line(case.site) in n for n in named):
            wrong.append(f"the culprits' call at the first divergence is named {named}")
    wrong.extend(
        f"the card does not say it could not read {name}"
        for name in case.unread
        if f"the source of {name} could not be read" not in text
    )
    wrong.extend(_proof_wrong(d))
    if "?" in text.replace("could not read", ""):
        wrong.append("a '?' in the diagnosis")
    return wrong


_PROOF_WAITS = re.compile(r"rank (\d+) waits in (\S+), call #(\d+) of group (\S+?)[;.]")


def _proof_wrong(d: Any) -> list[str]:
    """The live proof's note numbers each call as the rest of the card does: the call it says
    a rank waits in is that rank's call of that number in the diagnosis's calls table."""
    calls = getattr(d, "calls", None)
    if calls is None:
        return []
    wrong = []
    for m in _PROOF_WAITS.finditer(" ".join(d.notes)):
        rank, op, seq, pg = int(m[1]), m[2], int(m[3]), m[4]
        rows = calls[(calls["rank"] == rank) & (calls["pg"].astype(str) == pg)]
        rows = rows[(rows["seq"] == seq).fillna(False)]
        if rows.empty or str(rows["op"].iloc[0]) != op:
            wrong.append(
                f"the proof's note names {op} #{seq} of group {pg} on rank {rank}, which "
                "the calls table numbers otherwise"
            )
    return wrong


def _first_wrong(want: dict[str, Any], got: dict[str, Any] | None) -> list[str]:
    """What the diagnosis's first divergence gets wrong about the expected one."""
    if not got:
        return [f"no first divergence (expected {want['pg']} #{want['seq']})"]
    wrong = []
    if want["pg"] not in (got.get("pg"), got.get("pg_desc")):
        wrong.append(f"first divergence on group {got.get('pg')} ({got.get('pg_desc')})")
    if got.get("seq") != want["seq"]:
        wrong.append(f"first divergence at #{got.get('seq')}")
    if got.get("kind", "collective") != want.get("kind", "collective"):
        wrong.append(f"first divergence among {got.get('kind')} calls")
    if wrong:
        wrong[-1] += f" (expected {want.get('kind', 'collective')} {want['pg']} #{want['seq']})"
    if "culprits" in want and got.get("culprits") != want["culprits"]:
        wrong.append(
            f"first divergence's culprits {got.get('culprits')} (expected {want['culprits']}, "
            f"told by {got.get('decided_by')})"
        )
    return wrong


#: What the card says of each activity (never the key itself: a script's name may hold it).
_ACTIVITY_WORDS = {
    "lock": ("waiting to acquire a lock",),
    "sleep": ("sleeping",),
    "queue": ("waiting on a queue",),
    "build_lock": ("waiting for a C++ extension's build lock",),
    "dataloader": ("waiting for a batch from its DataLoader's workers",),
}
