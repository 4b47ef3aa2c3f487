"""The known error signatures: one entry per signature, data only.

Each entry says what it is (``kind``), a plain substring that every matching line contains
(``literal``, checked first and vectorised, so most lines are never regex-matched), the regex
whose named groups become the parsed ``fields``, how many following lines may hold more fields
(``follow`` and ``more``, for messages that torch spreads over several lines), and the recipe
(D1-D23 of the recipe guide) it points to, and what the text says of the rank that logged it
(``role``, one of :data:`ROLES`). To add a signature, add an entry; the texts quoted in the
comments are real ones.

Named groups ending in ``_ms``, ``_rank``, ``seq`` and the like are converted to ints by
:data:`INT_FIELDS`; ``parser`` names a function in :mod:`rankscope.collect.errors` for the two
texts that a regex cannot take apart (collective fingerprints, torchrun's failure summary).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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

    def __post_init__(self) -> None:
        assert self.role in ROLES, self.role


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
)
