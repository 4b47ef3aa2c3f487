"""The probe's wrapper, in C and in Python, on stand-ins with torch.distributed's signatures.

In this process and without a process group: the Probe is made but not started, so nothing in
torch.distributed is patched. The real jobs in test_launch.py cover the wrappers under torchrun.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import shutil
import struct
import sys
import threading
import weakref
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from rankscope.probe import _core, _twins
from rankscope.rundir import (
    RING_SLOT,
    RING_SLOT_FIELDS,
    RING_SLOT_OFFSETS,
    RankRecord,
    RunDir,
)

from .conftest import close_probes


def all_reduce(tensor, op=None, group=None, async_op=False):
    if isinstance(tensor, torch.Tensor) and tensor.numel() == 0:
        raise RuntimeError('empty "tensor"')


def send(tensor, dst=None, group=None, tag=0):
    return None


def all_gather(tensor_list, tensor, group=None, async_op=False):
    return None


@pytest.fixture(params=["c", "c-getters", "python"])
def probe(request, tmp_path, monkeypatch):
    """The C wrapper as installed (reading tensors with _meta.cpp where it is built), the C
    wrapper asking torch's getters, and the Python wrapper."""
    if request.param != "python" and _core._fast is None:
        pytest.skip("the probe's C extension is not built here (no C compiler at install)")
    if request.param == "c-getters":
        monkeypatch.setattr(_core, "_META", None)
    if request.param == "python":
        monkeypatch.setattr(_core, "_fast", None)
    p = _core.Probe(RunDir(tmp_path / "run"), rank=0)
    yield p
    close_probes(p)


def lines(p: _core.Probe) -> list[dict]:
    """The probe's lines, as written."""
    p.flush()
    return [json.loads(line) for line in p.run.events(p.rank).read_text().splitlines()]


def records(p: _core.Probe) -> list[dict]:
    """The probe's events with each call's enter and exit, its enter with its facts' fields
    (``RunDir.iter_events``)."""
    p.flush()
    return list(p.run.iter_events(p.rank))


def line_of(marker: str) -> int:
    lines = inspect.getsource(sys.modules[__name__]).splitlines()
    return next(i for i, text in enumerate(lines, 1) if marker in text)


def test_records_the_call_its_site_and_its_outcome(probe):
    reduce = probe._wrap("all_reduce", all_reduce, None)
    sender = probe._wrap("send", send, "dst")
    x = torch.ones(2, 3, dtype=torch.float16)
    for _ in range(3):
        reduce(x, async_op=True)  # site: the loop
    sender(torch.zeros(4), 1, tag=7)
    sender(torch.zeros(4), dst="peer")
    with pytest.raises(RuntimeError, match='empty "tensor"'):
        reduce(torch.ones(0))
    assert probe._state.current is None and probe._state.done == 6
    evs = records(probe)
    enters = [e for e in evs if e["ev"] == "enter"]
    exits = [e for e in evs if e["ev"] == "exit"]
    assert [e["op"] for e in enters] == ["all_reduce"] * 3 + ["send"] * 2 + ["all_reduce"]
    first = enters[0]
    assert first["shapes"] == [[2, 3]] and first["dtypes"] == ["float16"]
    assert first["async_op"] is True and first["peer"] is None and first["pg"] is None
    assert first["file"] == __file__ and first["line"] == line_of("# site: the loop")
    assert first["func"] == "test_records_the_call_its_site_and_its_outcome"
    # one group, the default: its collectives and its point-to-point calls are numbered apart
    assert [e["seq"] for e in enters] == [1, 2, 3, 1, 2, 4]
    assert [e["peer"] for e in enters[3:5]] == [1, "peer"]
    assert enters[5]["shapes"] == [[0]] and enters[5]["async_op"] is False
    assert [e["id"] for e in exits] == [e["id"] for e in enters]
    assert [e["ok"] for e in exits] == [True] * 5 + [False]
    assert exits[5]["error"] == 'RuntimeError: empty "tensor"'
    assert all(x["dur_s"] >= 0 and x["t"] >= e["t"] for e, x in zip(enters, exits, strict=True))


def test_a_call_is_one_line_naming_its_facts_and_one_in_flight_at_a_flush_two(probe):
    """A call that returned before the flush: one ``call`` line, its facts by id (their line
    written before it); one in flight at a flush: its enter line then, its exit line at the
    next; one that raised: enter and exit lines, the exit with its error."""
    lines_before = []

    def all_reduce_flushed(tensor, op=None, group=None, async_op=False):
        lines_before.extend(lines(probe))  # a flush while the call is in flight

    reduce = probe._wrap("all_reduce", all_reduce, None)
    held = probe._wrap("all_reduce", all_reduce_flushed, None)
    x = torch.ones(4)
    reduce(x)  # site: first
    held(x)  # site: held
    with pytest.raises(RuntimeError):
        reduce(torch.ones(0))
    evs = lines(probe)
    head = ("id", "seq", "tid", "facts")
    facts = {e["facts"]: e for e in evs if e["ev"] == "facts"}
    assert [(e["ev"], e.get("id")) for e in evs] == [
        ("path", None),
        ("facts", None),
        ("path", None),
        ("facts", None),
        ("call", 1),
        ("enter", 2),
        ("path", None),
        ("facts", None),
        ("exit", 2),
        ("enter", 3),
        ("exit", 3),
    ]
    # the path and facts lines, the call line, the one in flight
    assert lines_before == evs[:6]
    call, flying, _, _, returned, raised, failed = evs[4:]
    assert list(call) == [*head, "dur_s", "ok", "ev", "t", "rank"] and call["ok"] is True
    assert list(flying) == [*head, "ev", "t", "rank"]
    assert facts[call["facts"]]["line"] == line_of("# site: first")
    assert facts[flying["facts"]]["line"] == line_of("# site: held")
    assert facts[call["facts"]]["pg_ranks"] is None and facts[call["facts"]]["shapes"] == [[4]]
    assert returned["ok"] is True and returned["op"] == "all_reduce" and returned["error"] is None
    assert returned["t"] >= flying["t"] and returned["dur_s"] >= 0 and call["dur_s"] >= 0
    assert facts[raised["facts"]]["shapes"] == [[0]] and list(raised) == list(flying)
    assert failed["ok"] is False and failed["error"] == 'RuntimeError: empty "tensor"'


def test_past_facts_kept_the_probe_names_calls_by_new_ids_only(probe, monkeypatch):
    """Once FACTS_KEPT ids are issued since it last forgot them, the probe forgets them, and a
    call site whose facts repeat (kept by the C wrapper from call to call) gets a new id: a
    line never names facts older than the latest 2 * FACTS_KEPT issued."""
    monkeypatch.setattr(_core, "FACTS_KEPT", 3)
    reduce = probe._wrap("all_reduce", all_reduce, None)
    x = torch.ones(1)

    def at_one_site(t):
        reduce(t)  # site: repeats

    at_one_site(x)
    for n in (2, 3, 4, 5):  # new facts elsewhere: ids 2, 3, then forgotten: 4, 5
        reduce(torch.ones(n))
    for _ in range(2):  # the same facts as the first call's, after they were forgotten
        at_one_site(x)
    evs = lines(probe)
    facts = {e["facts"]: e for e in evs if e["ev"] == "facts"}
    calls = [e for e in evs if e["ev"] == "call"]
    assert [e["facts"] for e in calls] == [1, 2, 3, 4, 5, 6, 6]
    assert {k: v for k, v in facts[6].items() if k not in ("facts", "t", "path")} == {
        k: v for k, v in facts[1].items() if k not in ("facts", "t", "path")
    }
    assert facts[6]["line"] == line_of("# site: repeats")
    # the paths were forgotten with the facts: the loop's path has an id issued since
    paths = [e["path"] for e in evs if e["ev"] == "path"]
    assert paths == sorted(set(paths)) and facts[6]["path"] == paths[-1] > facts[5]["path"]


class Work(torch.distributed.Work):
    """A Work as a custom backend makes one (torch's own subclassable class): the backend
    completes it when ``done`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.done = False

    def is_completed(self) -> bool:
        return self.done


def all_reduce_async(tensor, op=None, group=None, async_op=False):
    return Work() if async_op else None


def test_an_async_call_stays_in_flight_until_the_backend_completes_its_work(probe):
    """The wrapper hands the probe thread an async call's Work; its look writes a done event
    only once the Work completes. An async call that returns no Work is done at its first
    look; a blocking call is not followed."""
    reduce = probe._wrap("all_reduce", all_reduce_async, None)
    work = reduce(torch.ones(4), async_op=True)  # site: issued
    reduce(torch.ones(4))
    plain = probe._wrap("all_reduce", all_reduce, None)
    plain(torch.ones(4), async_op=True)  # returns None: nothing to wait for
    # the wrapper only hands the Work to the thread; its look follows it
    assert probe._state.returned == 2 and not probe._works
    probe._look_works()
    assert list(probe._works) == [1] and not probe._state.returned
    assert [e["ids"] for e in records(probe) if e["ev"] == "done"] == [[3]]
    work.done = True
    probe._look_works()
    assert not probe._works
    evs = records(probe)
    done = [e for e in evs if e["ev"] == "done"]
    assert [(e["ids"], e["failed"]) for e in done] == [([3], []), ([1], [])]
    # as written: the async call returned before the flush, one line; its facts say async
    raw = lines(probe)
    facts = {e["facts"]: e for e in raw if e["ev"] == "facts"}
    call = next(e for e in raw if e.get("id") == 1)
    assert call["ev"] == "call" and call["ok"] is True and facts[call["facts"]]["async_op"]
    # the tracker's record (from the lines as written): issued at its line until done, then
    # the last completed
    record = RankRecord(rank=0)
    for e in raw[: raw.index(done[1])]:
        record.apply(e)
    assert list(record.issued) == [1]
    assert record.issued[1][3] == f"test_probe_wrapper.py:{line_of('# site: issued')}"
    assert record.apply(done[1]) is True and not record.issued
    assert record.last_done == "all_reduce (group None #1)"


def test_a_work_waited_on_and_completed_is_let_go_at_its_wait(probe):
    """Work.wait as the probe installs it: the last async call's Work, completed when its wait
    returns (gloo), is let go at once and done at the next look; one that the backend has not
    completed when its wait returns (nccl's, which only makes the stream wait) stays followed;
    a Work of a call the probe did not see is left alone. The hook is ``_fast.c``'s
    ``WaitHook`` where the wrapper is C, its Python twin otherwise; as a method of the class it
    gets its Work as a Python function would."""
    reduce = probe._wrap("all_reduce", all_reduce_async, None)
    waits = []
    hook = _twins.waited_hook if isinstance(probe._state, _twins._State) else _core._fast.WaitHook
    wait = hook(lambda work, *a, **k: waits.append((a, k)), probe._state)
    work = reduce(torch.ones(4), async_op=True)
    work.done = True
    bound = wait.__get__(work, Work)  # work.wait as the class's method
    assert bound(5, timeout=1) is None and waits == [((5,), {"timeout": 1})]
    assert probe._state.returned == 1
    gone = weakref.ref(work)
    del work, bound
    assert gone() is None, "the probe still holds the Work after its wait"
    # a GPU's (here the meta device's): not completed when its wait returns, followed as before
    late = reduce(torch.ones(4, device="meta"), async_op=True)
    wait(late)
    wait(Work())  # not a call of the probe's
    probe._look_works()
    assert list(probe._works) == [2]
    late.done = True
    probe._look_works()
    done = [(e["ids"], e["failed"]) for e in records(probe) if e["ev"] == "done"]
    assert done == [([1], []), ([2], [])]
    # CPU tensors: a wait returns once the collective is done (torch's contract for Work.wait),
    # so the C wrapper, which reads the device with _meta.cpp, counts the call done without
    # asking the backend; the others ask
    cpu = reduce(torch.ones(4), async_op=True)
    wait(cpu)
    probe._look_works()
    read_device = _core._META is not None and not isinstance(probe._state, _twins._State)
    assert list(probe._works) == ([] if read_device else [3])


def test_a_call_site_records_each_calls_own_shape_and_dtype(probe):
    reduce = probe._wrap("all_reduce", all_reduce, None)
    tensors = [torch.ones(1), torch.ones(2), torch.ones(2), torch.ones(2, dtype=torch.int8)]
    tensors += [torch.ones(1, 2), torch.ones(1)]
    for x in tensors:
        reduce(x)  # one site, shapes and dtypes changing now and then
    enters = [e for e in records(probe) if e["ev"] == "enter"]
    assert [e["shapes"] for e in enters] == [[list(x.shape)] for x in tensors]
    assert [e["dtypes"] for e in enters] == [[str(x.dtype)[6:]] for x in tensors]


def test_a_tensor_changed_in_place_is_recorded_as_it_is_at_each_call(probe):
    """One tensor object, one call site: what changes its sizes or dtype in place shows."""
    reduce = probe._wrap("all_reduce", all_reduce, None)
    x = torch.ones(3)
    changes = [  # some change the sizes only, some the dimensions, some the dtype
        lambda: None,
        lambda: x.resize_(2, 3),
        lambda: x.t_(),
        lambda: x.unsqueeze_(0),
        lambda: setattr(x, "data", torch.zeros(4, dtype=torch.float64)),
        lambda: torch.utils.swap_tensors(x, torch.ones(7, dtype=torch.int8)),
        lambda: x.set_(torch.ones(5, dtype=torch.int8)),
        lambda: x.as_strided_((2,), (1,)),
    ]
    seen = []
    for change in changes:
        change()
        for async_op in (False, False, True):  # the last: new facts, the same sizes
            seen.append(([list(x.shape)], [str(x.dtype)[6:]], async_op))
            reduce(x, async_op=async_op)  # one site
    enters = [e for e in records(probe) if e["ev"] == "enter"]
    assert [(e["shapes"], e["dtypes"], e["async_op"]) for e in enters] == seen


class CountedGetters(TorchFunctionMode):
    """Counts the calls of torch.Tensor's .shape getter made under it."""

    def __init__(self):
        super().__init__()
        self.shape = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.shape += getattr(getattr(func, "__self__", None), "__name__", None) == "shape"
        return func(*args, **(kwargs or {}))


def test_the_c_wrapper_reads_tensors_without_torchs_getters_where_built(monkeypatch, tmp_path):
    if _core._fast is None:
        pytest.skip("the probe's C extension is not built here (no C compiler at install)")
    if _core._META is None:
        if not (shutil.which("c++") or shutil.which("g++")):
            pytest.skip("no C++ compiler here: rankscope.probe._meta cannot be built")
        pytest.fail(
            "rankscope.probe._meta is not built for this torch: reinstall with torch present "
            "and without build isolation (make install does)"
        )
    counts = {}
    for meta in (_core._META, None):
        monkeypatch.setattr(_core, "_META", meta)
        p = _core.Probe(RunDir(tmp_path / str(meta is None)), rank=0)
        try:
            reduce = p._wrap("all_reduce", all_reduce, None)
            x, y = torch.ones(3), torch.ones(3)
            with CountedGetters() as counted:
                for t in (x, x, x, y, y):
                    reduce(t)  # one site
            counts[meta is None] = counted.shape
        finally:
            close_probes(p)
    # the getters only for the site's first call; then sizes and dtype compare equal
    assert counts == {False: 1, True: 5}


def test_the_tensor_reader_is_used_only_under_the_torch_and_layout_it_was_built_for(monkeypatch):
    if _core._META is None:
        pytest.skip("rankscope.probe._meta is not built here")
    from rankscope.probe import _meta

    assert _core._meta_reader() is _meta.read
    with monkeypatch.context() as m:
        m.setattr(_meta, "torch_build", "2.8.0 0000000")
        assert _core._meta_reader() is None
    # a reader built from other sources than the wrapper's fills another struct
    monkeypatch.delattr(_meta, "layout")
    assert _core._meta_reader() is None


def test_a_new_default_group_is_seen_at_once(probe):
    """init/destroy_process_group make what is cached about groups stale, call sites' too."""
    reduce = probe._wrap("all_reduce", all_reduce, None)
    probe._pg_cache[None] = ("0", "default_pg", [0, 1])
    named = object()
    probe._pg_cache[named] = ("7", "tp", [1])
    for _ in range(2):
        for group in (None, named, None):
            reduce(torch.ones(1), group=group)  # one site, two groups
        probe._groups_changed()  # as after destroy_process_group and init_process_group
        probe._pg_cache[None] = ("1", "default_pg", [0, 1, 2])
    enters = [e for e in records(probe) if e["ev"] == "enter"]
    pgs = [(e["pg"], e["seq"]) for e in enters]
    assert pgs == [("0", 1), ("7", 1), ("0", 2), ("1", 1), (str(named), 1), ("1", 2)]
    assert enters[3]["pg_ranks"] == [0, 1, 2]


def test_calls_made_inside_a_recorded_call_are_not_recorded(probe):
    inner = probe._wrap("all_reduce", all_reduce, None)

    def gather_then_reduce(tensor_list, tensor, group=None, async_op=False):
        inner(tensor)

    outer = probe._wrap("all_gather", gather_then_reduce, None)
    outer([torch.ones(1), torch.ones(1)], torch.ones(1, dtype=torch.int64))
    inner(torch.ones(1))
    enters = [e for e in records(probe) if e["ev"] == "enter"]
    assert [e["op"] for e in enters] == ["all_gather", "all_reduce"]
    assert enters[0]["shapes"] == [[1], [1], [1]]
    assert enters[0]["dtypes"] == ["float32", "float32", "int64"]


def test_odd_arguments_never_break_the_call(probe):
    reduce = probe._wrap("all_reduce", all_reduce, None)
    reduce([1, 2, 3], group=["unhashable"])  # not a tensor, a group that cannot be a key
    reduce(tensor=torch.ones(1), group=None)
    reduce(**{"".join(["ten", "sor"]): torch.ones(2)})  # a keyword name that is not interned
    reduce.__call__(torch.ones(3), None, None, True)  # through tp_call, as C callers call
    enters = [e for e in records(probe) if e["ev"] == "enter"]
    assert enters[0]["shapes"] == [] and enters[0]["pg"] == "['unhashable']"
    assert [e["shapes"] for e in enters[1:]] == [[[1]], [[2]], [[3]]]
    assert enters[3]["async_op"] is True and enters[3]["line"] == line_of("through tp_call")


def test_the_wrapper_looks_like_the_function(probe):
    reduce = probe._wrap("all_reduce", all_reduce, None)
    assert reduce.__wrapped__ is all_reduce and reduce.__name__ == "all_reduce"
    assert reduce.__rankscope__ is True
    assert inspect.signature(reduce) == inspect.signature(all_reduce)
    assert functools.partial(reduce, torch.ones(1))() is None


def some_calls(p: _core.Probe) -> None:
    """Calls of every kind: fast and Python-entered, failing, odd peers, steps in between."""
    reduce = p._wrap("all_reduce", all_reduce, None)
    sender = p._wrap("send", send, "dst")
    gather = p._wrap("all_gather", all_gather, None)
    for i in range(20):
        reduce(torch.ones(i % 3 + 1))
        sender(torch.ones(1), dst=[1])  # a peer that is no JSON key
        gather([torch.ones(1)] * 2, torch.ones(1), async_op=True)
        with pytest.raises(RuntimeError):
            reduce(torch.ones(0))
        p.step(i)


def make_probe(path, monkeypatch, wrapper: str) -> _core.Probe:
    if _core._fast is None:
        pytest.skip("the probe's C extension is not built here (no C compiler at install)")
    with monkeypatch.context() as m:
        if wrapper == "python":
            m.setattr(_core, "_fast", None)
        return _core.Probe(RunDir(path), rank=3)


def test_c_probe_records_what_the_python_probe_records(tmp_path, monkeypatch):
    """The C wrapper and records write the Python ones' lines, but for the times."""
    probes = [make_probe(tmp_path / w, monkeypatch, w) for w in ("c", "python")]
    try:
        for p in probes:
            some_calls(p)
        c, python = ([_timeless(e) for e in records(p)] for p in probes)
        assert c == python
        assert len([e for e in c if e["ev"] not in ("facts", "path")]) == 20 * 9
        # each distinct call's facts written once: 3 shapes of all_reduce, 1 failing, send, gather
        facts = [e for e in c if e["ev"] == "facts"]
        assert [e["facts"] for e in facts] == [1, 2, 3, 4, 5, 6]
        # each of some_calls' four lines is a path of its own, written once
        assert [e["path"] for e in facts] == [1, 2, 3, 4, 1, 1]
        paths = [e for e in c if e["ev"] == "path"]
        assert [e["path"] for e in paths] == [1, 2, 3, 4]
        lines = inspect.getsource(some_calls).splitlines()
        first = some_calls.__code__.co_firstlineno
        for e in paths:
            file, func, line = e["frames"][-1]
            assert (file, func) == (__file__, "some_calls") and e["cut"] == 0
            assert "p._wrap" not in lines[line - first] and "(" in lines[line - first]
            assert e["frames"][-2][:2] == [
                __file__,
                "test_c_probe_records_what_the_python_probe_records",
            ]
        # the lines the probes wrote themselves (path, facts) are the same bytes but the times
        written = [
            [
                re.sub(rb',"t":[0-9.]+,', b",", line)
                for line in p.run.events(p.rank).read_bytes().splitlines()
                if line.startswith((b'{"ev":"path"', b'{"ev":"facts"'))
            ]
            for p in probes
        ]
        assert written[0] == written[1] and len(written[0]) == 10
    finally:
        close_probes(*probes)


def _timeless(event: dict) -> dict:
    return {k: v for k, v in event.items() if k not in ("t", "dur_s")}


#: (t, t_end) of calls whose lines the C and Python formatters must write alike: ties of the
#: microsecond, negative durations (a clock stepped back), a time that is no number.
TIMES = [
    (1763812345.1234565, 1763812345.1234575),
    (0.0000005, 0.0000015),
    (2.5e-6, -2.5e-6),
    (-0.4e-6, 0.4e-6),
    (1e300, float("nan")),
    (float("inf"), 1.0),
]


def lines_of(p=None, **given):
    """A line writer for a State: the probe ``p``'s formatters, or none (events only)."""
    fields = dict(
        entered=set(),
        statics={},
        enter_line=None,
        call_line=None,
        exit_line=None,
        event_line=_core._line,
        rank=0,
        in_flight=lambda: None,
    )
    if p is not None:
        fields.update(
            statics=p._static,
            enter_line=p._enter_line,
            call_line=functools.partial(_twins._call_line, p.rank),
            exit_line=p._exit_line,
            rank=p.rank,
        )
    return _core._Lines(**{**fields, **given})


def test_c_lines_match_python_lines(tmp_path, monkeypatch):
    """The probe thread's formatting and writing in C writes what the Python one writes."""
    p = make_probe(tmp_path, monkeypatch, "python")
    try:
        some_calls(p)
        queued = p._state.queue
        call, _, ok, error = queued[0]
        assert ok and error is None
        for t, t_end in TIMES:  # the times' formatting, at its edges: call, enter, exit lines
            queued.append((call._replace(t=t), t_end, ok, error))
            queued.append((call._replace(t=t), t_end, False, "RuntimeError: no"))
            queued.append((call._replace(t=t), t_end, False, None))
        # as if the thread had written this call's enter line early
        entered = {next(item for item in queued[5:] if len(item) == 4)[0].cid}
        c_lines = lines_of(p)
        c_state = _core._fast.State(_core._Call, None, c_lines)
        for item in queued:
            c_state.append(item)
        in_flight = p._enter_line(call._replace(cid=10**6))
        written = {}
        for name, state, lines in (("c", c_state, c_lines), ("python", p._state, p._state.lines)):
            fd = os.open(tmp_path / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            try:
                lines.entered.clear()
                lines.entered |= entered
                lines.in_flight = lambda: in_flight
                state.write(fd)
                lines.entered.clear()
                lines.in_flight = lambda: None
                state.write(fd)  # taken: nothing more to write
                lines.in_flight = lambda: in_flight
                state.write(fd)
            finally:
                os.close(fd)
            written[name] = (tmp_path / name).read_bytes()
        c = written["c"]
        assert c == written["python"]
        # a step, three calls that returned (a line each), one that raised (enter and exit)
        assert len(c.splitlines()) == 20 * 6 + 5 * len(TIMES) + 2
        kinds = [json.loads(line)["ev"] for line in c.splitlines()]
        assert kinds.count("call") == 20 * 3 - 1 + len(TIMES) and kinds.count("facts") == 0
        assert c.splitlines()[-1] == c.splitlines()[-2] == in_flight.rstrip().encode()
        assert all(json.loads(line) for line in c.splitlines())
    finally:
        close_probes(p)


def test_c_state_write_failure_keeps_the_state_usable(tmp_path):
    """A write that fails raises OSError (Probe.flush drops that batch), and the next one works;
    a second writer at the same time is refused rather than sharing the buffer, and the lines
    formatted before a failure are written all the same."""
    if _core._fast is None:
        pytest.skip("the probe's C extension is not built here (no C compiler at install)")
    lines = lines_of()
    state = _core._fast.State(_core._Call, None, lines)
    state.append(({"ev": "step", "n": 1},))
    read_only = os.open(tmp_path / "ro", os.O_RDONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError):
            state.write(read_only)
    finally:
        os.close(read_only)
    fd = os.open(tmp_path / "events", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        state.append(({"ev": "step", "n": 2},))

        def reenter():
            lines.in_flight = lambda: None
            state.write(fd)

        lines.in_flight = reenter
        with pytest.raises(RuntimeError, match="already running"):
            state.write(fd)
        state.append(({"ev": "step", "n": 3},))
        state.write(fd)
    finally:
        os.close(fd)
    assert [json.loads(x)["n"] for x in (tmp_path / "events").read_text().splitlines()] == [2, 3]


def test_c_state_refuses_records_of_unknown_shapes():
    if _core._fast is None:
        pytest.skip("the probe's C extension is not built here (no C compiler at install)")
    state = _core._fast.State(_core._Call, None, lines_of())
    for bad in [(), ("a", "b"), (("not a call",), 1.0, True, None), [{"ev": "x"}]]:
        with pytest.raises(TypeError):
            state.append(bad)
    call = _core._Call(
        0, 1, 0.0, 1, "all_reduce", None, None, None, None, (), (), False, (None,) * 3, None, 1
    )
    with pytest.raises(ValueError, match="positive"):
        state.append((call, 1.0, True, None))
    with pytest.raises(TypeError, match="error"):
        state.append((call._replace(cid=1), 1.0, False, 42))


def test_the_c_serves_only_the_layouts_it_reads():
    """The C reads a _Call and a _Spec by position: the fields it declares are theirs."""
    try:
        from rankscope.probe import _fast
    except ImportError:
        pytest.skip("the probe's C extension is not built here (no C compiler at install)")
    assert _core._Call._fields == _fast.CALL_FIELDS
    assert _core._Spec._fields == _fast.SPEC_FIELDS


def test_the_ring_slot_is_defined_once():
    """``_fast.c``'s ``RingSlot`` declares RING_SLOT_FIELDS' fields, in their order and types,
    padded to RING_SLOT's size; the Python writer's offsets are RING_SLOT_OFFSETS'."""
    source = (Path(_core.__file__).parent / "_fast.c").read_text()
    body = re.search(r"typedef struct \{([^{}]*)\} RingSlot;", source)[1]
    codes = {"uint64_t": "Q", "int64_t": "q", "double": "d", "uint32_t": "I"}
    fields, pad = [], 0
    for decl in re.sub(r"/\*.*?\*/", "", body, flags=re.S).split(";"):
        words = decl.replace(",", " ").split()
        if not words:
            continue
        if words[0] == "char":
            pad = int(re.fullmatch(r"\w+\[(\d+)\]", words[1])[1])
            continue
        fields += [(name, codes[words[0]]) for name in words[1:]]
    assert tuple(fields) == RING_SLOT_FIELDS
    used = RING_SLOT_OFFSETS[fields[-1][0]] + struct.calcsize(fields[-1][1])
    assert used + pad == RING_SLOT.size == 64
    assert (
        RING_SLOT_OFFSETS["t_end"] == _twins._T_END and RING_SLOT_OFFSETS["state"] == _twins._STATE
    )


@pytest.mark.parametrize("which", ["c", "python"])
def test_state_write_writes_the_lines_when_in_flight_fails(tmp_path, which):
    if which == "c" and _core._fast is None:
        pytest.skip("the probe's C extension is not built here (no C compiler at install)")

    def in_flight():
        raise ValueError("no line")

    lines = lines_of(in_flight=in_flight)
    state = (
        _core._fast.State(_core._Call, None, lines) if which == "c" else _core._State(None, lines)
    )
    state.append(({"ev": "step", "n": 1},))
    fd = os.open(tmp_path / "events", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        with pytest.raises(ValueError, match="no line"):
            state.write(fd)
    finally:
        os.close(fd)
    assert json.loads((tmp_path / "events").read_text())["n"] == 1


def failing_all_reduce(tensor, op=None, group=None, async_op=False):
    raise RuntimeError("Connection closed by peer [127.0.0.1]:1234")


def interrupted_all_reduce(tensor, op=None, group=None, async_op=False):
    raise KeyboardInterrupt


def test_a_call_that_raises_leaves_the_values_its_callers_read(probe):
    """Where a collective raises an error, the values its callers' conditions read are written
    while their frames are on the stack (a helper that swallows the error returns, and the rank
    goes on); at most FAILED_VALUES lines; an interrupt is not an error of the call's."""
    reduce = probe._wrap("all_reduce", failing_all_reduce, None)
    interrupted = probe._wrap("all_reduce", interrupted_all_reduce, None)

    def report(tensor, main):
        if main:  # a condition: the value of main is read
            try:
                reduce(tensor)
            except RuntimeError:
                return "swallowed"
        return "skipped"

    x = torch.ones(1)
    assert report(x, main=True) == "swallowed"
    with pytest.raises(KeyboardInterrupt):
        interrupted(x)
    lines = [json.loads(t) for t in probe.run.values(0).read_text().splitlines()]
    assert [(line["id"], line["reason"]) for line in lines] == [(None, "call_failed")]
    (thread,) = [t for t in lines[0]["threads"] if t["thread"] == f"0x{threading.get_ident():016x}"]
    file, func, line, values = thread["frames"][-1]
    assert (file, func, values) == (__file__, "report", {"main": True})
    assert line == report.__code__.co_firstlineno + 3  # the call, inside the try
    for _ in range(_core.FAILED_VALUES + 3):
        report(x, main=True)
    assert len(probe.run.values(0).read_text().splitlines()) == _core.FAILED_VALUES
    # the call's own record says it raised, as before
    probe.flush()
    events = [json.loads(t) for t in probe.run.events(0).read_text().splitlines()]
    failed = [e for e in events if e["ev"] == "exit" and not e["ok"]]
    assert failed and failed[0]["error"].startswith("RuntimeError: Connection closed")
