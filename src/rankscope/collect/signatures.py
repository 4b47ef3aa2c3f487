"""The known error signatures: one entry per signature, data only.

Each entry says what it is (``kind``), a plain substring that every matching line contains
(``literal``, checked first and vectorised, so most lines are never regex-matched), the regex
whose named groups become the parsed ``fields``, how many following lines may hold more fields
(``follow`` and ``more``, for messages that torch spreads over several lines), and the recipe
(D1-D23 of the recipe guide) it points to, and what the text says of the rank that logged it
(``role``, one of :data:`ROLES`). To add a signature, add an entry; the texts quoted in the
comments are real ones.

A signature with a ``fix`` is a *known error*: a text that says which recipe's mistake the rank
made (DeepSpeed's batch-size assertion, FSDP's dtype checks, ...). Its ``title`` names the
mistake, and ``values`` and ``fix`` are templates filled from its named groups
(:func:`rankscope.collect.errors.recognise`); the crash rule puts them on the card with the
recipe. Each one's comment says which library version's text it was checked on; its regex
takes the library's family of messages (any sizes, ranks, dtypes), not one run's numbers.

Named groups ending in ``_ms``, ``_rank``, ``seq`` and the like are converted to ints by
:data:`INT_FIELDS`; ``parser`` names a function in :mod:`rankscope.collect.errors` for the two
texts that a regex cannot take apart (collective fingerprints, torchrun's failure summary).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from string import Formatter

#: What a text says of the rank that logged it. The first three make it a victim: it suffered
#: another rank's mismatch, exit or delay, and is never the culprit by that text alone.
ROLES = {
    "mismatch": "its peers' calls did not match its own (which side is odd, the calls tell)",
    "peer_exit": "a peer went away (crashed, was killed or exited) while it talked to it",
    "timeout": "it waited in a collective until a timeout",
    "own": "a failure of its own (out of memory, DDP's unused parameters)",
    "launch": "the job's set-up failed (environment, port, rendezvous, hostfile, device)",
    "abort": "the process aborted itself; why is in the lines around it",
    "report": "a report naming ranks (torchrun's summary, DETAIL fingerprints, monitored_barrier)",
    "warning": "a warning (NCCL WARN)",
}
VICTIM_ROLES = frozenset({"mismatch", "peer_exit", "timeout"})


@dataclass(frozen=True)
class Signature:
    kind: str
    recipe: str | None
    literal: str
    regex: re.Pattern[str]
    role: str
    follow: int = 0
    more: tuple[re.Pattern[str], ...] = ()
    parser: str | None = None
    doc: str = ""
    title: str = ""
    """A known error's mistake in a few words (the card's reason names it)."""
    values: str = ""
    """A known error's values as a template of the regex's named groups."""
    fix: str = ""
    """A known error's fix, a template of the regex's named groups; empty for other texts."""

    def __post_init__(self) -> None:
        assert self.role in ROLES, self.role
        named = set(self.regex.groupindex).union(*(p.groupindex for p in self.more))
        for template in (self.values, self.fix):
            unknown = {f for _, f, _, _ in Formatter().parse(template) if f} - named
            assert not unknown, (self.kind, unknown)
        assert bool(self.title) == bool(self.fix), self.kind


def _re(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


#: Fields converted to int wherever a signature captures them.
INT_FIELDS = frozenset(
    {
        "timeout_ms",
        "ran_for_ms",
        "seq",
        "numel_in",
        "numel_out",
        "reporting_rank",
        "failed_rank",
        "grad_rank",
        "port",
        "device",
        "peer_port",
        "line",
        "from_rank",
        "got_bytes",
        "expected_bytes",
        "comm_rank",
        "last_enqueued",
        "last_completed",
        "rank_a",
        "rank_b",
        "count_a",
        "count_b",
        "param",
        "first_rank",
        "second_rank",
    }
)

SIGNATURES: tuple[Signature, ...] = (
    # RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting
    # 3000ms for recv operation to complete
    Signature(
        kind="gloo_timeout",
        recipe="D19",
        literal="Timed out waiting",
        role="timeout",
        regex=_re(
            r"(?:\[(?P<where>[^\]]*?gloo[^\]]*)\] )?Timed out waiting (?P<timeout_ms>\d+)ms for "
            r"(?P<operation>send|recv) operation to complete"
        ),
        doc="a gloo collective waited out its timeout: the peers are not in the same collective",
    ),
    # RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer
    # [127.0.0.1]:52893. This is typically caused by a remote worker crashing. ...
    Signature(
        kind="gloo_connection_closed",
        recipe="D20",
        literal=" by peer",
        role="peer_exit",
        regex=_re(
            r"(?:\[(?P<where>[^\]]*?pair\.cc:\d+)\] )?(?:Read error .*?)?"
            r"Connection (?P<how>closed|reset) by peer(?: \[(?P<peer_addr>[^\]]+)\]:(?P<peer_port>\d+))?"
        ),
        doc="a peer process went away (crashed or exited) while this rank talked to it",
    ),
    # [rank4]:[E318 07:39:53.79 ProcessGroupNCCL.cpp:616] [Rank 4] Watchdog caught collective
    # operation timeout: WorkNCCL(SeqNum=610, OpType=COALESCED, NumelIn=56320, NumelOut=450560,
    # Timeout(ms)=600000) ran for 600086 milliseconds before timing out.
    Signature(
        kind="nccl_watchdog_timeout",
        recipe="D19",
        literal="Watchdog caught collective operation timeout",
        role="timeout",
        regex=_re(
            r"(?:\[(?:PG (?:ID )?(?P<pg>\d+)[^\]]*? )?Rank (?P<reporting_rank>\d+)\] +)?"
            r"Watchdog caught collective operation timeout: "
            r"WorkNCCL\((?:SeqNum=(?P<seq>\d+), )?OpType=(?P<op_type>\w+)"
            r"(?:, NumelIn=(?P<numel_in>\d+), NumelOut=(?P<numel_out>\d+))?"
            r"(?:, TensorShape=(?P<shape>\[[^\]]*\]))?, Timeout\(ms\)=(?P<timeout_ms>\d+)\)"
            r"(?: ran for (?P<ran_for_ms>\d+) milliseconds)?"
        ),
        doc="an NCCL collective ran past its timeout and the watchdog caught it",
    ),
    # [rank0]:[E1127 06:40:01.1 ProcessGroupNCCL.cpp:2057] [PG ID 0 PG GUID 0(default_pg) Rank 0]
    # failure detected by watchdog at work sequence id: 6 PG status: last enqueued work: 6, last
    # completed work: 5
    # [PG ID 2 PG GUID 9 Rank 4] Exception (either an error or timeout) detected by watchdog at
    # work: 610, last enqueued NCCL work: 616, last completed NCCL work: 609.
    Signature(
        kind="nccl_watchdog_failure",
        recipe="D19",
        literal="detected by watchdog at work",
        role="abort",
        regex=_re(
            r"(?:\[(?:PG (?:ID )?(?P<pg>\d+)[^\]]*? )?Rank (?P<reporting_rank>\d+)\] +)?"
            r"(?:failure|Exception \(either an error or timeout\)) detected by watchdog at work"
            r"(?: sequence id)?: (?P<seq>\d+)"
            r"(?:,? (?:PG status: )?last enqueued (?:NCCL )?work: (?P<last_enqueued>-?\d+), "
            r"last completed (?:NCCL )?work: (?P<last_completed>-?\d+))?"
        ),
        doc="NCCL's watchdog found the collective at this sequence number failed or timed out "
        "(the lines around it say which)",
    ),
    # RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running collective:
    # CollectiveFingerPrint(SequenceNumber=1, OpType=ALLGATHER, ...), but Rank 1 is running
    # collective: CollectiveFingerPrint(SequenceNumber=1, OpType=ALLREDUCE, ...).Collectives
    # differ in the following aspects: \t Op type: ALLGATHERvs ALLREDUCE
    Signature(
        kind="collective_mismatch",
        recipe="D19",
        literal="Detected mismatch between collectives",
        role="report",
        regex=_re(r"Detected mismatch between collectives on ranks\."),
        parser="fingerprints",
        doc="TORCH_DISTRIBUTED_DEBUG=DETAIL found ranks calling different collectives",
    ),
    # terminate called after throwing an instance of 'gloo::EnforceNotMet'
    #   what():  [enforce fail at ../gloo/transport/tcp/pair.cc:456] op.preamble.length <=
    #   op.nbytes. 10 vs 8. Received data size doesn't match expected size. Is there a
    #   distributed collective mismatch in your code?
    # (gloo's background thread: a peer sent more bytes than this rank's call expects)
    Signature(
        kind="gloo_size_mismatch",
        recipe="D19",
        literal="Received data size doesn't match expected size",
        role="mismatch",
        regex=_re(
            r"(?:op\.preamble\.length <= op\.nbytes\. (?P<got_bytes>\d+) vs "
            r"(?P<expected_bytes>\d+)\. )?Received data size doesn't match expected size"
        ),
        doc="gloo received more bytes from a peer than this rank's collective expects: the ranks "
        "passed different sizes (or ops) to the same collective",
    ),
    # terminate called after throwing an instance of 'gloo::EnforceNotMet'
    # terminate called after throwing an instance of 'c10::DistBackendError'
    Signature(
        kind="cpp_abort",
        recipe="D20",
        literal="terminate called after throwing",
        role="abort",
        regex=_re(r"terminate called after throwing an instance of '(?P<exception>[^']+)'"),
        follow=2,
        more=(_re(r"what\(\):\s+(?P<what>\S.*)"),),
        doc="a C++ exception escaped a thread of torch or its backend and aborted the process "
        "(SIGABRT)",
    ),
    # [rank1]:[E1010 06:10:06 ProcessGroupNCCL.cpp:758] [Rank 1] To avoid data inconsistency, we
    # are taking the entire process down.
    Signature(
        kind="nccl_async_abort",
        recipe="D19",
        literal="taking the entire process down",
        role="abort",
        regex=_re(
            r"(?:\[Rank (?P<reporting_rank>\d+)\] )?(?:Some NCCL operations have failed or timed "
            r"out\..*?)?To avoid (?:data|this) inconsistency, we are taking the entire process down"
        ),
        doc="NCCL's watchdog found a failed or timed-out collective and ends the process "
        "(TORCH_NCCL_ASYNC_ERROR_HANDLING)",
    ),
    # [E ProcessGroupNCCL.cpp:852] [Rank 16] NCCL watchdog thread terminated with exception: NCCL
    # error: remote process exited or there was a network error, NCCL version 2.19.3
    # ncclRemoteError: A call failed possibly due to a network error or a remote process exiting
    # prematurely.
    Signature(
        kind="nccl_remote_error",
        recipe="D20",
        literal="remote process exit",
        role="peer_exit",
        regex=_re(
            r"remote process exited or there was a network error|A call failed possibly due to a "
            r"network error or a remote process exiting prematurely"
        ),
        doc="NCCL lost a peer: another rank's process ended (or the network between them failed)",
    ),
    # DistBackendError: NCCL communicator was aborted on rank 1.
    Signature(
        kind="nccl_comm_aborted",
        recipe="D19",
        literal="NCCL communicator was aborted",
        role="abort",
        regex=_re(r"NCCL communicator was aborted on rank (?P<comm_rank>\d+)"),
        doc="the rank's NCCL communicator was aborted (by its watchdog, after an error or timeout)",
    ),
    # [rank6]:[E703 21:51:54.11 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID 0(default_pg) Rank 6]
    # Received a dump signal due to a collective timeout from  rank 7 and we will try our best to
    # dump the debug info. Last enqueued NCCL work: 56116, last completed NCCL work: 56116.
    Signature(
        kind="nccl_dump_signal",
        recipe="D19",
        literal="Received a dump signal due to a collective timeout",
        role="timeout",
        regex=_re(
            r"Received a dump signal due to a collective timeout from\s+(?:rank\s+(?P<from_rank>\d+)"
            r"|this local rank)"
            r"(?:.*?Last enqueued NCCL work: (?P<last_enqueued>-?\d+), last completed NCCL work: "
            r"(?P<last_completed>-?\d+))?"
        ),
        doc="a rank's watchdog timed out and asked every rank to dump its flight recorder",
    ),
    # RuntimeError: [Rank 0]: Rank 1 failed to pass monitoredBarrier in 2000 ms
    # RuntimeError: [Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 2000 ms
    Signature(
        kind="monitored_barrier",
        recipe="D20",
        literal="failed to pass monitoredBarrier",
        role="report",
        regex=_re(
            r"(?:\[Rank (?P<reporting_rank>\d+)\]: )?Ranks? (?P<failed_ranks>\d+(?:, \d+)*) "
            r"failed to pass monitoredBarrier in (?P<timeout_ms>\d+) ms"
        ),
        doc="monitored_barrier names the ranks that did not arrive in time",
    ),
    # RuntimeError: DDP expects same model across all ranks, but Rank 2 has 6 params, while rank
    # 0 has inconsistent 4 params.
    Signature(
        kind="ddp_model_mismatch",
        recipe="D19",
        literal="DDP expects same model across all ranks",
        role="report",
        regex=_re(
            r"DDP expects same model across all ranks, but Rank (?P<rank_a>\d+) has "
            r"(?P<count_a>\d+) params, while rank (?P<rank_b>\d+) has inconsistent "
            r"(?P<count_b>\d+) params"
        ),
        doc="DDP's constructor found ranks whose models have different numbers of parameters",
    ),
    # RuntimeError: [1]: params[0] in this process with sizes [4, 4] appears not to match sizes
    # of the same param in process 0.
    Signature(
        kind="ddp_param_shape_mismatch",
        recipe="D19",
        literal="appears not to match",
        role="report",
        regex=_re(
            r"params\[(?P<param>\d+)\] in this process with (?:sizes|strides) (?P<sizes>\[[^\]]*\]) "
            r"appears not to match (?:sizes|strides) of the same param in process (?P<rank_b>\d+)"
        ),
        doc="DDP's constructor found a parameter whose shape differs from rank 0's",
    ),
    # RuntimeError: Expected to have finished reduction in the prior iteration before starting a
    # new one. ... (a few lines later) Parameter indices which did not receive grad for rank 1: 4 5
    Signature(
        kind="ddp_unused_parameters",
        recipe="D8",
        literal="Expected to have finished reduction",
        role="own",
        regex=_re(r"Expected to have finished reduction in the prior iteration"),
        follow=8,
        more=(
            _re(
                r"Parameter indices which did not receive grad for rank (?P<grad_rank>\d+): "
                r"(?P<parameter_indices>\d+(?: \d+)*)"
            ),
            _re(r"Parameters which did not receive grad for rank \d+: (?P<parameter_names>\S.*)"),
        ),
        doc="DDP waited for gradients of parameters that the forward pass never used",
    ),
    # torch.distributed.elastic.multiprocessing.errors.ChildFailedError: (then the summary block:
    # Root Cause (first observed failure): [0]: time : ... rank : 0 (local_rank: 0) exitcode : 1)
    Signature(
        kind="torchrun_child_failed",
        recipe="D20",
        literal="ChildFailedError",
        role="report",
        regex=_re(r"\bChildFailedError:"),
        follow=400,
        parser="child_failed",
        doc="torchrun's summary of the workers that failed, with the first one (root cause)",
    ),
    # ValueError: Error initializing torch.distributed using env:// rendezvous: environment
    # variable RANK expected, but not set
    Signature(
        kind="env_missing",
        recipe="D1",
        literal="expected, but not set",
        role="launch",
        regex=_re(r"[Ee]nvironment variable (?P<variable>\w+) expected, but not set"),
        doc="the process was started without the launcher's RANK/WORLD_SIZE/MASTER_* contract",
    ),
    # torch.distributed.DistNetworkError: The server socket has failed to listen on any local
    # network address. port: 45919, useIpv6: false, code: -98, name: EADDRINUSE, message: address
    # already in use
    Signature(
        kind="address_in_use",
        recipe="D4",
        literal="lready in use",
        role="launch",
        regex=_re(r"(?:port: (?P<port>\d+).*?)?[Aa]ddress already in use"),
        doc="the rendezvous port is taken, usually by another job on the same host",
    ),
    # torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError
    # (a torchrun agent whose rendezvous round did not fill within join_timeout; the exception
    # has no message, and the traceback line "raise RendezvousTimeoutError" is left out)
    Signature(
        kind="rendezvous_timeout",
        recipe="D2",
        literal="RendezvousTimeoutError",
        role="launch",
        regex=_re(r"^\s*(?:[\w.]+\.)?RendezvousTimeoutError\b:?\s*(?P<detail>.*)$"),
        doc="torchrun's agents waited out the join timeout for nodes that never joined",
    ),
    # ValueError: Hostfile contains a bad entry: localhost:2, unable to proceed with launching
    # (DeepSpeed's launcher, before it starts any process; the traceback above it quotes the
    # raising source line, "raise ValueError(f\"Hostfile ...", which the ": " leaves out)
    Signature(
        kind="deepspeed_hostfile",
        recipe="D6",
        literal="ValueError: Hostfile",
        role="launch",
        regex=_re(
            r"ValueError: Hostfile (?P<problem>contains a bad entry: (?P<entry>.*?), unable to "
            r"proceed with launching|contains multiple entries for (?P<host>\S+), unable to "
            r"proceed with launching|is empty or not formatted correctly.*)"
        ),
        doc="DeepSpeed's launcher refused its hostfile (each line must read '<host> slots=<n>')",
    ),
    # torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total
    # capacity of 79.15 GiB of which 10.81 MiB is free. ...
    Signature(
        kind="cuda_oom",
        recipe="D20",
        literal="CUDA out of memory",
        role="own",
        regex=_re(
            r"CUDA out of memory\.(?: Tried to allocate (?P<requested>[\d.]+ \w+)\.)?"
            r"(?: GPU (?P<device>\d+) has a total capacity of (?P<capacity>[\d.]+ \w+) of which "
            r"(?P<free>[\d.]+ \w+) is free)?"
        ),
        doc="one rank ran out of GPU memory; the others will wait for it",
    ),
    # torch.AcceleratorError: CUDA error: invalid device ordinal
    Signature(
        kind="invalid_device_ordinal",
        recipe="D3",
        literal="invalid device ordinal",
        role="launch",
        regex=_re(r"(?:CUDA|HIP) error: invalid device ordinal"),
        doc="a process asked for a GPU index the node does not have (RANK used for LOCAL_RANK)",
    ),
    # torch.distributed.DistBackendError: NCCL error in: .../ProcessGroupNCCL.cpp:..., invalid
    # usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9 ... Last error:
    # Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000
    Signature(
        kind="nccl_duplicate_gpu",
        recipe="D3",
        literal="Duplicate GPU detected",
        role="launch",
        regex=_re(
            r"Duplicate GPU detected : rank (?P<first_rank>\d+) and rank (?P<second_rank>\d+) "
            r"both on CUDA device (?P<bus_id>\w+)"
        ),
        doc="two ranks of a node use the same GPU: more ranks on the node than GPUs, or a "
        "set_device that maps two ranks to one device",
    ),
    # torch.AcceleratorError: CUDA error: an illegal memory access was encountered
    # [E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 1] Process group watchdog thread terminated with
    # exception: CUDA error: an illegal memory access was encountered
    Signature(
        kind="cuda_error",
        recipe="D20",
        literal="CUDA error: ",
        role="own",
        regex=_re(r"CUDA error: (?!invalid device ordinal|out of memory)(?P<what>[^.\n]+[^.\s])"),
        doc="a CUDA error in the rank's own work (an illegal memory access, a device-side "
        "assert): it fails, and the others wait for it",
    ),
    # [2026-01-02 10:11:12] gpu-a017:41281:41290 [3] transport/net.cc:1143 NCCL WARN Socket recv
    # failed while polling for opId=0x7fb582222f90
    Signature(
        kind="nccl_warn",
        recipe="D19",
        literal="NCCL WARN",
        role="warning",
        regex=_re(
            r"(?:(?P<file>[\w/.\-]+):(?P<line>\d+) (?:\([^)]*\) )?)?NCCL WARN (?P<warning>.*)"
        ),
        doc="NCCL reported a problem (network, topology, a peer)",
    ),
    # --- known errors: texts that name a recipe's mistake (title, values and fix) ---------------
    # AssertionError: Check batch related parameters. train_batch_size is not equal to
    # micro_batch_per_gpu * gradient_acc_step * world_size 32 != 4 * 1 * 2
    # (deepspeed 0.19.8, runtime/config.py _batch_assertion)
    Signature(
        kind="deepspeed_batch_size",
        recipe="D17",
        literal="train_batch_size is not equal to",
        role="own",
        regex=_re(
            r"train_batch_size is not equal to micro_batch_per_gpu \* gradient_acc_step \* "
            r"world_size\s*(?P<train_batch>\d+) != (?P<micro_batch>\d+) \* (?P<grad_acc>\d+) \* "
            r"(?P<world_size>\d+)"
        ),
        doc="DeepSpeed's batch knobs do not multiply out on this world size",
        title="a DeepSpeed batch config written for another world size",
        values="train_batch_size {train_batch} != micro {micro_batch} * accumulation {grad_acc} "
        "* world {world_size}",
        fix="DeepSpeed needs train_batch_size = train_micro_batch_size_per_gpu x "
        "gradient_accumulation_steps x world size, and the world size here is {world_size}. State "
        "the global batch ({train_batch}) and the micro-batch ({micro_batch}) and leave "
        "gradient_accumulation_steps out: DeepSpeed derives it from the world size, once the "
        "global batch splits evenly into micro-batches on every rank.",
    ),
    # AssertionError: You are using an untested ZeRO Optimizer. Please add
    # <"zero_allow_untested_optimizer": true> in the configuration file to use it.
    # (deepspeed 0.19.8, runtime/engine.py _do_optimizer_sanity_check)
    Signature(
        kind="deepspeed_untested_optimizer",
        recipe="D17",
        literal="untested ZeRO Optimizer",
        role="own",
        regex=_re(r"You are using an untested ZeRO Optimizer"),
        doc="ZeRO was given an optimizer DeepSpeed does not know, and the config does not allow it",
        title="ZeRO given an optimizer the config does not allow",
        fix='Add "zero_allow_untested_optimizer": true to the DeepSpeed config to run ZeRO with '
        'your own optimizer, or let DeepSpeed build one from the config\'s "optimizer" section.',
    ),
    # NotImplementedError: ZeRO stage 4 not implemented
    # (deepspeed 0.19.8, runtime/engine.py _configure_zero_optimizer)
    Signature(
        kind="deepspeed_zero_stage",
        recipe="D16",
        literal="not implemented",
        role="own",
        regex=_re(r"ZeRO stage (?P<stage>-?\d+) not implemented"),
        doc="the config asks for a ZeRO stage that DeepSpeed does not have",
        title="a ZeRO stage that does not exist",
        values="stage {stage}",
        fix="zero_optimization.stage is 1 (optimizer state partitioned), 2 (and gradients) or 3 "
        "(and parameters), not {stage}: choose the smallest stage that fits, by measuring what "
        "a rank holds.",
    ),
    # AssertionError: zero stage 2 requires an optimizer
    # (deepspeed 0.19.8, runtime/engine.py _configure_zero_optimizer)
    Signature(
        kind="deepspeed_zero_no_optimizer",
        recipe="D16",
        literal="requires an optimizer",
        role="own",
        regex=_re(r"zero stage (?P<stage>\d+) requires an optimizer"),
        doc="ZeRO stage 1 or 2 partitions an optimizer's state, and none was given",
        title="ZeRO stage 1 or 2 without an optimizer",
        values="stage {stage}",
        fix="ZeRO stage {stage} partitions the optimizer's state: pass optimizer= to "
        'deepspeed.initialize or give the config an "optimizer" section; a model that is only '
        "run forward needs stage 3 (parameters) or none.",
    ),
    # RuntimeError: Loss scaling is required for this configuration, but backward() was called
    # directly without scaling the loss. Please use one of the following: 1. engine.backward(loss)
    # RuntimeError: Direct calls to tensor.backward() are not supported in this configuration.
    # (deepspeed 0.19.8, runtime/engine.py _backward_prologue and _backward_epilogue)
    Signature(
        kind="deepspeed_direct_backward",
        recipe="D18",
        literal="backward()",
        role="own",
        regex=_re(
            r"Loss scaling is required for this configuration, but backward\(\) was called "
            r"directly|Direct calls to tensor\.backward\(\) are not supported"
        ),
        doc="loss.backward() was called under a DeepSpeed engine that must do it itself",
        title="loss.backward() under a DeepSpeed engine",
        fix="Call engine.backward(loss) and engine.step() on every micro-batch, never "
        "loss.backward() and optimizer.step(): the engine scales the loss, reduces the "
        "gradients and steps its ZeRO optimizer; set the gradient accumulation once, in the "
        "config.",
    ),
    # ValueError: Please correct the following DeepSpeed config values that mismatch kwargs
    # values:
    # - ds gradient_accumulation_steps=4 vs arg gradient_accumulation_steps=1
    # The easiest method is to set these DeepSpeed config values to 'auto'.
    # (accelerate 1.15.0, utils/dataclasses.py; the HF Trainer says "TrainingArguments values")
    Signature(
        kind="deepspeed_config_mismatch",
        recipe="D18",
        literal="DeepSpeed config values that mismatch",
        role="own",
        regex=_re(r"DeepSpeed config values that mismatch (?P<other>\w+)"),
        follow=4,
        more=(
            _re(
                r"- ds (?P<ds_key>[\w.]+)=(?P<ds_value>\S+) vs (?:hf|arg) [\w.]+="
                r"(?P<arg_value>\S+)"
            ),
        ),
        doc="a DeepSpeed knob is set in the config and, to another value, in the arguments",
        title="a DeepSpeed knob set in two places",
        values="{ds_key} = {ds_value} in the config, {arg_value} in the {other}",
        fix='Set {ds_key} in one place: "auto" in the DeepSpeed config lets Accelerate or the '
        "Trainer fill it from their own arguments (two values that differ would multiply the "
        "gradient accumulation).",
    ),
    # ValueError: `gradient_accumulation_steps` not found in kwargs. Please specify
    # `gradient_accumulation_steps` without `auto` (set to correct value) in the DeepSpeed config
    # file or pass it in kwargs. (accelerate 1.15.0, utils/dataclasses.py fill_match)
    Signature(
        kind="deepspeed_auto_unfilled",
        recipe="D18",
        literal="without `auto`",
        role="own",
        regex=_re(
            r"`(?P<key>[\w.]{1,200})` not found in kwargs\. Please specify `[\w.]+` without `auto`"
        ),
        doc='a DeepSpeed config value is "auto" and nothing fills it',
        title='an "auto" DeepSpeed value that nothing fills',
        values="{key}",
        fix='"auto" is filled by Accelerate or the Trainer from their own arguments, and none '
        "gave {key}: write its value in the DeepSpeed config, or pass it to them.",
    ),
    # AssertionError: FSDP expects uniform original parameter dtype but got {torch.bfloat16,
    # torch.float32}  (also "... uniform reduce dtype ...", "FSDP reduce-scatter expects uniform
    # gradient dtype ..."; torch 2.13.0 fully_shard)
    # ValueError: Must flatten tensors with uniform dtype but got torch.float32 and
    # torch.bfloat16  (torch 2.13.0, FSDP1's FlatParameter)
    Signature(
        kind="fsdp_mixed_dtype",
        recipe="D14",
        literal="uniform",
        role="own",
        regex=_re(
            r"(?:FSDP (?:reduce-scatter )?expects|Must flatten tensors with) uniform "
            r"(?:(?:original parameter|reduce|gradient) )?dtype but got "
            r"(?P<dtypes>\{[^}]*\}|\S+ and \S+)"
        ),
        doc="an FSDP unit holds parameters (or gradients) of more than one dtype",
        title="an FSDP unit with parameters of more than one dtype",
        values="dtypes {dtypes}",
        fix="Keep every parameter of an FSDP unit in one dtype (build the model in fp32; no "
        ".to(torch.bfloat16) or .half() on some layers) and get bf16 compute from the policy: "
        "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) for "
        "fully_shard, MixedPrecision(...) for FSDP1; a part meant to stay in another dtype is "
        "its own unit.",
    ),
    # ValueError: fully_shard does not support containers that do not implement forward:
    # ModuleList(  (torch 2.13.0, fsdp/_fully_shard/_fsdp_init.py)
    Signature(
        kind="fsdp_container",
        recipe="D12",
        literal="does not support containers",
        role="own",
        regex=_re(
            r"(?P<api>fully_shard|replicate) does not support containers that do not implement forward: "
            r"(?P<container>\w+)"
        ),
        doc="FSDP was applied to a ModuleList or ModuleDict, which has no forward",
        title="FSDP applied to a container without a forward",
        values="{api}({container})",
        fix="{api} wraps modules that run a forward: apply it to each block inside the "
        "{container} (for block in model.layers: fully_shard(block)), then to the module that "
        "calls them, the root.",
    ),
    # ValueError: Expected device_mesh to have ndim=2 but got 1  (torch 2.13.0, FSDP1 with
    # HYBRID_SHARD)
    Signature(
        kind="fsdp_hybrid_mesh",
        recipe="D13",
        literal="Expected device_mesh to have ndim=2",
        role="own",
        regex=_re(r"Expected device_mesh to have ndim=2 but got (?P<ndim>\d+)"),
        doc="HYBRID_SHARD was given a device mesh without a replicate dimension",
        title="HYBRID_SHARD on a one-dimensional mesh",
        values="mesh ndim {ndim}",
        fix="HYBRID_SHARD replicates across nodes and shards within one, so its device mesh has "
        "two dimensions: init_device_mesh(device, (nodes, ranks_per_node)); on one node use "
        "FULL_SHARD (or SHARD_GRAD_OP where memory allows).",
    ),
    # ValueError: fully_shard expects a 1D or 2D DeviceMesh but got DeviceMesh('cpu', [[[0]]])
    # (torch 2.13.0, fsdp/_fully_shard/_fsdp_init.py)
    Signature(
        kind="fsdp_mesh_dims",
        recipe="D13",
        literal="expects a 1D or 2D DeviceMesh",
        role="own",
        regex=_re(
            r"(?P<api>fully_shard|replicate) expects a 1D or 2D DeviceMesh but got (?P<mesh>.{1,300})"
        ),
        doc="fully_shard was given a device mesh of more than two dimensions",
        title="fully_shard on a mesh of more than two dimensions",
        values="{mesh}",
        fix="{api} takes a 1-D mesh (FULL_SHARD or SHARD_GRAD_OP, by reshard_after_forward) or "
        "a 2-D one (replicate, shard: HYBRID_SHARD); pass the data-parallel slice of a larger "
        'mesh, such as mesh["dp"].',
    ),
    # ValueError: SyncBatchNorm expected input tensor to be on GPU or XPU or privateuseone
    # (torch 2.13.0, nn/modules/batchnorm.py)
    Signature(
        kind="syncbn_device",
        recipe="D10",
        literal="SyncBatchNorm expected input tensor to be on",
        role="own",
        regex=_re(r"SyncBatchNorm expected input tensor to be on (?P<devices>[^.\n]*\w)"),
        doc="SyncBatchNorm ran on a device it does not support (the CPU)",
        title="SyncBatchNorm on the CPU",
        values="{devices}",
        fix="SyncBatchNorm runs on {devices} only: move the model there before the first "
        "forward (convert_sync_batchnorm, .to(device), then DDP); on CPU keep BatchNorm and "
        "all-reduce its running_mean and running_var after each step.",
    ),
    # ValueError: Expected more than 1 value per channel when training, got input size
    # torch.Size([1, 4])  (torch 2.13.0, nn/functional.py batch_norm)
    Signature(
        kind="batchnorm_one_sample",
        recipe="D10",
        literal="Expected more than 1 value per channel",
        role="own",
        regex=_re(
            r"Expected more than 1 value per channel when training, got input size "
            r"(?P<size>torch\.Size\(\[[^\]]*\]\)|\S+)"
        ),
        doc="BatchNorm got a batch of one sample on this rank",
        title="BatchNorm on a per-rank batch of one sample",
        values="input size {size}",
        fix="Each rank's batch is the global batch split over the ranks, and the last batch of a "
        "shard can hold one sample: drop_last=True on the sampler and the DataLoader, a larger "
        "batch per rank, or SyncBatchNorm (GPUs) so that the statistics span the ranks.",
    ),
    # RuntimeError: Error(s) in loading state_dict for Sequential:
    # 	While copying the parameter named "0.weight", whose dimensions in the model are
    # torch.Size([40, 16]) and whose dimensions in the checkpoint are torch.Size([40, 16]), an
    # exception occurred : ('aten.copy_.default got mixed torch.Tensor and DTensor, need to
    # convert all torch.Tensor to DTensor before calling distributed operators!',).
    # (torch 2.13.0: load_state_dict of a sharded state dict into a plain model, or back)
    Signature(
        kind="state_dict_dtensor_mix",
        recipe="D15",
        literal="got mixed torch.Tensor and DTensor",
        role="own",
        regex=_re(
            r'While copying the parameter named "(?P<name>[^"]{1,300})", whose dimensions in the '
            r"model are torch\.Size\(\[[\d, ]{0,80}\]\) and whose dimensions in the checkpoint "
            r"are torch\.Size\(\[[\d, ]{0,80}\]\), an exception occurred : \(?'?"
            r"(?P<op>[\w.]{1,80}):? got mixed torch\.Tensor and DTensor"
        ),
        doc="a state dict of sharded DTensors was loaded into a model of plain tensors, or back",
        title="a state dict saved in one layout loaded into another",
        values='parameter "{name}": DTensor shards and plain tensors',
        fix="Save and load a sharded model with torch.distributed.checkpoint (dcp.save and "
        "dcp.load of get_model_state_dict, then set_model_state_dict): it reshards to any world "
        "size. For one portable file, get_model_state_dict(model, options=StateDictOptions("
        "full_state_dict=True, cpu_offload=True)) on every rank, saved by rank 0.",
    ),
    # --- known errors of the scenarios' own checks (rankscope.scenarios) -------------------------
    # These mistakes raise nothing on a CPU (a memory plan exceeded, a drift, a wrong split): the
    # scenario scripts measure them and end with these texts, so that the guided notebooks' cards
    # name the recipe as a library's text would. A script of the user's prints none of them.
    # RuntimeError: rank 1 (local rank 0) reads the same 32 samples as rank 0: the data was split
    # by a per-node index  (d03_rank_vs_local_rank.py)
    Signature(
        kind="check_split_by_local_rank",
        recipe="D3",
        literal="the data was split by a per-node index",
        role="own",
        regex=_re(
            r"rank (?P<check_rank>\d+) \(local rank (?P<local>\d+)\) reads the same "
            r"(?P<samples>\d+) samples as rank (?P<other>\d+): the data was split by a per-node"
        ),
        doc="the scenario's check: two ranks read the same samples (sharded by LOCAL_RANK)",
        title="the data sharded by LOCAL_RANK",
        values="rank {check_rank} (local rank {local}) reads the {samples} samples of rank {other}",
        fix="Shard the data by the global rank (DistributedSampler(rank=dist.get_rank())): "
        "LOCAL_RANK starts again at 0 on every node; keep it for what belongs to one machine "
        "(torch.cuda.set_device(LOCAL_RANK)).",
    ),
    # SystemExit: rank 1: BatchNorm running mean reflects one shard, not the dataset
    # (d10_batchnorm_buffers.py)
    Signature(
        kind="check_batchnorm_one_shard",
        recipe="D10",
        literal="running mean reflects one shard",
        role="own",
        regex=_re(r"BatchNorm running mean reflects one shard"),
        doc="the scenario's check: BatchNorm's running statistics are those of one rank's shard",
        title="BatchNorm statistics of one rank's shard",
        fix="DDP averages gradients, not buffers: nn.SyncBatchNorm.convert_sync_batchnorm(model) "
        "before DDP on GPUs; on CPU all-reduce running_mean and running_var after each step.",
    ),
    # SystemExit: rank 0: after 1024 samples the model is 3.1x further from the solution than the
    # single-process run: the learning rate was not scaled  (d11_effective_batch.py)
    Signature(
        kind="check_lr_not_scaled",
        recipe="D11",
        literal="the learning rate was not scaled",
        role="own",
        regex=_re(
            r"after (?P<samples>\d+) samples the model is (?P<ratio>[\d.]+)x further from the "
            r"solution than the single-process run"
        ),
        doc="the scenario's check: the effective batch grew with the ranks and the learning "
        "rate did not",
        title="the effective batch multiplied by the ranks, the learning rate not",
        values="{ratio}x further from the solution after {samples} samples",
        fix="The effective batch is the per-rank batch x the world size: scale the learning rate "
        "with it (linear scaling, with warm-up) and record the effective batch with the run.",
    ),
    # SystemExit: rank 0: 7.0 MiB of parameters gathered at once, over the 2.0 MiB planned: the
    # whole model is one FSDP unit  (d12_wrapping_policy.py)
    Signature(
        kind="check_fsdp_one_unit",
        recipe="D12",
        literal="the whole model is one FSDP unit",
        role="own",
        regex=_re(
            r"(?P<gathered>[\d.]{1,20} [KMGT]iB) of parameters gathered at once, over the "
            r"(?P<planned>[\d.]+ [KMGT]iB) planned: the whole model is one FSDP unit"
        ),
        doc="the scenario's check: fully_shard on the root alone gathers the whole model",
        title="the whole model one FSDP unit",
        values="{gathered} gathered at once, {planned} planned",
        fix="fully_shard every block (a transformer layer), then the root: one block is gathered "
        "at a time (transformer_auto_wrap_policy for FSDP1).",
    ),
    # SystemExit: rank 0: 7.0 MiB of parameters gathered at once, over the 2.0 MiB planned:
    # SHARD_GRAD_OP keeps every block gathered until backward  (d13_sharding_strategy.py)
    Signature(
        kind="check_fsdp_kept_gathered",
        recipe="D13",
        literal="keeps every block gathered until backward",
        role="own",
        regex=_re(
            r"(?P<gathered>[\d.]{1,20} [KMGT]iB) of parameters gathered at once, over the "
            r"(?P<planned>[\d.]+ [KMGT]iB) planned: (?P<strategy>\w+) keeps every block"
        ),
        doc="the scenario's check: a sharding strategy that keeps parameters gathered went over "
        "the memory plan",
        title="a sharding strategy that keeps the blocks gathered",
        values="{strategy}: {gathered} gathered at once, {planned} planned",
        fix="{strategy} keeps each block gathered from its forward to its backward: where memory "
        "binds use FULL_SHARD (reshard_after_forward=True); on several nodes HYBRID_SHARD "
        "shards within a node and replicates across nodes.",
    ),
    # SystemExit: rank 0: 0.weight ends 12.5% of its own training away from the fp32 reference
    # (tolerance 5%): the sharded weights are bf16  (d14_mixed_precision.py)
    Signature(
        kind="check_fsdp_bf16_weights",
        recipe="D14",
        literal="the sharded weights are bf16",
        role="own",
        regex=_re(
            r"rank \d+: (?P<tensor>\S{1,200}) ends (?P<drift>[\d.]{1,20}%) of its own training away from the fp32 "
            r"reference \(tolerance (?P<tolerance>[\d.]+%)\)"
        ),
        doc="the scenario's check: a model cast to bf16 before fully_shard drifted from fp32",
        title="bf16 master weights under FSDP",
        values="{tensor} {drift} from fp32, tolerance {tolerance}",
        fix="Keep the model fp32 and pass MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
        "reduce_dtype=torch.float32) to every fully_shard: bf16 compute, fp32 master weights "
        "and reductions.",
    ),
    # SystemExit: rank 0: ZeRO stage 1 left 8.0 MiB of parameters on this rank, the whole model;
    # the plan needs at most 4.0 MiB (1/world): only stage 3 partitions the parameters
    # (d16_zero_stages.py)
    Signature(
        kind="check_zero_stage_parameters",
        recipe="D16",
        literal="only stage 3 partitions the parameters",
        role="own",
        regex=_re(
            r"ZeRO stage (?P<stage>\d+) left (?P<held>[\d.]+ [KMGT]iB) of parameters on this "
            r"rank, the whole model; the plan needs at most (?P<share>[\d.]+ [KMGT]iB)"
        ),
        doc="the scenario's check: a ZeRO stage below 3 kept every parameter on every rank",
        title="a ZeRO stage that does not partition the parameters",
        values="stage {stage} left {held} of parameters per rank, {share} planned",
        fix="ZeRO stage 1 partitions the optimizer state, 2 the gradients too, 3 the parameters "
        "too: stage 3 where the parameters must be split; choose the smallest stage that fits, "
        "by measuring what a rank holds.",
    ),
    # SystemExit: rank 0: after 8 micro-batches the weights are 0.412 away from the reference;
    # the engine took 0 optimizer steps, 4 intended  (d18_engine_backward.py)
    Signature(
        kind="check_engine_steps",
        recipe="D18",
        literal="optimizer steps,",
        role="own",
        regex=_re(r"the engine took (?P<steps>\d+) optimizer steps, (?P<intended>\d+) intended"),
        doc="the scenario's check: the DeepSpeed engine stepped other than the loop meant",
        title="a training loop that bypasses the DeepSpeed engine",
        values="{steps} optimizer steps, {intended} intended",
        fix="Call engine.backward(loss) and engine.step() on every micro-batch, never "
        "loss.backward() and optimizer.step(), and set the gradient accumulation once, in the "
        "config.",
    ),
)

#: The known errors: the signatures that name a recipe's mistake (those with a fix).
KNOWN: tuple[Signature, ...] = tuple(s for s in SIGNATURES if s.fix)


def victims_words(text: str) -> bool:
    """Whether ``text`` (an exception's message, a log line) is an error whose role makes the
    rank that raised it a victim (:data:`VICTIM_ROLES`: a peer's exit, a timeout, a mismatch
    another rank caused)."""
    return any(
        s.role in VICTIM_ROLES and s.literal in text and s.regex.search(text) is not None
        for s in SIGNATURES
    )
