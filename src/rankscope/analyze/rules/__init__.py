"""The rules of a diagnosis: each a function of a :class:`~rankscope.analyze.context.Context`
that answers with a :class:`Finding` or passes (``None``), grouped by family, one file each.

The order (:func:`rules_for`; the first that answers decides). Each rule says its place with
``@rule(place)`` above its function: its number in this list times ten (``launch_error`` is
10, ``straggler`` 100), so a new rule takes a place between two.

0. Every rank exited 0: whatever the flight recorder still lists as in flight (DDP's last bucket
   is often never retired), the job did not hang; only ``swallowed`` (:mod:`.paths`: yet the
   ranks' calls parted, or collectives raised errors the code caught) and ``straggler`` are
   asked (:data:`ON_CLEAN_EXIT`). Otherwise :data:`RULES`, in this order:
1. ``launch_error`` (:mod:`.launch`): the ranks never formed a group (environment, port,
   rendezvous, hostfile). Then, at 15, ``node_lost`` (:mod:`.failures`): SLURM ended the job
   ``NODE_FAIL`` and named the nodes it lost; the ranks on them are the culprits, whatever the
   moment it went down caught them doing.
2. ``model_mismatch`` (:mod:`.failures`): DDP's constructor found models that differ across
   ranks; its texts name each rank's parameters, and the odd ones out are the culprits (every
   rank raised).
3. ``reported_failure`` (:mod:`.failures`): a rank reported a failure of its own (an exception
   outside any collective, an OOM, a NaN, DDP's reduction error) and left the others waiting.
   Then, at 35, ``earlier_divergence`` (:mod:`.paths`): the ranks' paths parted before the
   place where they stopped (a retry branch that added a call, one more micro-batch on one
   rank): the class that left the shared path there is the culprit, whatever the final
   snapshot shows.
4. ``mismatch`` (:mod:`.mismatch`): ranks called different collectives (op, shapes, dtype) where
   their sequences first part. This comes before any death: a mismatch can kill a rank (gloo
   aborts one that receives more bytes than it expects), which is then its victim. Then, at 45,
   ``peer_mismatch`` (:mod:`.paths`): point-to-point calls that do not meet (a rank sent to a
   peer more or fewer times than that peer received from it); the rank whose call left its own
   pattern is the culprit.
5. ``signal_death`` (:mod:`.failures`): a rank died of a signal (SIGKILL, SIGSEGV, SIGABRT, ...)
   that no text of its own blames on a peer.
6. ``stream_stuck`` (:mod:`.stream`): a collective that some ranks' devices started and others'
   never did (nccl with timing, from the recorder's entry states): those ranks' streams are held
   by earlier work.
7. ``waits`` (:mod:`.waits`): the wait-for graph across every group leads to the culprit: a rank
   waited on that waits for nobody (what was it doing instead: exited, crashed, out of data,
   blocked on a lock or a sleep, busy elsewhere, silent), or, where every rank waits, the rank of
   a cycle that left the program order the others share (a skipped call, a point-to-point
   cycle), or every rank stuck in one collective. Then, at 75, ``stuck_at_exit``
   (:mod:`.exits`): every rank ended its script, but a rank's process outlived its end (stacks
   of it taken later, or the stop ended it): what its exit waits for.
8. ``errors_only`` (:mod:`.errors`): no record of calls says anything, the error texts may (DETAIL
   fingerprints, monitored_barrier, timeouts in foreign logs).
9. ``bare_exit`` (:mod:`.failures`): a rank exited non-zero and nothing else says why.
10. ``straggler`` (:mod:`.straggler`): every collective completed, but one rank arrived far behind
    (``ok``); not at a rank's first call, where ranks part by how long each took to start,
    unless the stall watchdog called the wait.

A rule is a plain function: test it on a context built from tables (see the tests). It returns a
new :class:`Finding` and changes none after. Each cause is named in one function alone (a test
checks), which decides it; where several rules reach one cause (a branch some ranks took is seen
where the sequences part, in the stacks, or in a cycle of waits), they call that function, which
returns a :class:`Decided` (the cause, its culprits, the facts it adds, its notes) for the rule
to build its finding from:

==================================================  ===========================================
cause                                               decided in
==================================================  ===========================================
the launch causes (by error kind), launch_failed    :func:`.launch.launch_error`
node_lost                                           :func:`.failures.node_lost`
ddp_model_mismatch                                  :func:`.failures.model_mismatch`
oom, nan, rank_crashed, rank_killed,                :func:`.failures.failure_cause`
ddp_unused_parameters
op/shape/dtype/root_mismatch                        :data:`.mismatch.DIFFERENT_CALL`
rank_conditional_collective                         :func:`.mismatch.took_a_branch`
swallowed_errors                                    :func:`.paths.swallowed`
p2p_peer_mismatch                                   :func:`.paths.peer_mismatch`
uneven_inputs                                       :func:`.mismatch.ran_out`
stream_stuck                                        :func:`.stream.stream_stuck`
early_exit, busy_outside                            :func:`.waits._decide_root_cause`
stuck_outside                                       :func:`.waits.blocked_outside`
lagging_rank, silent_rank                           :func:`.waits.lagging`, :func:`.waits.silent`
p2p_cycle, stuck_collective                         ``.waits._p2p_cycle``, ``.waits._all_stuck``
stuck_at_exit                                       :func:`.exits.stuck_at_exit`
collective_timeout                                  :func:`.errors.errors_only`
straggler                                           :func:`.straggler.straggler`
==================================================  ===========================================

How to add a rule
-----------------
Say some jobs die because a rank lost its network file system, and their logs say
``Stale file handle``. Two edits:

1. The cause, in :mod:`rankscope.analyze.causes`: a member of ``Cause`` and its ``Entry``. Its
   templates name the facts the rule sets (here ``{error}``) and those the driver adds to every
   finding (``culprits``, ``others``, ``culprit_at``, ``other_at``)::

       stale_mount = "stale_mount"  # in class Cause

       Cause.stale_mount: Entry(  # in ENTRIES
           verdict="crash",
           recipe=None,
           title="a rank lost its file system",
           reason="{culprits} lost a mounted file system ({error}), leaving {others} waiting",
           fix="Check the mount on that host (NFS server, network) before rerunning.",
       ),

2. The rule, in its family's file (here :mod:`.failures`: a rank's own failure)::

       @rule(35)
       def stale_mount(ctx: Context) -> Finding | None:
           logs = ctx.ev.table("logs")
           hit = logs[logs["text"].str.contains("Stale file handle", na=False)]
           if hit.empty:
               return None
           culprits = sorted(set(hit["rank"].dropna().astype(int).tolist()))
           return Finding(
               cause=Cause.stale_mount,
               culprits=culprits,
               waiting=ctx.blocked(exclude=set(culprits)),
               facts={"error": short(hit["text"].iloc[0])},
           )

The decorator is its place in the order: ``@rule(35)`` above the function asks it after
``reported_failure`` (30), which already names a rank's exception, and before ``mismatch``
(40). Nothing else: every file of this package is loaded, and :data:`RULES` is every rule by
its place.

A finding that lacks a fact its templates name raises when it is made, and
``tests/test_analyze_rules.py`` checks that each cause is named in one function, whose rules set
every fact its templates name: a misspelt key fails the suite rather than rendering as
"unknown".
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence

from rankscope.analyze.context import Context
from rankscope.analyze.rules.errors import errors_only
from rankscope.analyze.rules.exits import stuck_at_exit
from rankscope.analyze.rules.failures import (
    bare_exit,
    model_mismatch,
    node_lost,
    reported_failure,
    signal_death,
)
from rankscope.analyze.rules.finding import REGISTERED, Decided, Failure, Finding, Rule, rule
from rankscope.analyze.rules.launch import launch_error
from rankscope.analyze.rules.mismatch import mismatch
from rankscope.analyze.rules.paths import earlier_divergence, swallowed
from rankscope.analyze.rules.straggler import straggler
from rankscope.analyze.rules.stream import stream_stuck
from rankscope.analyze.rules.waits import waits

# Every family's file is loaded (those above and any other), so that each rule in it registers
# at its place.
for _family in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_family.name}")

#: The rules, in the order they are asked (see the module docstring): each family's rules,
#: registered at their places by :func:`rule`.
RULES: tuple[Rule, ...] = tuple(REGISTERED[place] for place in sorted(REGISTERED))

#: The rules asked of a job whose every rank exited 0 (step 0 of the order).
ON_CLEAN_EXIT: tuple[Rule, ...] = (swallowed, straggler)


def rules_for(ctx: Context, rules: Sequence[Rule] = RULES) -> Sequence[Rule]:
    """The rules to ask of this run, in order: :data:`ON_CLEAN_EXIT` where every rank of the
    world exited 0 (it did not hang, whatever the recorder lists in flight), else ``rules``."""
    codes = [f.exit_code for f in ctx.facts.values()]  # one per rank of the world
    return ON_CLEAN_EXIT if codes and all(c == 0 for c in codes) else rules


__all__ = [
    "ON_CLEAN_EXIT",
    "RULES",
    "Decided",
    "Failure",
    "Finding",
    "Rule",
    "bare_exit",
    "earlier_divergence",
    "errors_only",
    "launch_error",
    "mismatch",
    "model_mismatch",
    "node_lost",
    "reported_failure",
    "rule",
    "rules_for",
    "signal_death",
    "straggler",
    "stream_stuck",
    "stuck_at_exit",
    "swallowed",
    "waits",
]
