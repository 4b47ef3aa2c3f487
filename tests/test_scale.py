"""What the scale work (issue 34) changed must read exactly as before: the events tail parsed a
batch at a time, the tracker's stat before a read, the flight recorder's sizes and frames coded
by object identity."""

from __future__ import annotations

import copy
import os
import pickle
import time
from pathlib import Path

import pandas as pd
import pytest

from rankscope import rundir
from rankscope.collect.flight_recorder import read_flight_recorder, read_fr_frames
from rankscope.launch import tracker as tracker_module
from rankscope.launch.tracker import RankTracker
from rankscope.rundir import EventTail, RunDir, event_lines


def _line_by_line(data: bytes) -> list[dict]:
    """Every complete line parsed on its own: what the batch parse must give."""
    return event_lines(data.split(b"\n")[:-1])


@pytest.mark.parametrize("orjson", [True, False], ids=["orjson", "without orjson"])
def test_the_events_tail_reads_a_batch_as_it_reads_each_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, orjson: bool
) -> None:
    """With orjson, and where it is not installed (a machine that cannot install it: the
    probe's rundir must still import and read)."""
    if not orjson:
        monkeypatch.setattr(rundir, "orjson", None)
    good = b'{"ev":"heartbeat","t":1.0}\n{"ev":"step","t":2.0,"step":3}\n'
    damaged = [
        b'{"ev":"enter","t":1}\n{"ev":\n{"ev":"exit","t":2}\n',  # a torn line
        b'{"ev":"step","t":1}\n[1, 2]\n{"ev":"exit","t":2}\n',  # a list, not an event
        b'{"ev":"step","t":1}\n{"a":1},{"b":2}\n',  # two values on one line
        b'{"ev":"step","t":1}\n\n1,2\n',  # an empty line, two numbers
    ]
    for data in [good, *damaged]:
        path = tmp_path / "events.jsonl"
        path.write_bytes(data + b'{"ev":"partial"')
        assert EventTail(path).read() == _line_by_line(data), data


def test_the_tracker_sees_appended_events_and_new_ranks_at_once(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    run.rank_dir(0).mkdir(parents=True)
    run.events(0).write_text('{"ev":"start","t":1.0,"pid":1}\n')
    tracker = RankTracker(run)
    assert tracker.update() and list(tracker.records) == [0]
    assert not tracker.update()  # nothing new: the stat says so, nothing is read
    with open(run.events(0), "a") as f:
        f.write('{"ev":"step","t":2.0,"step":7}\n')
    run.rank_dir(1).mkdir()
    run.events(1).write_text('{"ev":"start","t":1.5,"pid":2}\n')
    assert tracker.update()
    assert tracker.records[0].step == 7 and sorted(tracker.records) == [0, 1]


def _dump(entries: list[dict]) -> dict:
    return {"version": "2.10", "pg_config": {"0": {"ranks": "[0, 1]"}}, "entries": entries}


def _entries() -> list[dict]:
    sizes, dtypes = [[4, 8]], ["Float"]
    frames = [{"name": "f", "filename": "/srv/train.py", "line": 3}]
    return [
        {
            "record_id": i,
            "process_group": ("0", "default_pg"),
            "collective_seq_id": i + 1,
            "profiling_name": "nccl:all_reduce",
            # shared objects, as torch's pickle shares them, and one equal copy
            "input_sizes": sizes if i != 2 else [[4, 8]],
            "output_sizes": [[4, 8 + i % 2]],
            "input_dtypes": dtypes,
            "output_dtypes": ["Float"] if i % 2 else dtypes,
            "frames": frames if i != 1 else [*frames, {"name": "g", "filename": "x.py", "line": 1}],
            "state": "completed",
            "retired": True,
        }
        for i in range(5)
    ]


def test_sizes_and_frames_read_alike_whether_the_pickle_shares_them_or_not(tmp_path: Path) -> None:
    shared, unshared = tmp_path / "shared", tmp_path / "unshared"
    shared.mkdir(), unshared.mkdir()
    (shared / "nccl_trace_rank_0").write_bytes(pickle.dumps(_dump(_entries())))
    # every entry its own copies: nothing for the pickle to share
    copies = [copy.deepcopy(e) for e in _entries()]
    (unshared / "nccl_trace_rank_0").write_bytes(pickle.dumps(_dump(copies)))
    a = read_flight_recorder(sorted(shared.iterdir()))
    b = read_flight_recorder(sorted(unshared.iterdir()))
    pd.testing.assert_frame_equal(a.drop(columns="source"), b.drop(columns="source"))
    assert a["input_sizes"].astype(str).tolist() == ["[[4, 8]]"] * 5
    assert a["output_sizes"].astype(str).tolist()[:2] == ["[[4, 8]]", "[[4, 9]]"]
    fa = read_fr_frames(sorted(shared.iterdir()))
    fb = read_fr_frames(sorted(unshared.iterdir()))
    pd.testing.assert_frame_equal(fa, fb)
    assert fa["depth"].tolist() == [0, 0, 1, 0, 0, 0]
    assert os.path.basename(str(fa["filename"].iloc[2])) == "x.py"


def test_the_tracker_reads_a_file_whose_stat_is_stale_within_the_full_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On NFS a stat may return the size the client cached for seconds: a file is read (an
    open revalidates it) at least ``FULL_READ_S`` after its last read, whatever the stat says,
    and not before."""
    run = RunDir(tmp_path / "run")
    run.rank_dir(0).mkdir(parents=True)
    run.events(0).write_text('{"ev":"start","t":1.0,"pid":1}\n')
    tracker = RankTracker(run)
    tracker.update()
    monkeypatch.setattr(tracker_module, "FULL_READ_S", 0.3)
    monkeypatch.setattr(EventTail, "grew", lambda self: False)  # the cached size: unchanged
    with open(run.events(0), "a") as f:
        f.write('{"ev":"step","t":2.0,"step":7}\n')
    assert not tracker.update() and tracker.records[0].step is None  # the stat is believed
    time.sleep(0.35)
    assert tracker.update() and tracker.records[0].step == 7  # opened and read all the same


def test_first_rows_are_each_codes_first_row_across_chunks() -> None:
    import numpy as np

    from rankscope.collect import first_rows

    rng = np.random.default_rng(0)
    n = (1 << 20) * 2 + 5  # three chunks
    codes = rng.integers(-1, 6, n).astype(np.int8)
    codes[: (1 << 20) + 3] = np.where(codes[: (1 << 20) + 3] == 5, 4, codes[: (1 << 20) + 3])
    where = rng.random(n) < 0.3
    for mask in (None, where):
        rows = np.arange(n) if mask is None else np.flatnonzero(mask)
        expected = [n] * 7  # codes 0..5, and -1 as the last
        for row in rows[::-1]:
            expected[codes[row]] = row
        assert first_rows(codes, 7, where=mask).tolist() == expected
    assert first_rows(codes, 7)[5] > 1 << 20  # first met in the second chunk


def test_the_latest_dumps_read_each_dump_as_a_groupby_does() -> None:
    from rankscope.collect.run import _per_dump

    entries = pd.DataFrame(
        {
            "source": pd.Categorical(["a", "b", "a", "b", "a", None], categories=["c", "b", "a"]),
            "rank": pd.array([None, 1, 0, None, 2, 3], dtype="Int64"),
            "backend": pd.Categorical([None, "gloo", "nccl", "nccl", None, "gloo"]),
            "time_created_ns": pd.array([5, None, 7, None, 1, 9], dtype="Int64"),
        }
    )
    grouped = entries.groupby("source", sort=False).agg(
        rank=("rank", "first"), backend=("backend", "first"), newest=("time_created_ns", "max")
    )
    mine = _per_dump(entries)
    assert list(mine.index) == list(grouped.index.astype(str)) == ["a", "b"]
    for col in grouped:
        assert mine[col].astype(object).fillna(-1).tolist() == (
            grouped[col].astype(object).fillna(-1).tolist()
        ), col
