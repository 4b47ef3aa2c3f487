"""What NCCL jobs leave in their logs, read without a GPU: texts written from the documented
formats (torch's ProcessGroupNCCL, NCCL's debug output, torchrun's prefixes; see the reference
notes on artifacts), in a plain folder as a bug report would attach them."""

from __future__ import annotations

from rankscope.analyze import diagnose
from rankscope.collect import load_run

PG = "[PG ID 0 PG GUID 0(default_pg) Rank 1]"
HEAD = "[rank1]:[E1127 06:40:01.792630246 ProcessGroupNCCL.cpp:{}] "
WORK = "WorkNCCL(SeqNum=6, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=10000)"

#: torchrun's console of a 2-rank job whose rank 1 timed out in all_reduce #6: NCCL's INFO lines
#: (NCCL_DEBUG=INFO to stdout), the watchdog's lines, and its C++ stack.
TIMEOUT_LOG = "\n".join(
    [
        *(
            f"[rank{r}]:gpu-a017:4128{r}:4128{r} [{r}] NCCL INFO {text}"
            for r in (0, 1)
            for text in (
                "Bootstrap : Using eth0:10.0.1.9<0>",
                "NET/Plugin : No plugin found (libnccl-net.so), using internal implementation",
                "Channel 00/02 :    0   1",
                f"comm 0x557fe785f7a0 rank {r} nranks 2 cudaDev {r} nvmlDev {r} busId 1a000 "
                "commId 0x5ae77eb5ea4ec1ee - Init COMPLETE",
            )
        ),
        HEAD.format(616) + f"{PG} Watchdog caught collective operation timeout: {WORK} ran for "
        "10086 milliseconds before timing out.",
        HEAD.format(1785) + f"{PG} Exception (either an error or timeout) detected by watchdog "
        "at work: 6, last enqueued NCCL work: 6, last completed NCCL work: 5.",
        HEAD.format(630) + "[Rank 1] Some NCCL operations have failed or timed out. Due to the "
        "asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
        "corrupted/incomplete data.",
        HEAD.format(636) + "[Rank 1] To avoid data inconsistency, we are taking the entire "
        "process down.",
        HEAD.format(1595) + f"{PG} Process group watchdog thread terminated with exception: "
        f"[Rank 1] Watchdog caught collective operation timeout: {WORK} ran for 10086 "
        "milliseconds before timing out.",
        "[rank1]:Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:618 (most recent call first):",
        "[rank1]:frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x98 "
        "(0x7f3c1a2b9446 in /usr/lib/python3/site-packages/torch/lib/libc10.so)",
        "[rank1]:frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::"
        "chrono::duration<long, std::ratio<1l, 1000l> > >) + 0x23d (0x7f3c1b5c2a6d in "
        "/usr/lib/python3/site-packages/torch/lib/libtorch_cuda.so)",
        "[rank1]:frame #2: <unknown function> + 0x145c0 (0x7f3c5d8b35c0 in "
        "/usr/lib/python3/site-packages/torch/lib/libtorch.so)",
        "",
    ]
)


def test_a_log_with_nccl_lines_a_timeout_and_a_cpp_stack_is_read_by_every_reader(tmp_path):
    """Taken for a stack file by its C++ stack, such a log once lost its NCCL lines and its
    timeout; every reader that knows part of it reads it now, and no reader complains."""
    (tmp_path / "train.log").write_text(TIMEOUT_LOG)
    run = load_run(tmp_path)
    assert len(run.nccl) == 8 and set(run.nccl["rank"]) == {0, 1}
    errors = run.errors
    timeouts = errors[errors["kind"] == "nccl_watchdog_timeout"]
    # a timeout reports a victim (and the watchdog's exit repeats it, without the group)
    assert set(timeouts["rank"]) == {1} and set(timeouts["role"]) == {"timeout"}
    assert {f["seq"] for f in timeouts["fields"]} == {6}
    fields = timeouts["fields"].iloc[0]
    assert (fields["pg"], fields["seq"], fields["op_type"], fields["ran_for_ms"]) == (
        "0",
        6,
        "ALLREDUCE",
        10086,
    )
    (found,) = errors.loc[errors["kind"] == "nccl_watchdog_failure", "fields"]
    assert (found["pg"], found["seq"], found["last_enqueued"], found["last_completed"]) == (
        "0",
        6,
        6,
        5,
    )
    assert not any("faulthandler" in str(r) for r in run.problems["reason"]), run.problems
    d = diagnose(run)
    assert d.verdict != "ok" and 1 in d.waiting_ranks + d.culprit_ranks, d.render()


def test_two_ranks_on_one_gpu_is_a_launch_error_with_its_fix(tmp_path):
    """NCCL's duplicate GPU check, as torch raises it in both ranks of a job started by hand
    with a set_device that maps them to one device."""
    for rank, other in ((0, 1), (1, 0)):
        (tmp_path / f"rank{rank}.err").write_text(
            "Traceback (most recent call last):\n"
            '  File "/srv/job/train.py", line 9, in <module>\n'
            "    dist.barrier()\n"
            "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/"
            "c10d/ProcessGroupNCCL.cpp:3699, invalid usage (run with NCCL_DEBUG=WARN for "
            "details), NCCL version 2.28.9\n"
            "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
            "Last error:\n"
            f"Duplicate GPU detected : rank {rank} and rank {other} both on CUDA device 1a000\n"
        )
    run = load_run(tmp_path)
    dup = run.errors[run.errors["kind"] == "nccl_duplicate_gpu"]
    assert sorted(dup["rank"]) == [0, 1] and set(dup["role"]) == {"launch"}
    assert dup["fields"].iloc[0]["bus_id"] == "1a000"
    d = diagnose(run)
    assert (d.verdict, d.cause, d.recipe, d.culprit_ranks) == (
        "launch_error",
        "duplicate_gpu",
        "D3",
        [0, 1],
    ), d.render()
    assert "LOCAL_RANK" in d.fix and "--nproc-per-node" in d.fix


def test_a_cuda_error_is_the_rank_s_own_failure(tmp_path):
    (tmp_path / "rank3.log").write_text(
        "Traceback (most recent call last):\n"
        '  File "/srv/job/train.py", line 21, in <module>\n'
        "    loss.item()\n"
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the "
        "stacktrace below might be incorrect.\n"
    )
    run = load_run(tmp_path)
    (row,) = run.errors[run.errors["kind"] == "cuda_error"].itertuples()
    assert (row.rank, row.role, row.fields["what"]) == (
        3,
        "own",
        "an illegal memory access was encountered",
    )
    # the other CUDA errors keep their own signatures, not this one too
    assert not load_run_of(tmp_path, "torch.AcceleratorError: CUDA error: invalid device ordinal")
    d = diagnose(run)
    assert (d.cause, d.culprit_ranks) == ("rank_crashed", [3]), d.render()


def load_run_of(folder, text: str) -> bool:
    """Whether ``text`` alone, as a rank's log, is read as a cuda_error."""
    other = folder / "other"
    other.mkdir()
    (other / "rank0.log").write_text(text + "\n")
    return bool((load_run(other).errors["kind"] == "cuda_error").any())
