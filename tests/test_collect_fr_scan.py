"""The compiled flight-recorder scanner: the same tables as the restricted unpickler, and no
pickle it cannot vouch for (hostile, truncated, wrong types, huge lengths) gets past it."""

from __future__ import annotations

import importlib.util
import json
import pickle
import random
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from rankscope.collect import _fr_parse

_fr_scan = pytest.importorskip("rankscope.collect._fr_scan", reason="the C scanner is not built")

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(Path(__file__).parent))
import test_collect_untrusted as untrusted  # noqa: E402


def _make_dumps():
    spec = importlib.util.spec_from_file_location("make_dumps", DATA / "nccl_fr" / "make_dumps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def python_reader(
    monkeypatch: pytest.MonkeyPatch, items: list[tuple[int, str]], task: str = "entries"
) -> dict:
    with monkeypatch.context() as m:
        m.setattr(_fr_parse, "_fr_scan", None)
        return _fr_parse.TASKS[task](items)


def assert_readers_agree(monkeypatch: pytest.MonkeyPatch, items: list[tuple[int, str]]) -> None:
    """The entries and the frames of the files, with the scanner and without: the same."""
    for task in ("entries", "frames"):
        assert_same(_fr_parse.TASKS[task](items), python_reader(monkeypatch, items, task))


def assert_same(a: dict, b: dict) -> None:
    assert a["arrays"].keys() == b["arrays"].keys()
    for key, x in a["arrays"].items():
        y = b["arrays"][key]
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), key
    assert a["meta"] == b["meta"]


def scanned(data: bytes) -> bool:
    return _fr_parse._scan(data) is not None


def fixture_pickles() -> list[Path]:
    return [
        p
        for p in sorted(DATA.rglob("*"))
        if p.is_file() and p.suffix in ("", ".pkl") and p.read_bytes()[:1] == b"\x80"
    ]


def test_every_committed_dump_is_scanned_into_the_same_table(tmp_path, monkeypatch):
    paths = fixture_pickles()
    assert len(paths) > 50
    assert all(scanned(p.read_bytes()) for p in paths)
    items = [(i, str(p)) for i, p in enumerate(paths)]
    assert_readers_agree(monkeypatch, items)


def test_every_layout_and_protocol_gives_the_same_table(tmp_path, monkeypatch):
    dumps = _make_dumps()
    items = []
    for divergence in dumps.DIVERGENCES:
        culprit = None if divergence in ("p2p_cycle", "none") else 2
        for rank in range(4):
            kw = {"world": 4, "entries": 24, "culprit": culprit, "divergence": divergence}
            if divergence == "shape":
                kw.update(world=8, subgroups=True)
            dump = dumps.build_dump(rank, **kw)
            layouts = {"torch": dumps.torch_pickle(dump)}
            for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
                layouts[str(protocol)] = pickle.dumps(dump, protocol=protocol)
            for layout, data in layouts.items():
                path = tmp_path / f"{divergence}_{rank}_{layout}"
                path.write_bytes(data)
                assert scanned(data), path.name
                items.append((len(items), str(path)))
    assert_readers_agree(monkeypatch, items)


def test_odd_and_broken_dumps_give_the_same_table_and_problems(tmp_path, monkeypatch):
    """Whatever the scanner takes or leaves to the unpickler, the result is the Python
    reader's: odd values, wrong types, hostile pickles, truncations and bit flips."""
    rng = random.Random(34)
    dumps = _make_dumps()
    # torch's layout (what the scanner reads in one go) with what its shortcuts do not take:
    # lists three deep, 300 items long, a tuple holding a list, a tuple of four; 300 texts
    # before the entries, so that they refer to the memo with LONG_BINGET
    odd = dumps.build_dump(1, world=2, entries=4, divergence="none")
    odd["pg_config"]["0"]["texts"] = [f"text {i}" for i in range(300)]
    odd["entries"][0].update(input_sizes=[[[1]]], output_sizes=[list(range(300))])
    odd["entries"][1].update(process_group=("0", [0, 1]), input_dtypes=("a", "b", "c", "d"))
    torch_layout = dumps.torch_pickle(odd)
    bases = [untrusted.BASES["fr_pickle"].read_bytes(), torch_layout]
    cases = untrusted.odd_fields() + [data for _, data in untrusted.wrong_types()]
    cases += list(untrusted.hostile_pickles(tmp_path / "pwned").values())
    cases.append(torch_layout)
    # two lists written alike, the memo entry they refer to set again between them: unequal
    cases.append(
        b"\x80\x02}("
        + _text("entries")
        + b"]("
        + (b"}(" + _text("state") + b"q\x01" + _text("Float") + b"q\x02")
        + (_text("input_dtypes") + b"q\x03](h\x02eu")
        + (b"}(h\x01" + _text("Half") + b"q\x02h\x03](h\x02eu")
        + b"eu."
    )
    for base in bases:
        for _ in range(60):
            cases.append(base[: rng.randrange(1, len(base))])
            flipped = bytearray(base)
            for _ in range(rng.randint(1, 6)):
                flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
            cases.append(bytes(flipped))
    items = []
    for i, data in enumerate(cases):
        (path := tmp_path / f"case{i}").write_bytes(data)
        items.append((i, str(path)))
        # one file at a time: a file's rows, codes and problems are compared on their own
        assert_readers_agree(monkeypatch, items[-1:])
    assert_readers_agree(monkeypatch, items)
    assert not (tmp_path / "pwned").exists()


def _nested(depth: int) -> list:
    out: list = []
    for _ in range(depth):
        out = [out]
    return out


def _text(text: str) -> bytes:
    """A text as torch's pickler writes it (BINUNICODE)."""
    return b"X" + struct.pack("<I", len(text.encode())) + text.encode()


def _dump(entries_pickle: bytes) -> bytes:
    """A protocol-2 pickle of ``{"entries": <entries_pickle>}``."""
    return b"\x80\x02}X\x07\x00\x00\x00entries" + entries_pickle + b"s."


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("global", pickle.dumps({"entries": [untrusted._Call(print, "x")]})),
        ("protocol 0 global", b"cos\nsystem\n(S'true'\ntR."),
        ("truncated", pickle.dumps({"entries": [{"record_id": 1}]})[:-3]),
        ("no stop", pickle.dumps({"entries": []})[:-1]),
        ("garbage after stop", pickle.dumps({"entries": []}) + b"xyz"),
        ("huge string length", _dump(b"\x8d" + struct.pack("<Q", 1 << 62) + b"abc")),
        ("string past the end", _dump(b"X" + struct.pack("<I", 1 << 20) + b"abc")),
        ("huge int", _dump(b"]}(X\x09\x00\x00\x00record_id\x8a\x09" + b"\x01" * 9 + b"ua")),
        ("long4 huge length", _dump(b"\x8b\xff\xff\xff\x7f")),
        ("memo index past the bound", _dump(b"]r\xff\xff\xff\xff")),
        ("memo get of nothing", _dump(b"h\x05")),
        ("frame past the end", b"\x80\x04\x95" + struct.pack("<Q", 1 << 40) + b"}."),
        ("bad utf-8", _dump(b"]}(X\x09\x00\x00\x00record_id\x8c\x02\xc3\x28ua")),
        ("entries a dict", _dump(b"}")),
        ("entry an int", _dump(b"](K\x01e")),
        ("int field a string", pickle.dumps({"entries": [{"record_id": "7"}]})),
        ("int field a bool", pickle.dumps({"entries": [{"record_id": True}]})),
        ("float field a string", pickle.dumps({"entries": [{"duration_ms": "slow"}]})),
        ("list as a key", _dump(b"]}(]\x8c\x01xua")),
        ("append to a dict", _dump(b"a")),
        ("stack underflow", _dump(b"0000")),
        ("odd setitems", _dump(b"]}(K\x01ua")),
        ("a set", pickle.dumps({"entries": [{"state": {"x"}}]}, protocol=4)),
        ("bytes", pickle.dumps({"entries": [{"state": b"x"}]})),
        ("top level a list", pickle.dumps([{"entries": []}])),
        ("deep nesting", pickle.dumps({"pg_config": _nested(200), "entries": []})),
    ],
)
def test_the_scanner_leaves_what_it_cannot_vouch_for(name, data):
    assert _fr_scan.scan(data, *_ARGS) is None, name


_ARGS = (
    _fr_parse.INT_FIELDS,
    "duration_ms",
    _fr_parse.BOOL_FIELDS,
    _fr_parse.COLUMN_CODED,
    _fr_parse.HEAD_KEYS,
)


def test_the_scanner_reads_what_it_vouches_for():
    """Memo sharing, duplicate keys (the last wins), None and missing fields, negative and
    64-bit numbers: the columns as the unpickled dump has them."""
    shared = [[4, 8]]
    entries = [
        {"record_id": -5, "state": "done", "input_sizes": shared, "retired": True},
        {"record_id": 2**63 - 1, "duration_ms": 3, "input_sizes": shared, "retired": None},
        {"record_id": None, "duration_ms": 0.5, "state": "done", "retired": False},
    ]
    data = pickle.dumps({"version": "2.10", "entries": entries, "pg_status": {"0": {}}})
    head, n, ints, masks, floats, bools, coded = _fr_scan.scan(data, *_ARGS)
    assert head == {"version": "2.10", "pg_status": {"0": {}}} and n == 3
    record = _fr_parse.INT_FIELDS.index("record_id")
    assert np.frombuffer(ints[record], np.int64).tolist() == [-5, 2**63 - 1, 0]
    assert np.frombuffer(masks[record], bool).tolist() == [False, False, True]
    assert np.isnan(np.frombuffer(floats, np.float64)).tolist() == [True, False, False]
    assert np.frombuffer(bools[_fr_parse.BOOL_FIELDS.index("retired")], np.int8).tolist() == [
        1,
        -1,
        0,
    ]
    objs, at = coded[_fr_parse.COLUMN_CODED.index("input_sizes")]
    assert objs == [[[4, 8]], None] and np.frombuffer(at, np.int32).tolist() == [0, 0, 1]
    objs, at = coded[_fr_parse.COLUMN_CODED.index("state")]
    assert [objs[i] for i in np.frombuffer(at, np.int32)] == ["done", None, "done"]
    # a key set twice: the later value, as a dict keeps it
    twice = _dump(b"]}(X\x09\x00\x00\x00record_idK\x01X\x09\x00\x00\x00record_idK\x02ua")
    _, _, ints, *_ = _fr_scan.scan(twice, *_ARGS)
    assert np.frombuffer(ints[record], np.int64).tolist() == [2]


def test_a_part_crosses_the_pipe_whole_and_a_damaged_one_is_refused():
    import io
    import json as json_

    part = _fr_parse.parse_entries([(0, str(fixture_pickles()[0]))])
    out = io.BytesIO()
    _fr_parse.encode(part, out)
    data = out.getvalue()
    # the meta travels as JSON (tuples become lists)
    assert_same(
        _fr_parse.decode(io.BytesIO(data)), {**part, "meta": json_.loads(json_.dumps(part["meta"]))}
    )
    two = _fr_parse.decode_all(io.BytesIO(data + data))
    assert len(two) == 2 and all(
        np.array_equal(p["arrays"]["file_index"], part["arrays"]["file_index"]) for p in two
    )
    for damaged in (data[:-1], data + b"x", data[:5]):
        with pytest.raises(ValueError):
            _fr_parse.decode_all(io.BytesIO(damaged))
    size = int.from_bytes(data[:8], "little")
    header = json_.loads(data[8 : 8 + size])
    header["arrays"][0][1] = "|O"  # an object array would unpickle: refused
    forged = json_.dumps(header).encode()
    with pytest.raises(ValueError, match="type"):
        _fr_parse.decode(io.BytesIO(len(forged).to_bytes(8, "little") + forged + data[8 + size :]))


def _fresh(text: str) -> str:
    """``text`` as a new string object: the pickler writes it again instead of referring to
    the first write."""
    return "".join(list(text))


def test_frame_dicts_in_any_shape_or_place_give_the_same_table(tmp_path, monkeypatch):
    """The scanner gives a frame dict (exactly "filename", "name" and "line") its id as it is
    made and keeps no items: keys in any order, texts written once or anew for every frame
    (the machinery's too), frame dicts shared, with a fourth key, a key twice or a value of a
    wrong type, an entry that is itself a frame dict, a frame dict outside the frames (a coded
    value, the head) or set again after it was made: the Python reader's table every time."""
    torch_file = "/x/torch/distributed/distributed_c10d.py"
    user = "/srv/job/train.py"

    def frame(name: str, file: str, line: object, order: str = "nfl") -> dict:
        items = {"n": ("name", name), "f": ("filename", file), "l": ("line", line)}
        return dict(items[k] for k in order)

    shared = frame("step", user, 3)
    stacks = [
        [frame("all_reduce", torch_file, 9), shared, frame("<module>", user, 30)],
        [frame("all_reduce", _fresh(torch_file), 9, "lfn"), shared, frame("<module>", user, 30)],
        [frame(_fresh("all_reduce"), _fresh(torch_file), 9, "fln"), frame("step", _fresh(user), 3)],
        [{**frame("step", user, 3), "locals": 1}, frame("<module>", user, 30, "lnf")],
        [{"name": "step", "line": 3}, shared],
        [frame("step", user, True), shared],
        [frame("step", user, "3"), shared],
        [frame("step", user, None), shared],
        [frame("step", 7, 3)],
        [frame("step", user, 2**40)],
    ]
    entries: list = [
        {"record_id": i, "collective_seq_id": i, "frames": s, "profiling_name": "nccl:all_reduce"}
        for i, s in enumerate(stacks)
    ]
    cases = {
        "frames": {"version": "2.10", "entries": entries},
        "an entry a frame dict": {"entries": [*entries, frame("step", user, 3)]},
        "a coded value a frame dict": {"entries": [*entries, {"state": frame("a", user, 1)}]},
        "a head value a frame dict": {"pg_config": frame("a", user, 1), "entries": entries},
    }
    items = []
    for name, dump in cases.items():
        for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
            (path := tmp_path / f"{name} {protocol}").write_bytes(pickle.dumps(dump, protocol))
            items.append((len(items), str(path)))
    # a frame dict set again after it was made (its line changed): left to the unpickler
    frame_pickle = b"}q\x02(X\x08\x00\x00\x00filenameX\x05\x00\x00\x00/a.pyX\x04\x00\x00\x00name"
    frame_pickle += b"X\x01\x00\x00\x00fX\x04\x00\x00\x00lineK\x05u"
    entries_pickle = b"]}X\x06\x00\x00\x00frames](" + frame_pickle + b"esa"
    set_again = _dump(entries_pickle + b"h\x02X\x04\x00\x00\x00lineK\x09s0")
    (path := tmp_path / "set again").write_bytes(set_again)
    items.append((len(items), str(path)))
    assert pickle.loads(set_again)["entries"][0]["frames"][0]["line"] == 9
    read = {Path(p).name: _fr_parse._scan(Path(p).read_bytes()) for _, p in items}
    assert all(read[f"frames {p}"] is not None for p in range(2, pickle.HIGHEST_PROTOCOL + 1))
    assert read["an entry a frame dict 4"] is not None
    assert read["a coded value a frame dict 4"] is None  # its items are not kept: Python says
    assert read["a head value a frame dict 4"] is None
    assert read["set again"] is None
    for item in items:
        assert_readers_agree(monkeypatch, [item])
    both = _fr_parse.parse_entries(items[:1])
    paths = [json.loads(t) for t in both["meta"]["categories"]["path"]]
    assert [user, "step", 3] in paths[0] and not any(torch_file in str(p) for p in paths)


def test_heavy_dumps_give_the_same_table(tmp_path, monkeypatch):
    """The bench's dumps as heavy as real ones (every entry with its stack, a file text
    written anew for many frames), with the rank that diverges: the scanner's table is the
    Python reader's."""
    dumps = _make_dumps()
    paths = dumps.write_dumps(tmp_path, world=4, entries=300, culprit=1, divergence="extra")
    assert all(scanned(p.read_bytes()) for p in paths)
    items = [(i, str(p)) for i, p in enumerate(paths)]
    part = _fr_parse.parse_entries(items)
    assert_same(part, python_reader(monkeypatch, items))
    assert len(part["meta"]["categories"]["path"]) > 3 and (part["arrays"]["code:path"] >= 0).all()
    assert all(_fr_parse._scan_frames(p.read_bytes()) is not None for p in paths)
    frames = _fr_parse.parse_frames(items)
    assert_same(frames, python_reader(monkeypatch, items, "frames"))
    assert len(frames["arrays"]["frame"]) >= 4 * 300 * 15  # every entry's whole stack


def test_frames_the_scanner_reads_are_the_python_readers(tmp_path, monkeypatch):
    """read_fr_frames through the scanner: items of a stack that are not dicts, frames that
    are not a list, a stack deeper than MAX_FRAMES, the machinery's frames, a frames list
    shared by entries and a record_id missing give the Python reader's rows; a malformed frame
    dict leaves the dump to it."""
    torch_file = "/x/torch/distributed/distributed_c10d.py"
    user = "/srv/job/train.py"
    deep = [{"filename": user, "name": f"f{i}", "line": i} for i in range(_fr_parse.MAX_FRAMES + 9)]
    shared = [{"filename": torch_file, "name": "all_reduce", "line": 9}, deep[0]]
    stacks = [shared, [None, deep[1], 5, "x", deep[2]], (deep[3],), "frames", None, deep, shared]
    entries: list = [{"record_id": i, "frames": s} for i, s in enumerate(stacks)]
    entries.append({"frames": shared})  # no record_id
    entries.append({"record_id": 99})  # no frames
    good = {"version": "2.10", "entries": entries}
    bad = {"entries": [*entries, {"record_id": 7, "frames": [{"name": "f", "line": 1}]}]}
    items = []
    for name, dump in {"good": good, "bad": bad}.items():
        for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
            (path := tmp_path / f"{name} {protocol}").write_bytes(pickle.dumps(dump, protocol))
            items.append((len(items), str(path)))
            rows = _fr_parse._scan_frames(path.read_bytes())
            assert (rows is None) == (name == "bad"), path.name
            assert_readers_agree(monkeypatch, items[-1:])
    assert_readers_agree(monkeypatch, items)
    part = _fr_parse.parse_frames(items[:1])
    depth = part["arrays"]["depth"]
    assert depth.max() == _fr_parse.MAX_FRAMES - 1 and list(depth[2:4]) == [1, 4]
    assert (part["arrays"]["record_id"] == -1).sum() == len(shared)
    assert ["all_reduce", torch_file, 9] in [list(f) for f in part["meta"]["frames"]]


def _text(s: str) -> bytes:
    return b"\x8c" + bytes([len(s)]) + s.encode()


def test_small_dicts_read_at_once_give_the_same_table(tmp_path, monkeypatch):
    """The scanner reads a small dict of scalars (EMPTY_DICT, its memo entry, MARK, keys and
    values, SETITEMS) in one go; whatever breaks that shape (a value that is the dict itself, a
    container or an unset memo entry, a memoized text, too many items, a cut) is read opcode by
    opcode, and a frame dict read at once behaves as one made opcode by opcode (shared, an
    entry, a coded value, a dict key): the Python reader's table every time."""
    frame = b"}q\x05(" + _text("filename") + _text("/srv/t.py") + _text("name") + _text("f")
    frame += _text("line") + b"K\x03u"
    record = _text("record_id")
    entries = {
        "plain": b"](}\x94(" + record + b"K\x01" + _text("state") + _text("completed") + b"ue",
        "memoize": b"](}\x94(" + record + b"\x94K\x01ue",  # a memoized key text
        "binput": b"](}q\x01(" + record + b"K\x02" + _text("pg_id") + b"J\x00\x00\x00\x80ue",
        "itself": b"](}q\x01(" + record + b"h\x01ue",
        "a container": b"](]q\x03}q\x01(" + record + b"h\x03ue",
        "unset": b"](}q\x01(" + record + b"h\x09ue",
        "too many": b"](}q\x01(" + record * 9 + b"K\x01" * 9 + b"ue",
        "frames": b"](}q\x01("
        + record
        + b"K\x01"
        + _text("frames")
        + b"]q\x02("
        + frame
        + b"h\x05eue",
        "a frame entry": b"](" + frame + b"h\x05e",
        "a frame coded": b"](" + frame + b"}q\x01(" + _text("state") + b"h\x05ue",
        "a frame key": b"](" + frame + b"}q\x01(h\x05K\x01ue",
        "a frame set again": b"](" + frame + b"h\x05" + _text("line") + b"K\x04se",
    }
    items = []
    for name, body in entries.items():
        data = b"\x80\x04}\x8c\x07entries" + body + b"s."
        (path := tmp_path / name).write_bytes(data)
        items.append((len(items), str(path)))
    read = {Path(p).name: _fr_parse._scan(Path(p).read_bytes()) for _, p in items}
    for name in ("plain", "memoize", "binput", "too many", "frames", "a frame entry"):
        assert read[name] is not None, name
    for name in ("itself", "a container", "unset", "a frame coded", "a frame key"):
        assert read[name] is None, name
    assert read["a frame set again"] is None
    assert read["frames"][1].paths[0] == [(("/srv/t.py", "f", 3),) * 2]  # shared, as written
    for item in items:
        assert_readers_agree(monkeypatch, [item])
    cut = b"\x80\x04}\x8c\x07entries](}q\x01(" + record + b"K"
    assert _fr_parse._scan(cut) is None
