"""One model of how a job's ranks ended, for every view that tells it.

The live panel, the job's status line, :meth:`rankscope.launch.Job.ranks`, the ranks table of a
loaded run, the diagnosis card and the command line's ``status`` all say how a rank ended from
:func:`rank_end`, in the words of :attr:`RankEnd.words` and the one word of
:attr:`RankEnd.status`, so they cannot disagree.

A rank's end has two witnesses. The process's parent (torchrun, whose codes the supervisor
keeps in ``run.json`` and prints in its failure summary) saw how the process really ended: its
exit code, or the signal that ended it. The rank's probe wrote what the rank was doing as it
ended (its end event: it returned, called ``sys.exit``, raised, or got a signal), and the code it
meant to exit with. The parent's code wins: a rank that raised and was then ended by the
launcher's SIGTERM while it exited died of that SIGTERM; the probe's word says it failed first.

A call's state is defined here too (:func:`call_state`, :func:`call_states`): the analyzer's
calls table, the card, the timeline, the sequence ladder and the live panel name each call
``issued``, ``started``, ``completed`` or ``failed`` by the one rule, and a rank that never made
a call says ``never`` (:data:`NEVER`).

Counts are defined once, on :class:`rankscope.rundir.RankRecord`: ``done`` is the collectives a
rank completed (returned from without an error, or, for an async call, completed by the
backend), the process-group management calls left out, so "done 8" sits beside "last completed
#8" when a rank made its calls on one group.
"""

from __future__ import annotations

import dataclasses
import json
import re
import signal as _signal
from collections.abc import Iterable
from typing import Any

#: Signals a process sends itself when something inside it breaks (an ``abort()`` in C++, a
#: crash): the rank's own failure, not a message from outside.
SELF_SIGNALS = frozenset({"SIGABRT", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGSYS"})
#: Signals a launcher or a scheduler sends to end processes (torchrun sends SIGTERM to every
#: other rank once one fails; the supervisor sends it on Stop).
TEARDOWN_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"})
#: The probe's words for an end the rank's own code chose: its script returned, it called
#: ``sys.exit`` or ``os._exit``. A teardown signal that comes after one found it exiting.
OWN_ENDS = frozenset({"returned", "sys_exit", "os._exit"})

#: Every status a rank can have, in the order a grouped view lists them (what went wrong first).
#: ``running`` and ``waiting`` (inside a collective) are alive; ``dead`` is a process gone with
#: no end known yet; ``exiting`` a rank that ended its script whose process has not exited (a
#: live job's: its interpreter's exit waits for something); the rest are ends
#: (:attr:`RankEnd.status`).
STATUSES = (
    "aborted",
    "crashed",
    "killed",
    "failed",
    "dead",
    "ended",
    "waiting",
    "exiting",
    "stopped",
    "exited",
    "running",
)
#: The statuses of a rank that ended badly on its own (not by another's teardown or a stop).
BAD_STATUSES = frozenset({"aborted", "crashed", "killed", "failed", "dead"})


#: What every view heads a rank's step with. A rank's step is the last step it marked
#: (``rankscope.probe.step``), not the step its loop is in: a loop marks a step where the user
#: put the marker (after the step's collectives, or before), so a rank waiting in the next
#: step's first collective still shows the step it marked last, while the card's values of the
#: user's own variable (``step = 3``) say where the loop is.
STEP_LABEL = "step marked"


def step_words(step: Any) -> str:
    """A rank's step in a sentence (see :data:`STEP_LABEL`): ``last step marked: 2``."""
    return f"last step marked: {step}"


#: A call's states, every view's words for them: ``issued`` (the backend has not completed it:
#: in flight, or left so at the rank's end), ``started`` (on the device: nccl with timing),
#: ``completed`` (the backend completed it and it returned normally), ``failed`` (it raised).
CALL_STATES = ("issued", "started", "completed", "failed")
#: What the card says of a rank that never made a call.
NEVER = "never"


def call_state(*, completed: bool | None, ok: bool | None = None, started: bool = False) -> str:
    """One call's state (:data:`CALL_STATES`): ``failed`` where it raised (``ok`` False),
    whatever the backend said; else ``completed`` where the backend completed it; else
    ``started`` or ``issued``. :func:`call_states` is the same rule over a table."""
    if ok is False:
        return "failed"
    if completed:
        return "completed"
    return "started" if started else "issued"


def call_states(completed: Any, ok: Any = None, started: Any = None) -> Any:
    """:func:`call_state` over arrays (nulls read as not completed, not failed, not started):
    the codes of :data:`CALL_STATES` as an int8 array."""
    import numpy as np  # here: the live tracker imports this module without numpy's need

    def flag(values: Any, n: int) -> Any:
        if values is None:
            return np.zeros(n, dtype=bool)
        if hasattr(values, "fillna"):
            values = values.fillna(False)
        return np.asarray(values, dtype=bool)

    done = flag(completed, len(completed))
    raised = (
        np.zeros(len(done), dtype=bool)
        if ok is None
        else np.asarray(
            ok.eq(False).fillna(False) if hasattr(ok, "eq") else np.asarray(ok) == False,  # noqa: E712
            dtype=bool,
        )
    )
    codes = flag(started, len(done)).astype(np.int8)
    codes[done] = 2
    codes[raised] = 3
    return codes


def state_words(state: str | None, *, ended: str | None = None) -> str:
    """A call's state (:data:`CALL_STATES`) as every view says it, the state's own word first:
    ``completed``, ``failed``, ``issued, waiting`` (its rank is alive), ``issued, never
    completed`` (its rank ended; ``ended``, its end's words, says how: ``issued, never
    completed: its rank ended in it (aborted itself: SIGABRT (-6))``)."""
    if state in ("completed", "failed"):
        return state
    if state not in CALL_STATES:
        return "of unknown state"
    if ended is None:
        return f"{state}, waiting"
    return f"{state}, never completed" + (f": {_ENDED_IN_IT} ({ended})" if ended else "")


_ENDED_IN_IT = "its rank ended in it"


def states_words(words: str) -> str:
    """:func:`state_words`' text said of several ranks at once (the card's line for ranks that
    did the same): ``issued, never completed: their ranks ended in it (...)``."""
    return words.replace(_ENDED_IN_IT, "their ranks ended in it")


def call_text(op: Any, pg: Any, seq: Any, state: str | None, *, ended: str | None = None) -> str:
    """A call and its state (:func:`state_words`): ``all_reduce (group 0 #4) failed``,
    ``barrier (group 0 #5) issued, never completed``."""
    return f"{op} (group {pg} #{seq}) {state_words(state, ended=ended)}"


def signal_name(code: int | None) -> str | None:
    """``SIGKILL`` for an exit code of -9 (a process ended by a signal), else None."""
    if code is None or code >= 0:
        return None
    try:
        return _signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def signal_code(name: str | None) -> int | None:
    """-6 for ``SIGABRT`` (the exit code of a process that signal ended), else None."""
    try:
        return -int(_signal.Signals[name]) if name else None
    except KeyError:
        return None


#: faulthandler's first line when a fatal signal ends the process, and the signals it names.
FATAL_LINE = re.compile(r"Fatal Python error: (?P<what>.*?)\s*$")
FATAL_SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Illegal instruction": "SIGILL",
    "Floating-point exception": "SIGFPE",
}


def fatal_signal(dump: str) -> str | None:
    """The signal that the last fatal-error report in a faulthandler dump names (``SIGABRT``
    for "Fatal Python error: Aborted"), else None. faulthandler raises that signal again once
    its report is written: the process died of it."""
    named = None
    for line in dump.splitlines():
        m = FATAL_LINE.match(line) if line.startswith("Fatal Python error") else None
        if m:
            named = FATAL_SIGNALS.get(m["what"])
    return named


@dataclasses.dataclass(frozen=True, slots=True)
class RankEnd:
    """How one rank's process ended.

    ``code`` is its exit status as its parent saw it (negative: the signal that ended it), or
    the probe's where the parent's is not known; ``how`` the probe's word (``returned``,
    ``sys_exit``, ``exception``, ``os._exit`` or the signal it caught); ``stopped`` that the job
    was stopped (the supervisor sent SIGTERM, then SIGKILL).
    """

    code: int | None
    how: str | None = None
    stopped: bool = False

    @property
    def signal(self) -> str | None:
        """The signal that ended the process, by name (``SIGTERM``), or None."""
        return signal_name(self.code)

    @property
    def by(self) -> str | None:
        """Who sent the signal: ``itself`` (an abort, a crash), ``the stop`` (the supervisor,
        on Stop), ``the launcher`` (torchrun ends the other ranks once one fails), or None
        (no signal, or a SIGKILL from outside: the kernel's OOM killer, a person)."""
        sig = self.signal
        if sig is None:
            return None
        if sig in SELF_SIGNALS:
            return "itself"
        if self.stopped and (sig in TEARDOWN_SIGNALS or sig == "SIGKILL"):
            return "the stop"
        if sig in TEARDOWN_SIGNALS:
            return "the launcher"
        return None

    @property
    def status(self) -> str:
        """One word: ``exited`` (code 0, or a script that had returned when the launcher's
        teardown came), ``failed`` (a non-zero code, or an exception before
        a teardown), ``aborted`` (SIGABRT), ``crashed`` (another signal of its own),
        ``killed`` (SIGKILL from outside), ``stopped`` (by the stop) or ``ended`` (by the
        launcher's teardown, after another rank failed)."""
        sig = self.signal
        if sig is None:
            if self.code is None:
                return "stopped" if self.stopped else "dead"
            return "exited" if self.code == 0 else "failed"
        if sig == "SIGABRT":
            return "aborted"
        if sig in SELF_SIGNALS:
            return "crashed"
        if self.how == "exception":  # it failed first; the teardown found it exiting
            return "failed"
        if self.how == "returned" and self.by == "the launcher":
            return "exited"  # its script had ended; the teardown found it exiting
        if self.by == "the stop":
            return "stopped"
        if self.by == "the launcher":
            return "ended"
        return "killed"

    @property
    def words(self) -> str:
        """The end in a few words, with its number.

        ``exited 0``, ``failed: exit code 1 (an exception)``, ``aborted itself: SIGABRT (-6)``,
        ``ended by the launcher: SIGTERM (-15)``, ``ran its script to the end, then ended by the
        launcher as it exited: SIGTERM (-15)`` (its own end came first), ``stopped: SIGTERM
        (-15)``, ``killed: SIGKILL (-9), by no one rankscope knows``."""
        code, sig, status = self.code, self.signal, self.status
        why = {"exception": "an exception", "sys_exit": "sys.exit", "os._exit": "os._exit"}
        if code is None:
            return "stopped, exit not known" if self.stopped else "gone, exit not known"
        if sig is None:
            if code == 0:
                return "exited 0"
            said = why.get(self.how or "")
            return f"failed: exit code {code}" + (f" ({said})" if said else "")
        number = f"{sig} ({code})"
        if status == "aborted":
            return f"aborted itself: {number}"
        if status == "crashed":
            return f"crashed: {number}"
        if status == "failed":
            return f"failed (an exception), then ended by {self.by or 'a signal'}: {number}"
        if self.how in OWN_ENDS and self.by in ("the launcher", "the stop"):
            left = (
                "ran its script to the end" if self.how == "returned" else f"called {why[self.how]}"
            )
            by = "ended by the launcher" if self.by == "the launcher" else "stopped"
            return f"{left}, then {by} as it exited: {number}"
        if status == "stopped":
            return f"stopped: {number}"
        if status == "ended":
            return f"ended by the launcher: {number}"
        return f"killed: {number}, by no one rankscope knows"


def rank_end(
    *,
    parent_code: int | None = None,
    probe_code: int | None = None,
    how: str | None = None,
    stopped: bool = False,
) -> RankEnd | None:
    """How a rank ended, from its two witnesses (see the module's docstring): ``parent_code``
    (run.json's, torchrun's summary), ``probe_code`` and ``how`` (its end event); ``stopped``:
    the job was stopped. None where neither says it ended."""
    code = parent_code if parent_code is not None else probe_code
    if code is None:
        code = signal_code(how)  # a probe that caught the signal wrote its name
    if code is None and how is None:
        return None
    return RankEnd(code=code, how=how, stopped=stopped)


def ends_text(words: dict[int, str]) -> str:
    """Every rank's end (:attr:`RankEnd.words`, by rank) in one line, ranks alike together:
    ``ranks 0-2 stopped: SIGTERM (-15)``; ``rank 1 aborted itself: SIGABRT (-6); ranks 0, 2
    ended by the launcher: SIGTERM (-15)``."""
    by_words: dict[str, list[int]] = {}
    for rank in sorted(words):
        by_words.setdefault(words[rank] or "not ended", []).append(rank)
    return "; ".join(f"{ranks_text(ranks)} {w}" for w, ranks in by_words.items())


def agree(who: str, one: str, many: str) -> str:
    """``one`` where ``who`` (as :func:`ranks_text` and ``who_of`` write it) names one rank,
    else ``many``: ``agree(ranks_text(ranks), "is", "are")``, so that the words of a sentence
    agree with the ranks it names."""
    return many if who.startswith("ranks ") else one


def ranks_text(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 0-2, 5``."""
    return ("rank " if len(ranks) == 1 else "ranks ") + compact_ranks(ranks)


def compact_ranks(ranks: Iterable[int]) -> str:
    """``0-3, 5, 7-9``: sorted ranks with runs collapsed."""
    ranks = sorted(set(ranks))
    parts = []
    start = 0
    for i in range(1, len(ranks) + 1):
        if i == len(ranks) or ranks[i] != ranks[i - 1] + 1:
            first, last = ranks[start], ranks[i - 1]
            parts.append(str(first) if first == last else f"{first}-{last}")
            start = i
    return ", ".join(parts)


def shapes_text(shapes: Any) -> str:
    """A call's tensor shapes as a person reads them: ``16``, ``4x8``, ``scalar`` (a 0-d
    tensor), several tensors' joined by commas (``16, 16``); ``no tensor`` for none. Takes the
    list the probe records or its text (``[[16]]``); other text comes back as it is."""
    if isinstance(shapes, str):
        try:
            shapes = json.loads(shapes)
        except ValueError:
            return shapes
    if not isinstance(shapes, list):
        return "" if shapes is None else str(shapes)
    if not shapes:
        return "no tensor"
    if not all(isinstance(s, list) for s in shapes):  # one tensor's shape
        shapes = [shapes]
    return ", ".join("scalar" if not s else "x".join(map(str, s)) for s in shapes)


def dtypes_text(dtypes: Any) -> str:
    """A call's tensor dtypes as a person reads them: ``float32``, ``float32, int64``; takes the
    list the probe records or its text (``["float32"]``); other text comes back as it is."""
    if isinstance(dtypes, str):
        try:
            dtypes = json.loads(dtypes)
        except ValueError:
            return dtypes
    if not isinstance(dtypes, list):
        return "" if dtypes is None else str(dtypes)
    return ", ".join(map(str, dtypes)) if dtypes else "no tensor"


def group_name(pg: Any, desc: str | None = None, ranks: Iterable[int] | None = None) -> str:
    """``group 0 (default_pg)``; where torch's description says nothing (none, or
    ``undefined``), the group's ranks instead: ``group 3 (ranks 0, 2)``."""
    name = f"group {pg}"
    if desc and desc != "undefined":
        return f"{name} ({desc})"
    members = sorted(set(ranks or ()))
    return f"{name} ({ranks_text(members)})" if members else name


def proof_text(proven: str) -> str:
    """The stall prover's finding (:func:`rankscope.waitfor.prove`) as a sentence."""
    return (
        "The ranks that wait could never leave their call, as the ranks' live state proved: "
        f"{proven.rstrip('.')}."
    )


#: How long after its end event a rank's process may still run without having outlived its
#: end: the interpreter's own exit (its modules, a process group's teardown).
EXITING_S = 1.0


def stopping(info: dict[str, Any]) -> bool:
    """Whether the job of ``info`` (its run.json) is being or was stopped (a stall's policy,
    the user, a time limit): a SIGTERM or SIGKILL its ranks got was the stop's."""
    return bool(info.get("stop_reason")) or info.get("state") == "stopped"


def job_state_words(state: str, statuses: list[str], *, stopping: bool = False) -> str:
    """The job's state as its status line says it, never contradicting its rows: a job whose
    ranks have all ended is ``ending`` until its supervisor writes its final state, and a job
    being stopped is ``stopping`` (not ``stalled``) until then."""
    if state in ("running", "stalled", "starting") and statuses:
        alive = [s for s in statuses if s in ("running", "waiting")]
        if not alive:
            return "ending (every rank ended)"
    if stopping and state in ("running", "stalled", "starting"):
        return "stopping"
    return state
