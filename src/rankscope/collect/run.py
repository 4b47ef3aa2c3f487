"""``load_run``: a run directory, or any folder of artifacts, as lazily loaded tables.

:class:`Run` finds the files once (:mod:`rankscope.collect.discover` says which file is what)
and builds each table on first use, from the readers of this package: flight-recorder dumps
(pickle or JSON), NCCL_DEBUG files, py-spy and faulthandler dumps, torchrun's logs,
``error.json`` files and plain logs (SLURM output with ``[rankN]:`` prefixes).
"""

from __future__ import annotations

import datetime as dt
import html
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rankscope import schema
from rankscope._values import as_float, as_int
from rankscope.collect._common import Problems, first_rows
from rankscope.collect.discover import Inventory, discover, end_event
from rankscope.collect.errors import find_errors
from rankscope.collect.events import parse_events
from rankscope.collect.flight_recorder import load_flight_recorder, read_fr_frames
from rankscope.collect.logs import last_output, read_logs
from rankscope.collect.nccl import load_nccl
from rankscope.collect.stacks import read_stacks, summarize_stacks
from rankscope.collect.values import read_values
from rankscope.rundir import RankRecord, RunDir, cell_fields, torchrun_failures
from rankscope.state import FATAL_SIGNALS, rank_end, signal_code, signal_name, stopping


class Run:
    """The tables of one run directory or artifact folder; each loads on first use and is kept.

    Attributes (all ``pandas.DataFrame``, schemas in :mod:`rankscope.schema`): ``events``,
    ``collectives``, ``paths``, ``logs``, ``nccl``, ``nccl_comms``, ``flight_recorder``, ``fr_frames``,
    ``pg_status``, ``stacks``, ``stack_summary``, ``values``, ``errors``, ``ranks`` and ``problems`` (which
    loads every other table first, so that it lists every file that could not be read).
    ``info`` is ``run.json`` (empty for a plain folder) and ``inventory`` the files found.
    """

    TABLES = tuple(schema.TABLES)

    def __init__(self, path: Path, *, workers: int | None = None):
        self.path = path
        self.workers = workers
        self._problems = Problems()
        self._cache: dict[str, pd.DataFrame] = {}
        run = RunDir(path)
        self.is_rundir = run.is_run() or run.ranks.is_dir()
        self.info: dict[str, Any] = {}
        if run.run_json.is_file():
            try:
                data = json.loads(run.run_json.read_bytes())
                self.info = data if isinstance(data, dict) else {}
            except (OSError, ValueError, RecursionError) as exc:
                self._problems.add("run.json", "run", f"run.json could not be read: {exc}")
        self.inventory = discover(path, self.is_rundir, self.info, self._problems)

    def __repr__(self) -> str:
        inv = self.inventory
        kind = "run directory" if self.is_rundir else "folder"
        return (
            f"<Run {kind} {str(self.path)!r}: {len(inv.events)} event files, {len(inv.logs)} logs, "
            f"{len(inv.flight_recorder)} flight-recorder dumps, {len(inv.stacks)} stack dumps, "
            f"{len(inv.nccl)} NCCL sources>"
        )

    #: Columns of the ranks table a notebook shows at a glance.
    GLANCE = ("rank", "host", "pid", "status", "end", "ring")

    def _repr_html_(self) -> str:
        """The run at a glance in a notebook: what was found, and how each rank ended."""
        inv = self.inventory
        kind = "run directory" if self.is_rundir else "folder of artifacts"
        found = {
            "event files": len(inv.events),
            "call rings": len(inv.rings),
            "logs": len(inv.logs),
            "flight-recorder dumps": len(inv.flight_recorder),
            "stack dumps": len(inv.stacks),
            "NCCL sources": len(inv.nccl),
        }
        counts = ", ".join(f"{n} {what}" for what, n in found.items() if n) or "no artifacts"
        ranks = self.table("ranks")
        shown = ranks[[c for c in self.GLANCE if c in ranks]].head(32)
        more = f"<p>... and {len(ranks) - len(shown)} more ranks</p>" if len(ranks) > 32 else ""
        state = self.info.get("state")
        head = f"<b>{html.escape(self.path.name)}</b> ({kind}" + (
            f", {html.escape(str(state))})" if state else ")"
        )
        return (
            f"<div class='rankscope-run'><div>{head}: {counts}</div>"
            f"{shown.to_html(index=False, na_rep='')}{more}"
            f"<p style='color:#555'>tables: {', '.join(self.TABLES)}</p></div>"
        )

    def table(self, name: str) -> pd.DataFrame:
        """The table ``name`` (one of :attr:`TABLES`); loaded once, then served from memory."""
        if name not in self.TABLES:
            raise ValueError(f"unknown table {name!r}; known: {', '.join(self.TABLES)}")
        if name == "problems":
            # Every reader reports what it could not read; the frames pass reads the dumps the
            # entries pass reported already.
            for other in self.TABLES:
                if other not in ("problems", "fr_frames"):
                    self.table(other)
            return self._problems.frame()
        if name not in self._cache:
            loader, produces = self._loaders()[name]
            try:
                result = loader()
            except Exception as exc:
                self._problems.add(".", name, f"could not build the table: {exc!r}")
                result = {t: schema.empty(t) for t in produces}
            self._cache.update(result)
        return self._cache[name]

    def reload(self) -> Run:
        """Forget every loaded table and look at the files again (a live job writes more)."""
        self.__init__(self.path, workers=self.workers)  # type: ignore[misc]
        return self

    def _loaders(self) -> dict[str, tuple[Callable[[], dict[str, pd.DataFrame]], tuple[str, ...]]]:
        inv, problems = self.inventory, self._problems

        def events() -> dict[str, pd.DataFrame]:
            tables = parse_events(inv.events, rings=inv.rings, problems=problems)
            return tables._asdict()

        def logs() -> dict[str, pd.DataFrame]:
            return {
                "logs": read_logs(
                    inv.logs, local_ranks=inv.local_ranks, year=_year(self.info), problems=problems
                )
            }

        def nccl() -> dict[str, pd.DataFrame]:
            tables = load_nccl(inv.nccl, pid_ranks=inv.pid_ranks, problems=problems)
            return {"nccl": tables.lines, "nccl_comms": tables.comms}

        def fr() -> dict[str, pd.DataFrame]:
            tables = load_flight_recorder(
                inv.flight_recorder, problems=problems, workers=self.workers
            )
            keep = latest_dumps(tables.entries, tables.pg_status)
            return {
                "flight_recorder": _only(tables.entries, keep),
                "pg_status": _only(tables.pg_status, keep),
            }

        def frames() -> dict[str, pd.DataFrame]:
            kept = self._kept_dumps()
            dumps = [s for s in inv.flight_recorder if s.name in kept]
            # The dumps' problems were reported by the entries pass already.
            return {"fr_frames": read_fr_frames(dumps, problems=Problems(), workers=self.workers)}

        def stacks() -> dict[str, pd.DataFrame]:
            return {"stacks": read_stacks(inv.stacks, problems=problems)}

        def values() -> dict[str, pd.DataFrame]:
            return {"values": read_values(inv.values, problems=problems)}

        def summary() -> dict[str, pd.DataFrame]:
            return {"stack_summary": summarize_stacks(self.table("stacks"))}

        def errors() -> dict[str, pd.DataFrame]:
            return {"errors": find_errors(self.table("logs"), nccl=self.table("nccl"))}

        def ranks() -> dict[str, pd.DataFrame]:
            ranks = _ranks_table(self.table("events"), inv, self.info, self._launcher_text())
            summary = self.table("stack_summary")
            return {"ranks": _with_ends(ranks, inv, summary, self.logs, self.info)}

        return {
            "events": (events, ("events", "collectives", "paths")),
            "collectives": (events, ("events", "collectives", "paths")),
            "paths": (events, ("events", "collectives", "paths")),
            "logs": (logs, ("logs",)),
            "nccl": (nccl, ("nccl", "nccl_comms")),
            "nccl_comms": (nccl, ("nccl", "nccl_comms")),
            "flight_recorder": (fr, ("flight_recorder", "pg_status")),
            "pg_status": (fr, ("flight_recorder", "pg_status")),
            "fr_frames": (frames, ("fr_frames",)),
            "stacks": (stacks, ("stacks",)),
            "stack_summary": (summary, ("stack_summary",)),
            "values": (values, ("values",)),
            "errors": (errors, ("errors",)),
            "ranks": (ranks, ("ranks",)),
        }

    def fr_frames_for(self, ranks: set[int]) -> pd.DataFrame:
        """The flight-recorder frames of some ranks only: their dumps are read again, not every
        rank's (a call site needs a handful of entries, not millions of frames)."""
        if "fr_frames" in self._cache:
            frames = self._cache["fr_frames"]
            return frames[frames["rank"].isin(list(ranks))]
        kept = self._kept_dumps()
        mine = [s for s in self.inventory.flight_recorder if s.rank in ranks and s.name in kept]
        return read_fr_frames(mine, problems=Problems(), workers=1)

    def _kept_dumps(self) -> set[str]:
        """The dumps whose entries and status the tables hold (:func:`latest_dumps`): the
        distinct sources, not a Python string per entry."""
        return {
            source
            for table in (self.table("pg_status"), self.flight_recorder)
            for source in table["source"].unique()
            if isinstance(source, str)
        }

    def _launcher_text(self) -> str:
        text = ""
        for source in self.inventory.logs:
            if source.stream == "launcher":
                try:
                    text += source.path.read_text(errors="replace")
                except OSError:
                    continue
        return text

    # One property per table, so that ``run.events`` reads as the table it is.
    events = property(lambda self: self.table("events"), doc="The probe's events.")
    collectives = property(lambda self: self.table("collectives"), doc="Calls, enter+exit.")
    paths = property(lambda self: self.table("paths"), doc="The calls' paths, frame by frame.")
    logs = property(lambda self: self.table("logs"), doc="Every log line.")
    nccl = property(lambda self: self.table("nccl"), doc="NCCL_DEBUG lines.")
    nccl_comms = property(lambda self: self.table("nccl_comms"), doc="NCCL communicators.")
    flight_recorder = property(lambda self: self.table("flight_recorder"), doc="FR entries.")
    fr_frames = property(lambda self: self.table("fr_frames"), doc="FR entries' frames.")
    pg_status = property(lambda self: self.table("pg_status"), doc="FR per-group status.")
    stacks = property(lambda self: self.table("stacks"), doc="Stack frames of every dump.")
    stack_summary = property(lambda self: self.table("stack_summary"), doc="Where each rank is.")
    values = property(lambda self: self.table("values"), doc="Values the conditions read.")
    errors = property(lambda self: self.table("errors"), doc="Known error signatures.")
    ranks = property(lambda self: self.table("ranks"), doc="One row per rank.")
    problems = property(lambda self: self.table("problems"), doc="Files that could not be read.")


def load_run(path: str | os.PathLike[str], *, workers: int | None = None) -> Run:
    """Open a rankscope run directory or a folder of foreign artifacts; tables load lazily.

    Nothing is read until a table is asked for, and no bad file stops the others: it becomes a
    row of ``run.problems``. ``workers`` caps the processes used for flight-recorder dumps
    (default: every core for large loads).

    Raises:
        ValueError: ``path`` does not exist or is not a directory.
    """
    root = Path(path)
    if not root.exists():
        raise ValueError(f"{root} does not exist; pass a run directory or a folder of artifacts")
    if not root.is_dir():
        raise ValueError(
            f"{root} is a file; pass the folder that holds it (load_run reads whole folders)"
        )
    return Run(root.resolve(), workers=workers)


def latest_dumps(entries: pd.DataFrame, pg_status: pd.DataFrame) -> set[str]:
    """The dumps to show: per rank and recorder (gloo, nccl), the one holding the newest entry.

    A run directory keeps a rank's last dump in both pickle and JSON, and evidence captures
    copies: all are snapshots of one ring buffer, and showing several would repeat its entries.
    Ties go to a pickle (it has the stack frames). Dumps of unknown rank are all kept; a dump
    without entries only when its rank has no other.
    """
    if entries.empty:
        return set(pg_status["source"])
    per_dump = _per_dump(entries)
    per_dump["json"] = per_dump.index.str.endswith(".json")
    per_dump = per_dump.sort_values(["newest", "json"], ascending=[False, True], na_position="last")
    known = per_dump[per_dump["rank"].notna()]
    keep = set(known.drop_duplicates(["rank", "backend"]).index)
    keep |= set(per_dump[per_dump["rank"].isna()].index)
    ranks_with_entries = set(known["rank"])
    empty = pg_status[~pg_status["source"].isin(per_dump.index)]
    keep |= set(empty.loc[~empty["rank"].isin(ranks_with_entries), "source"])
    return keep


def _per_dump(entries: pd.DataFrame) -> pd.DataFrame:
    """Per dump (``source``), in the order of their first entries: the first known rank and
    backend and the newest ``time_created_ns``. What ``groupby("source", sort=False)`` gives,
    from the codes: 32 million entries are not grouped."""
    source = entries["source"].astype("category")
    codes, n = source.array.codes, len(entries)
    count = len(source.cat.categories) + 1  # the last: entries of no source, left out
    first = first_rows(codes, count)[:-1]
    seen = np.flatnonzero(first < n)
    seen = seen[np.argsort(first[seen], kind="stable")]

    def first_known(col: pd.Series) -> pd.Series:
        rows = first[seen]
        if col.iloc[rows].isna().any():  # a dump's first entry lacks it: its first that has it
            rows = first_rows(codes, count, where=col.notna().to_numpy())[seen]
        return col.iloc[np.where(rows < n, rows, 0)].reset_index(drop=True).where(rows < n)

    created = entries["time_created_ns"].array
    times, known = created.to_numpy(dtype=np.int64, na_value=0), ~created.isna()
    newest = np.full(count, np.iinfo(np.int64).min, dtype=np.int64)
    step = 1 << 20
    for at in range(0, n, step):
        rows = np.flatnonzero(known[at : at + step]) + at
        np.maximum.at(newest, codes[rows], times[rows])
    dated = np.zeros(count, dtype=bool)
    dated[codes[known]] = True
    return pd.DataFrame(
        {
            "rank": first_known(entries["rank"]),
            "backend": first_known(entries["backend"]),
            "newest": pd.arrays.IntegerArray(newest[seen], ~dated[seen]),
        }
    ).set_axis(source.cat.categories[seen])


def _only(table: pd.DataFrame, sources: set[str]) -> pd.DataFrame:
    return table[table["source"].isin(sources)].reset_index(drop=True)


def _year(info: dict[str, Any]) -> int | None:
    created = as_float(info.get("created_at"))
    try:
        return dt.datetime.fromtimestamp(created).year if created else None
    except (OverflowError, ValueError, OSError):
        return None


# --- the ranks table ---------------------------------------------------------------------------
def _ranks_table(
    events: pd.DataFrame, inv: Inventory, info: dict[str, Any], launcher_text: str
) -> pd.DataFrame:
    """One row per rank seen in any file's name or layout, with what the events and run.json
    say about it; exit codes are the parent's (run.json, else torchrun's failure summary), else
    the probe's end event's (:func:`rankscope.state.rank_end`)."""
    seen = {
        s.rank
        for group in (inv.events, inv.rings, inv.logs, inv.nccl, inv.flight_recorder, inv.stacks)
        for s in group
        if s.rank is not None
    }
    seen |= set(inv.starts)
    recorded = info.get("ranks") if isinstance(info.get("ranks"), dict) else {}
    seen |= {r for r in map(as_int, recorded) if r is not None}
    failures = torchrun_failures(launcher_text)
    by_rank = {r: g for r, g in events.groupby("rank", sort=False)} if len(events) else {}
    # each rank's latest cell event (a cell session's ranks only), found once for every rank
    cell_rows = events[(events["ev"] == "cell").to_numpy(dtype=bool)] if len(events) else events
    latest_cell = {r: g.iloc[-1] for r, g in cell_rows.groupby("rank", sort=False)}
    ringed = {s.rank for s in inv.rings}
    rows = []
    world = as_int(info.get("world_size"))
    for rank in sorted(seen):
        record = RankRecord(rank=rank)
        record.apply(inv.starts.get(rank, {}))
        evs = by_rank.get(rank)
        ends = evs[evs["ev"] == "end"] if evs is not None else None
        last = latest_cell.get(rank)
        if last is not None:  # its latest cell event, as the tracker folds it
            record.apply(
                {
                    "ev": "cell",
                    "t": _opt(last["t_s"]),
                    "cell": _opt(last["step"]),
                    "run": _opt(last["seq"]),
                    **cell_fields(_opt(last["message"])),
                    "threads": _opt(last["done"]),
                    "ok": _opt(last["ok"]),
                }
            )
        code = (
            as_int(ends["code"].dropna().iloc[-1])
            if ends is not None and ends["code"].notna().any()
            else None
        )
        entry = recorded.get(str(rank)) if isinstance(recorded.get(str(rank)), dict) else {}
        parent = as_int(entry.get("exit_code"))
        if parent is None:
            parent = failures.get(rank)
        code = parent if parent is not None else code
        rows.append(
            {
                "rank": rank,
                "pid": record.pid,
                "host": record.host,
                "node": record.node,
                "local_rank": record.local_rank,
                "group_rank": record.group_rank,
                "world_size": record.world_size or world,
                "started_s": record.started_at,
                "ended_s": None if ends is None or not len(ends) else ends["t_s"].iloc[-1],
                "exit_code": code,
                "signal": signal_name(code),
                "end_reason": None if ends is None or not len(ends) else ends["message"].iloc[-1],
                "last_event_s": None if evs is None else evs["t_s"].max(),
                "ring": rank in ringed,
                "main_thread": record.main_thread,
                "cell": record.cell[0] if record.cell else None,
                "cell_run": record.cell[1] if record.cell else None,
                "cell_state": record.cell_state,
                "cell_s": record.cell_at,
                "cell_error": record.cell_error,
                "cell_error_site": record.cell_error_site,
            }
        )
    columns = list(schema.RANKS)
    return schema.conform("ranks", pd.DataFrame(rows, columns=columns))


def _opt(value: Any) -> Any:
    """A table's value as a plain one, None where it is null."""
    return None if pd.isna(value) else value.item() if hasattr(value, "item") else value


def _fatal_codes(ranks: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """The ranks table with the exit code of a rank that neither its launcher nor its end event
    gave one, where faulthandler's dump names the fatal signal it got: it died of that signal,
    which faulthandler raises again once its dump is written. torchrun leaves such a rank out
    of its summary when another rank failed first and it was already ending the rest."""
    fatal = {
        int(r): signal_code(reason)
        for r, reason in zip(summary["rank"], summary["reason"], strict=True)
        if not pd.isna(r) and isinstance(reason, str) and reason in FATAL_SIGNALS.values()
    }
    unknown = ranks["exit_code"].isna() & ranks["rank"].isin(list(fatal))
    if not unknown.any():
        return ranks
    codes = ranks["exit_code"].copy()
    codes[unknown] = [fatal[int(r)] for r in ranks.loc[unknown, "rank"]]
    return ranks.assign(
        exit_code=codes,
        signal=[None if pd.isna(c) else signal_name(int(c)) for c in codes.tolist()],
    )


def _with_ends(
    ranks: pd.DataFrame,
    inv: Inventory,
    summary: pd.DataFrame,
    logs: pd.DataFrame,
    info: dict[str, Any],
) -> pd.DataFrame:
    """The ranks table with how each rank ended: ``end_how`` from its end event (else the
    signal it died of), ``end_site`` from the stacks taken as it ended (the end's own stack, a
    fatal signal's dump) and the last line it printed (:func:`~rankscope.collect.logs.last_output`)."""
    if ranks.empty:
        return ranks
    ranks = _fatal_codes(ranks, summary)
    hows: dict[int, str | None] = {}
    for source in inv.events:
        end = end_event(source.path) if source.rank is not None else None
        if end is not None:
            record = RankRecord(rank=source.rank)  # type: ignore[arg-type]
            record.apply(end)
            hows[source.rank] = record.end_how  # type: ignore[index]
    rank = ranks["rank"].astype(int).tolist()
    how = [hows.get(r) for r in rank]
    how = [h if h is not None else s for h, s in zip(how, ranks["signal"].tolist(), strict=True)]
    how = [None if pd.isna(h) else str(h) for h in how]
    # Each rank's last capture whose reason is how it ended: its site is where it ended.
    sites: dict[tuple[int, str], Any] = {}
    for r, reason, site in zip(summary["rank"], summary["reason"], summary["site"], strict=True):
        if not pd.isna(r) and not pd.isna(reason) and not pd.isna(site):
            sites[(int(r), str(reason))] = site
    said = last_output(logs)
    stopped = stopping(info)
    ends = [
        rank_end(parent_code=None if pd.isna(c) else int(c), how=h, stopped=stopped)
        for c, h in zip(ranks["exit_code"].tolist(), how, strict=True)
    ]
    return schema.conform(
        "ranks",
        ranks.assign(
            status=[None if e is None else e.status for e in ends],
            end=[None if e is None else e.words for e in ends],
            end_how=how,
            end_site=[sites.get((r, h)) if h else None for r, h in zip(rank, how, strict=True)],
            last_output=[said.get(r) for r in rank],
        ),
    )
