"""Known error signatures found in the logs (their table: :mod:`rankscope.collect.signatures`).

The same exception usually reaches several files: the rank's stderr, its ``error.json``, the
launcher's tee'd copy and torchrun's failure summary. Each (rank, kind, message) is reported once,
from the best of those (the rank's own output first), with the earliest time any copy gave.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from rankscope.collect._common import Problems, SourceLike, finish
from rankscope.collect.logs import line_time, read_logs
from rankscope.collect.signatures import INT_FIELDS, KNOWN, SIGNATURES, Signature
from rankscope.rundir import torchrun_failures

_COLUMNS = ("rank", "t_s", "kind", "role", "recipe", "message", "fields", "source", "line_no")
#: Which copy of a message wins: the rank's own output, then error.json, then the launcher's.
_PRIORITY = {"stdout": 0, "stderr": 0, "log": 0, "nccl": 0, "error_file": 1, "launcher": 2}
_FINGERPRINT = re.compile(r"Rank (?P<rank>\d+) is running collective: CollectiveFingerPrint\(")
_FP_FIELDS = {
    "seq": re.compile(r"SequenceNumber=(\d+)"),
    "op_type": re.compile(r"OpType=(\w+)"),
    "shape": re.compile(r"TensorShape=(\[[^\]]*\])"),
    "dtypes": re.compile(r"TensorDtypes=([^,()]+)"),
}
_ROOT = {
    "time": re.compile(r"time\s*:\s*(\S+)"),
    "host": re.compile(r"host\s*:\s*(\S+)"),
    "rank": re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)"),
    "exitcode": re.compile(r"exitcode\s*:\s*(-?\d+)(?:\s*\(pid:\s*(\d+)\))?(?:\s*\((SIG\w+)\))?"),
    "error_file": re.compile(r"error_file\s*:\s*(\S+)"),
    "traceback": re.compile(r"traceback\s*:\s*(.*)"),
}


def find_errors(
    logs: pd.DataFrame,
    *,
    nccl: pd.DataFrame | None = None,
    signatures: Sequence[Signature] = SIGNATURES,
) -> pd.DataFrame:
    """Known error signatures in a ``logs`` table (and the WARN lines of an ``nccl`` table).

    ``role`` is what the text says of the rank that logged it (:data:`~rankscope.collect.
    signatures.ROLES`): ``mismatch``, ``peer_exit`` and ``timeout`` make it a victim of another
    rank's mismatch, exit or delay, never the culprit by that text alone.
    ``fields`` holds what each signature parses (see :mod:`rankscope.collect.signatures`): a gloo timeout's
    ``timeout_ms`` and ``operation``, the watchdog's ``seq``/``op_type``/``numel_in``/
    ``numel_out``/``timeout_ms``, both fingerprints of a DETAIL mismatch, torchrun's root-cause
    rank, exit code and signal, ... Example::

           rank  t_s               kind     role recipe                                             message                                             fields                                  source  line_no
        0     0  <NA>  collective_mismatch   report    D19  RuntimeError: Detected mismatch between colle...  {'rank_a': 0, 'op_type_a': 'ALLGATHER', 'rank...  logs/node0/x_ab/attempt_0/0/stderr.log       12
        1     1  <NA>       gloo_timeout  timeout    D19  RuntimeError: [../unbound_buffer.cc:78] Timed...  {'timeout_ms': 3000, 'operation': 'recv', ...}  logs/node0/x_ab/attempt_0/1/stderr.log        9

    Args:
        logs: the ``logs`` table (:func:`~rankscope.collect.read_logs`); never modified.
        nccl: the ``nccl`` table; its WARN lines are reported as ``nccl_warn``.
        signatures: the signatures to look for.
    """
    rows: list[dict[str, Any]] = []
    if len(logs):
        rows += _scan(logs, signatures)
    if nccl is not None and len(nccl):
        rows += _nccl_warnings(nccl, signatures)
    return _dedupe(rows)


@dataclass(frozen=True)
class Known:
    """A known error recognised in a text (:func:`recognise`): its signature, the values its
    named groups held, and the title, values and fix filled from them."""

    signature: Signature
    fields: dict[str, Any]
    title: str
    values: str
    fix: str


def recognise(text: str | None, *, signatures: Sequence[Signature] = KNOWN) -> Known | None:
    """The first known error whose text is in ``text`` (an exception's message, a log line), with
    its values; None when none is, or for no text. A value the text does not hold reads "?"."""
    if not text:
        return None
    for sig in signatures:
        if not sig.fix or sig.literal not in text:
            continue
        m = sig.regex.search(text)
        if m is None:
            continue
        fields = _fields(m)
        for pattern in sig.more:
            extra = pattern.search(text)
            if extra:
                fields.update(_fields(extra))
        names = set(sig.regex.groupindex).union(*(p.groupindex for p in sig.more))
        filled = {name: fields.get(name, "?") for name in names}
        return Known(
            signature=sig,
            fields=fields,
            title=sig.title,
            values=sig.values.format_map(filled),
            fix=sig.fix.format_map(filled),
        )
    return None


def read_errors(
    sources: Iterable[SourceLike],
    *,
    local_ranks: Mapping[tuple[int, int], int] | None = None,
    problems: Problems | None = None,
) -> pd.DataFrame:
    """:func:`find_errors` on the lines of ``sources`` (log files and error.json files)."""
    return find_errors(read_logs(sources, local_ranks=local_ranks, problems=problems))


def _scan(logs: pd.DataFrame, signatures: Sequence[Signature]) -> list[dict[str, Any]]:
    text = pa.array(logs["text"].array)
    source_codes, _ = pd.factorize(logs["source"])
    meta = {
        "rank": logs["rank"].tolist(),
        "t_s": logs["t_s"].tolist(),
        "source": logs["source"].tolist(),
        "line_no": logs["line_no"].tolist(),
        "stream": logs["stream"].astype(object).tolist(),
    }
    lines = _LazyLines(text)
    # torchrun's summary repeats every failed rank's traceback without a rank prefix: inside it,
    # only the summary itself counts.
    summaries: list[tuple[int, int]] = []
    found: list[dict[str, Any]] = []
    ordered = sorted(signatures, key=lambda s: s.parser != "child_failed")
    for sig in ordered:
        hits = pc.match_substring(text, sig.literal)
        for i in np.flatnonzero(hits.fill_null(False).to_numpy(zero_copy_only=False)):
            i = int(i)
            if any(a < i <= b for a, b in summaries):
                continue
            line = lines[i]
            m = sig.regex.search(line)
            if m is None:
                continue
            following = _following(lines, source_codes, i, sig.follow)
            fields = _fields(m)
            for pattern in sig.more:
                extra = next((x for x in map(pattern.search, following) if x), None)
                if extra:
                    fields.update(_fields(extra))
            t_s = meta["t_s"][i]
            rank = meta["rank"][i]
            if sig.parser == "child_failed":
                block_end, summary = _child_failed(following)
                summaries.append((i, i + block_end))
                if summary is None:
                    continue
                t_s = summary.pop("t_s", None) or t_s
                rank = summary.get("root_rank", rank)
                fields.update(summary)
            elif sig.parser == "fingerprints":
                fields.update(_fingerprints(line))
            found.append(
                {
                    "rank": rank,
                    "t_s": t_s,
                    "kind": sig.kind,
                    "role": sig.role,
                    "recipe": sig.recipe,
                    "message": line.strip(),
                    "fields": fields,
                    "source": meta["source"][i],
                    "line_no": meta["line_no"][i],
                    "_priority": _PRIORITY.get(meta["stream"][i], 0),
                }
            )
    return found


class _LazyLines:
    """Python strings of a text column, made only for the rows a signature looks at."""

    def __init__(self, text: pa.Array):
        self.text = text
        self.cache: dict[int, str] = {}

    def __getitem__(self, i: int) -> str:
        if i not in self.cache:
            self.cache[i] = self.text[i].as_py() or ""
        return self.cache[i]


def _following(lines: _LazyLines, source: np.ndarray, i: int, count: int) -> list[str]:
    out = []
    for j in range(i + 1, min(i + 1 + count, len(source))):
        if source[j] != source[i]:
            break
        out.append(lines[j])
    return out


def _fields(m: re.Match[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in m.groupdict().items():
        if value is None:
            continue
        if key in INT_FIELDS:
            out[key] = int(value)
        elif key == "failed_ranks":
            out[key] = [int(v) for v in value.split(",")]
        elif key == "parameter_indices":
            out[key] = [int(v) for v in value.split()]
        else:
            out[key] = value.strip()
    return out


def _fingerprints(line: str) -> dict[str, Any]:
    """Both sides of a DETAIL mismatch: rank, sequence number, op, shape and dtypes of each."""
    out: dict[str, Any] = {}
    for side, m in zip("ab", _FINGERPRINT.finditer(line), strict=False):
        inner = _balanced(line, m.end())
        out[f"rank_{side}"] = int(m["rank"])
        for key, pattern in _FP_FIELDS.items():
            found = pattern.search(inner)
            if found:
                value = found.group(1).strip()
                out[f"{key}_{side}"] = int(value) if key == "seq" else value
    differ = line.partition("differ in the following aspects:")[2]
    if differ:
        out["differences"] = [p.strip() for p in re.split(r"\t|\s{2,}", differ) if p.strip()]
    return out


def _balanced(text: str, start: int) -> str:
    """The text from ``start`` to the parenthesis that closes the one just before it."""
    depth = 1
    for j in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[j], 0)
        if depth == 0:
            return text[start:j]
    return text[start:]


def _child_failed(following: list[str]) -> tuple[int, dict[str, Any] | None]:
    """(lines the summary spans after the header, the parsed root cause and failures)."""
    end = len(following)
    root_at = None
    for j, line in enumerate(following):
        if "Root Cause" in line:
            root_at = j
        elif root_at is not None and line.strip() and set(line.strip()) == {"="}:
            end = j + 1
            break
    if root_at is None:
        return end, None
    block = "\n".join(following[:end])
    root = "\n".join(following[root_at:end])
    out: dict[str, Any] = {"failures": torchrun_failures(block)}
    for key, pattern in _ROOT.items():
        m = pattern.search(root)
        if not m:
            continue
        if key == "rank":
            out["root_rank"], out["local_rank"] = int(m.group(1)), int(m.group(2))
        elif key == "exitcode":
            code = int(m.group(1))
            out["exit_code"] = code
            if m.group(2):
                out["pid"] = int(m.group(2))
            if code < 0:
                out["signal"] = -code
            if m.group(3):
                out["signal_name"] = m.group(3)
        else:
            out[key] = m.group(1).strip()
    if "time" in out:
        out["t_s"] = line_time(f"time : {out['time']}", 0)
    return end, out


def _nccl_warnings(nccl: pd.DataFrame, signatures: Sequence[Signature]) -> list[dict[str, Any]]:
    sig = next((s for s in signatures if s.kind == "nccl_warn"), None)
    if sig is None:
        return []
    warn = nccl[nccl["level"] == "WARN"]
    records = warn.astype(object).where(warn.notna(), None).to_dict("records")
    return [
        {
            "rank": r["rank"],
            "t_s": r["t_s"],
            "kind": sig.kind,
            "role": sig.role,
            "recipe": sig.recipe,
            "message": r["message"],
            "fields": {
                k: v
                for k, v in (("file", r["file"]), ("line", r["line"]), ("warning", r["message"]))
                if v is not None
            },
            "source": r["source"],
            "line_no": r["line_no"],
            "_priority": _PRIORITY["nccl"],
        }
        for r in records
    ]


def _dedupe(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per event: copies of it (same rank, kind and parsed fields) in other files, or
    logged and then raised, are dropped in favour of the best source's first line."""
    if not rows:
        return finish("errors", {c: [] for c in _COLUMNS})
    df = pd.DataFrame(rows)
    df["_event"] = [json.dumps(f, sort_keys=True, default=str) for f in df["fields"]]
    df = df.sort_values(["_priority", "source", "line_no"], kind="stable", ignore_index=True)
    groups = df.groupby([df["rank"].astype("Int64"), df["kind"], df["_event"]], dropna=False)
    df["t_s"] = groups["t_s"].transform("min")
    df = df[~df.duplicated(subset=["rank", "kind", "_event"])]
    df = df.sort_values(["rank", "t_s", "source", "line_no"], kind="stable", na_position="last")
    return finish("errors", {c: df[c].tolist() for c in _COLUMNS})
