"""The causes a diagnosis can name: each a constant of :class:`Cause`, with its entry (the
verdict it gives, its recipe, a one-line reason and the fix).

Recipes are those of the guide in ``seeds/002`` (D1-D23). The reason is a template filled from the
facts of one diagnosis (see :func:`explain`); the fix is advice in our own words. A template
names only facts every diagnosis of its cause has; what may be unknown (a call site) comes as a
phrase that is empty when unknown (``culprit_at``: `` at train.py:12`` or nothing). The facts
a template names are :attr:`Cause.facts`; a rule's :class:`~rankscope.analyze.rules.Finding`
must set them all (its constructor checks), so a misspelt key fails at once instead of rendering
as "unknown".

A new cause: a member of :class:`Cause`, its :class:`Entry` in :data:`ENTRIES`, and the rule that
decides it (see :mod:`rankscope.analyze.rules`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from string import Formatter
from typing import Any, Literal

from rankscope.collect.signatures import KNOWN

Verdict = Literal["ok", "hang", "crash", "launch_error", "unknown"]
#: ``unknown``: the evidence cannot tell (nothing readable, or ranks ended for reasons it does
#: not show); never said of a job that is known to have failed, and never ``ok``.
VERDICTS: tuple[Verdict, ...] = ("ok", "hang", "crash", "launch_error", "unknown")


@dataclass(frozen=True, kw_only=True)
class Entry:
    """What a cause means: one entry of :data:`ENTRIES`."""

    verdict: Verdict
    recipe: str | None
    title: str
    reason: str
    """Template for the one-line reason; fields are those of :func:`explain`."""
    fix: str
    """The advice; a template too where it depends on what the culprit was doing."""


class Cause(StrEnum):
    """A cause a rule can name; equal to its name as a string (the ``cause`` of a
    :class:`~rankscope.analyze.Diagnosis` and of ``diagnosis.json``). Its entry's fields read as
    its own (``Cause.oom.verdict``)."""

    op_mismatch = "op_mismatch"
    shape_mismatch = "shape_mismatch"
    dtype_mismatch = "dtype_mismatch"
    root_mismatch = "root_mismatch"
    rank_conditional_collective = "rank_conditional_collective"
    early_exit = "early_exit"
    uneven_inputs = "uneven_inputs"
    stuck_outside = "stuck_outside"
    ddp_model_mismatch = "ddp_model_mismatch"
    busy_outside = "busy_outside"
    stuck_at_exit = "stuck_at_exit"
    lagging_rank = "lagging_rank"
    stream_stuck = "stream_stuck"
    rank_crashed = "rank_crashed"
    rank_killed = "rank_killed"
    node_lost = "node_lost"
    nan = "nan"
    oom = "oom"
    ddp_unused_parameters = "ddp_unused_parameters"
    p2p_cycle = "p2p_cycle"
    p2p_peer_mismatch = "p2p_peer_mismatch"
    swallowed_errors = "swallowed_errors"
    straggler = "straggler"
    silent_rank = "silent_rank"
    undetermined = "undetermined"
    stuck_collective = "stuck_collective"
    collective_timeout = "collective_timeout"
    env_contract_missing = "env_contract_missing"
    address_in_use = "address_in_use"
    invalid_device_ordinal = "invalid_device_ordinal"
    duplicate_gpu = "duplicate_gpu"
    rendezvous_timeout = "rendezvous_timeout"
    hostfile_invalid = "hostfile_invalid"
    launch_failed = "launch_failed"

    @property
    def entry(self) -> Entry:
        return ENTRIES[self]

    @property
    def verdict(self) -> Verdict:
        return self.entry.verdict

    @property
    def recipe(self) -> str | None:
        return self.entry.recipe

    @property
    def title(self) -> str:
        return self.entry.title

    @property
    def reason(self) -> str:
        return self.entry.reason

    @property
    def fix(self) -> str:
        return self.entry.fix

    @property
    def facts(self) -> frozenset[str]:
        """The facts its reason and fix name."""
        return frozenset(
            field
            for text in (self.reason, self.fix)
            for _, field, _, _ in Formatter().parse(text)
            if field
        )


#: Each cause's entry.
ENTRIES: Mapping[Cause, Entry] = {
    Cause.op_mismatch: Entry(
        verdict="hang",
        recipe="D19",
        title="collective op mismatch",
        reason="{culprits} called {culprit_op}{culprit_at} where {others} called "
        "{other_op}{other_at} ({collective})",
        fix="Make every rank issue the same collectives in the same order; rerun with "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL (the 'detail' preset) so torch names the mismatch at once.",
    ),
    Cause.shape_mismatch: Entry(
        verdict="hang",
        recipe="D19",
        title="shape mismatch",
        reason="{culprits} passed shapes {culprit_shapes} to {culprit_op}{culprit_at} "
        "where {others} passed {other_shapes} ({collective})",
        fix="Give the collective tensors of the same shape on every rank (pad, or all-gather "
        "the sizes first); the 'detail' preset checks shapes before each collective.",
    ),
    Cause.dtype_mismatch: Entry(
        verdict="hang",
        recipe="D19",
        title="dtype mismatch",
        reason="{culprits} passed {culprit_dtypes} to {culprit_op}{culprit_at} where "
        "{others} passed {other_dtypes} ({collective})",
        fix="Cast to one dtype on every rank before the collective (mixed-precision settings "
        "must match across ranks); the 'detail' preset checks dtypes too.",
    ),
    Cause.root_mismatch: Entry(
        verdict="hang",
        recipe="D19",
        title="the ranks disagree on the root",
        reason="{culprits} called {culprit_op}{culprit_at} with root {culprit_root} where "
        "{others} named root {other_root} ({collective})",
        fix="Pass the same src/dst on every rank, as a global rank: on a sub-group, use "
        "group_src/group_dst or torch.distributed.get_global_rank(group, r), not the rank "
        "within the group; the 'detail' preset checks the collectives first.",
    ),
    Cause.rank_conditional_collective: Entry(
        verdict="hang",
        recipe="D21",
        title="rank-conditional collective",
        reason="{culprits} {culprit_doing} while {others} {other_doing} ({collective}): a "
        "collective that not every rank reaches",
        fix="Call collectives on every rank unconditionally and gate only the side effect "
        "(logging, saving) on the rank; look for collectives hidden in `if rank == 0:` blocks.",
    ),
    Cause.early_exit: Entry(
        verdict="hang",
        recipe="D9",
        title="rank exited early",
        reason="{culprits} {culprit_left} after {culprit_done} collectives on {group} while "
        "{others} still waited in {other_op}{other_at} ({collective})",
        fix="{exit_fix}",
    ),
    Cause.uneven_inputs: Entry(
        verdict="hang",
        recipe="D9",
        title="a rank ran out of data (uneven inputs)",
        reason="{culprits} ran out of iterations: {culprit_done}, then {culprit_went}, while "
        "{others} still {others_wait} in {other_op}{other_at} ({collective})",
        fix="Give every rank the same number of batches (DistributedSampler with the same "
        "drop_last everywhere, or all-reduce the count and stop together), or wrap the loop in "
        "torch.distributed.algorithms.Join; a loader whose length differs per rank is recipe "
        "D22.",
    ),
    Cause.stuck_outside: Entry(
        verdict="hang",
        recipe="D19",
        title="a rank is stuck outside the collectives",
        reason="{others} {others_wait} in {other_op}{other_at} ({collective}) for {culprits}, "
        "which {culprits_are} {culprit_doing}",
        fix="{wait_fix}",
    ),
    Cause.ddp_model_mismatch: Entry(
        verdict="crash",
        recipe="D19",
        title="DDP was given a different model on some rank",
        reason="{culprits} built a model with {culprit_model} where {others} have "
        "{other_model}{culprit_at}: {error}",
        fix="Build the model the same way on every rank before wrapping it in DDP (the same "
        "parameters, in the same order, of the same shapes): look for a layer, a config value "
        "or a checkpoint that depends on the rank or on a file only some ranks read, and "
        "broadcast such a decision from rank 0.",
    ),
    Cause.busy_outside: Entry(
        verdict="hang",
        recipe=None,
        title="a rank computes without end outside the collectives",
        reason="{others} {others_wait} in {other_op}{other_at} ({collective}) for {culprits}, "
        "which {culprits_are} {culprit_doing}",
        fix="The rank keeps computing and never reaches the collective: a loop whose exit it "
        "never meets (a tolerance, a convergence test, a counter that differs on this rank). "
        "Bound the loop (a maximum number of iterations), decide its exit on every rank alike "
        "(all-reduce the condition), or raise the stall timeout if the rank is only slow.",
    ),
    Cause.stuck_at_exit: Entry(
        verdict="hang",
        recipe=None,
        title="a rank's process did not exit after its script ended",
        reason="{culprits} ended {culprits_its} script{ended_how}, but {culprits_its} process "
        "had not exited {lingered} later: {exit_wait}",
        fix="{exit_fix}",
    ),
    Cause.lagging_rank: Entry(
        verdict="hang",
        recipe="D19",
        title="a rank never joined the collective",
        reason="{culprits} never joined {other_op}{other_at} that {others} waited in "
        "({collective}); last seen: {culprit_doing}",
        fix="Look at what that rank was doing instead (its stacks, its last log lines): it is "
        "stuck or busy outside the collective; TORCH_DISTRIBUTED_DEBUG=DETAIL names it at once.",
    ),
    Cause.stream_stuck: Entry(
        verdict="hang",
        recipe="D19",
        title="a rank's stream never reached the collective",
        reason="{culprits} issued {culprit_op} ({collective}) but the GPU stream never "
        "started it ({others_started}): the stream is still busy with earlier "
        "work (a kernel that never ends, a wait on an event never recorded); its last completed "
        "collective: {stream_last}; last seen: {culprit_doing}",
        fix="Find what that rank's stream runs before the collective: a kernel that never ends "
        "(a spin on a flag, a device-side deadlock), a wait on an event or a stream never "
        "recorded, a custom op that blocks. py-spy dump --native shows the host side; "
        "CUDA_LAUNCH_BLOCKING=1 makes the stuck kernel show at its launch.",
    ),
    Cause.rank_crashed: Entry(
        verdict="crash",
        recipe="D20",
        title="a rank crashed",
        reason="{culprits} failed with {error}{culprit_at}{known}, leaving {others} waiting",
        fix="{crash_fix}",
    ),
    Cause.rank_killed: Entry(
        verdict="crash",
        recipe="D20",
        title="a rank was killed",
        reason="{culprits} {death}{culprit_at}, leaving {others} {left}",
        fix="A SIGKILL comes from outside the process, which gets no chance to say why: look "
        "for the kernel's OOM killer on that host (dmesg or journalctl -k: 'Out of memory: "
        "Killed process <pid>'), a scheduler enforcing a memory or time limit, or a kill -9. "
        "Host memory is the usual suspect: data-loader workers, pinned buffers, a rank that "
        "loads more than the others.",
    ),
    Cause.node_lost: Entry(
        verdict="crash",
        recipe=None,
        title="a node went down",
        reason="{culprits} ran on {nodes}, which SLURM lost ({lost}), and it ended the job "
        "{state}, leaving {others} {left}",
        fix="The ranks on that node did nothing wrong of their own: the node did (power, "
        "network, a kernel panic, a health check). Ask SLURM what it knows (scontrol show node "
        "{nodes}; the slurmctld log) and rerun without it (sbatch --exclude={nodes}) until it is "
        "repaired.",
    ),
    Cause.nan: Entry(
        verdict="crash",
        recipe="D20",
        title="a rank hit NaN",
        reason="{culprits} stopped on a non-finite value ({error}){culprit_at}, leaving "
        "{others} waiting",
        fix="Find why this rank's values became NaN (its data shard, learning rate, precision); "
        "lowering the batch size does not fix one rank's data bug.",
    ),
    Cause.oom: Entry(
        verdict="crash",
        recipe="D20",
        title="a rank ran out of memory",
        reason="{culprits} ran out of memory ({error}){culprit_at}, leaving {others} waiting",
        fix="Cut this rank's peak memory: uneven sample lengths put the largest batch on one "
        "rank; shard or checkpoint activations rather than waiting out the hang.",
    ),
    Cause.ddp_unused_parameters: Entry(
        verdict="crash",
        recipe="D8",
        title="DDP reduction never finished (unused parameters)",
        reason="{culprits}: DDP found parameters that got no gradient ({error})",
        fix="Make every output take part in the loss; only if a branch is unused by design, "
        "pass find_unused_parameters=True to DistributedDataParallel (it costs a graph walk).",
    ),
    Cause.p2p_cycle: Entry(
        verdict="hang",
        recipe="D19",
        title="point-to-point cycle",
        reason="{cycle}: every rank waits in a point-to-point call for a peer that is itself "
        "waiting",
        fix="Order the calls so one side sends while the other receives (for example even ranks "
        "send first), or post both with isend/irecv (batch_isend_irecv) and wait on both.",
    ),
    Cause.p2p_peer_mismatch: Entry(
        verdict="hang",
        recipe="D19",
        title="point-to-point peer mismatch",
        reason="{culprits} called {culprit_op} with peer {culprit_peer}{culprit_at}, where that "
        "call named peer {usual_peer} before, while {others} {other_doing}: {mismatch}",
        fix="Compute the peer of every send and recv from one rule that all ranks share (the "
        "pipeline's next and previous stage), and check it where it is computed: a send to "
        "rank j must meet a recv from this rank on rank j; batch_isend_irecv posts both sides "
        "at once.",
    ),
    Cause.swallowed_errors: Entry(
        verdict="crash",
        recipe=None,
        title="the ranks diverged, and the errors were swallowed",
        reason="every rank exited 0, yet {swallowed}",
        fix="Do not catch a collective's error and go on: a rank that skips a collective, or "
        "whose peer did, is out of step with the others for the rest of the job (its results "
        "are wrong even where nothing hangs). Let the error end the job, or decide a retry or a "
        "skip on every rank together (all_reduce a flag first).",
    ),
    Cause.straggler: Entry(
        verdict="ok",
        recipe="D23",
        title="straggler",
        reason="{culprits} reached {culprit_op}{culprit_at} {late} after the others "
        "({collective}); the job went on",
        fix="Not a hang: balance the slow rank's work (data loading, rank-0-only eval or "
        "saving), and tell slow from stuck with the step counter before raising timeouts.",
    ),
    Cause.silent_rank: Entry(
        verdict="hang",
        recipe="D19",
        title="a rank left no evidence",
        reason="{others} {others_wait} in {other_op}{other_at} ({collective}) for {culprits}, "
        "which left no record of {culprits_its} collectives",
        fix="Get that rank's evidence (flight-recorder dump, stacks, logs): it may have died or "
        "hung before its recorder started; keep the flight recorder on for every rank.",
    ),
    Cause.undetermined: Entry(
        verdict="hang",
        recipe=None,
        title="the ranks parted, and the evidence does not show how",
        reason="{culprits} called {culprit_op}{culprit_at} where {others} {others_wait} in "
        "{other_op}{other_at} ({collective}); {unknown}",
        fix="The causes that remain possible: {possible}. Capture the ranks' stacks again "
        "(Job.capture, rankscope capture) while the job is still frozen, or run it again with "
        "a longer stall timeout, to tell them apart.",
    ),
    Cause.stuck_collective: Entry(
        verdict="hang",
        recipe="D19",
        title="every rank is inside the same collective",
        reason="{others} all waited in {other_op}{other_at} ({collective}) with matching "
        "calls: no rank diverged and none is missing",
        fix="The ranks agree, so look below Python: the transport (NCCL_DEBUG=INFO, the network "
        "between hosts), a device fault, or native stacks (py-spy dump --native).",
    ),
    Cause.collective_timeout: Entry(
        verdict="hang",
        recipe="D19",
        title="collectives timed out",
        reason="{others} timed out in {other_op} ({collective}) and the evidence names no "
        "rank that diverged",
        fix="Capture evidence from every rank before the timeout (flight recorder, stacks): "
        "the rank that is missing or different there is the one to fix.",
    ),
    Cause.env_contract_missing: Entry(
        verdict="launch_error",
        recipe="D1",
        title="the rank/world-size environment is missing",
        reason="{culprits}: {error}",
        fix="Launch through torchrun, which sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and "
        "MASTER_PORT for every process, or set them yourself.",
    ),
    Cause.address_in_use: Entry(
        verdict="launch_error",
        recipe="D4",
        title="port already in use",
        reason="{culprits} could not bind the rendezvous port: {error}",
        fix="Give each job on a host its own port (--master-port, or --rdzv-endpoint "
        "localhost:0 to let torchrun pick one), and stop leftovers of earlier runs.",
    ),
    Cause.invalid_device_ordinal: Entry(
        verdict="launch_error",
        recipe="D3",
        title="invalid device ordinal",
        reason="{culprits} selected a GPU that does not exist: {error}",
        fix="Select the device with LOCAL_RANK, not RANK: "
        "torch.cuda.set_device(int(os.environ['LOCAL_RANK'])).",
    ),
    Cause.duplicate_gpu: Entry(
        verdict="launch_error",
        recipe="D3",
        title="two ranks on one GPU",
        reason="{culprits} found another rank of {culprits_its} node on the same GPU: {error}",
        fix="Start at most as many ranks per node as it has GPUs (--nproc-per-node no more "
        "than torch.cuda.device_count()) and give each its own before the process group "
        "exists: torch.cuda.set_device(int(os.environ['LOCAL_RANK'])), not RANK and not a "
        "fixed index. rankscope run refuses more nccl ranks per node than visible GPUs.",
    ),
    Cause.rendezvous_timeout: Entry(
        verdict="launch_error",
        recipe="D2",
        title="the rendezvous timed out",
        reason="torchrun gave up waiting for the other nodes to join its rendezvous: {error}",
        fix="Start every node with the same --rdzv-id, the same --rdzv-endpoint (reachable "
        "from every node) and the same --nnodes, all within the join timeout; a single node "
        "needs none of it: torchrun --standalone.",
    ),
    Cause.hostfile_invalid: Entry(
        verdict="launch_error",
        recipe="D6",
        title="the DeepSpeed hostfile is invalid",
        reason="the deepspeed launcher refused its hostfile before starting any process: {error}",
        fix="Write one line per node in MPI style, `<hostname> slots=<processes on that node>` "
        "(not `host:N`), each host once; on a single node, drop the hostfile and pass "
        "--num_gpus instead.",
    ),
    Cause.launch_failed: Entry(
        verdict="launch_error",
        recipe=None,
        title="the process group never formed",
        reason="{culprits}: {error}",
        fix="Read the failing rank's error and launcher.log: the ranks failed while setting up "
        "(rendezvous, store, backend) before their first collective.",
    ),
}

#: Facts the driver (:func:`rankscope.analyze.diagnose`) adds to every finding's own: the ranks
#: named, and each site as a phrase (`` at train.py:12`` or nothing).
#: The early exit's advice where its rank's data loop ended (it ran its script to the end with
#: fewer calls): recipe D9's.
UNEVEN_FIX = (
    "Give every rank the same number of steps (DistributedSampler with the same drop_last "
    "everywhere), or wrap the loop in torch.distributed.algorithms.Join."
)
#: A crash's advice where its text is no known error (:func:`rankscope.collect.recognise`).
CRASH_FIX = (
    "Fix the failing rank, not the hang: its error is the cause and the others only waited for "
    "it. With nccl, TORCH_NCCL_ASYNC_ERROR_HANDLING=1 makes the peers abort promptly."
)
#: A crash's advice where a cell raised on some ranks of a cell session (and its text is no
#: known error): the others wait in the cell for a call those ranks will not make.
CELL_RAISED_FIX = (
    "Fix the cell's error on the rank where it raised (its traceback is in the cell's output, "
    "under that rank): the other ranks only wait for it, in a call it will not make now. "
    "%ranks restart starts fresh ranks (--replay runs the earlier cells again); then run the "
    "fixed cell."
)
#: The early exit's advice where the user's code asked for it (sys.exit, os._exit).
ASKED_EXIT_FIX = (
    "The exit{exit_at} ends this rank alone, and the others wait for it in their next "
    "collective. Take the decision to stop on every rank together (all_reduce the condition, "
    "such as a NaN flag, and stop at the same step), or end the whole job on purpose: raise, "
    "so that torchrun stops the other ranks."
)

#: The facts the driver adds to every finding's: who (:func:`~rankscope.analyze.diagnosis.who_of`),
#: where, and the words that agree with who (``rank 2, which is`` / ``ranks 1-2, which are``).
DRIVER_FACTS = frozenset(
    {"culprits", "others", "culprit_at", "other_at", "culprits_are", "culprits_its", "others_wait"}
)

#: Cause name -> :class:`Cause`.
CAUSES: Mapping[str, Cause] = {c.value: c for c in Cause}

#: Error kinds (the collectors' signature kinds) that name a launch problem, by cause.
LAUNCH_KINDS: Mapping[str, Cause] = {
    "env_missing": Cause.env_contract_missing,
    "address_in_use": Cause.address_in_use,
    "invalid_device_ordinal": Cause.invalid_device_ordinal,
    "nccl_duplicate_gpu": Cause.duplicate_gpu,
    "deepspeed_hostfile": Cause.hostfile_invalid,
    "rendezvous_timeout": Cause.rendezvous_timeout,
}

#: Error kinds that are a primary failure of the rank that logged them, by cause: a known
#: error (a text that names a recipe's mistake) is a crash whose recipe is its own.
FAILURE_KINDS: Mapping[str, Cause] = {
    "cuda_oom": Cause.oom,
    "cuda_error": Cause.rank_crashed,
    "ddp_unused_parameters": Cause.ddp_unused_parameters,
    **{s.kind: Cause.rank_crashed for s in KNOWN},
}


def explain(cause: str, facts: Mapping[str, Any]) -> str:
    """The cause's one-line reason filled from ``facts``, which hold every fact it names
    (:attr:`Cause.facts`)."""
    return CAUSES[cause].reason.format_map(facts)


def fix_for(cause: str, facts: Mapping[str, Any]) -> str:
    """The cause's advice, filled from ``facts`` where it depends on them."""
    return CAUSES[cause].fix.format_map(facts)
