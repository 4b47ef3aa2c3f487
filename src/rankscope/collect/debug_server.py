"""Evidence from a live job through torch's own debug server, for a job rankscope did not start.

``torch.distributed.debug.start_debug_server()`` starts, in every rank, a C++ worker server
(``/handler/<name>``, answered on a C++ thread, so it answers while the rank's Python waits in a
collective) and, on rank 0, an HTTP frontend that fans requests out to the workers and renders
HTML. :func:`fetch_debug_server` takes the frontend's URL, finds every rank's worker there (the
frontend's ``/tcpstore`` page lists the ``debug_server/rank<r>`` keys each worker registered,
without asking any worker), asks each worker directly for its flight-recorder dump and its
Python stacks, and writes them as files that the foreign-artifact discovery already reads::

    <dest>/
      stacks_rank<r>.txt        faulthandler text of every thread (``dump_traceback``), after a
                                ``# rankscope capture`` marker carrying the time it was fetched
      fr_trace_rank<r>.pkl      torch's flight recorder, pickle where the worker offers one,
      fr_trace_rank<r>.json     else JSON (``fr_trace_json``)
      nccl_trace_rank<r>.pkl    the NCCL flight recorder, on builds with NCCL (or ``.json``)
      manifest.json             where each file came from, and what failed and why

A worker the attaching machine cannot reach (its host name, from ``socket.gethostname()`` on the
rank, may not resolve here) is read through the frontend's ``/stacks`` and ``/fr_trace_json``
pages instead, which hold every rank's answer as the frontend fetched it.

Everything received is untrusted: every answer is capped in size and time, JSON is parsed and
pickles are unpickled with :mod:`rankscope.collect.safe_pickle` only to check that they are
dumps before they are written, and nothing received is ever run. Only the standard library is
used, so attaching needs nothing that the job's debug server needs.
"""

from __future__ import annotations

import html
import http.client
import json
import pickle
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankscope.collect import safe_pickle
from rankscope.rundir import atomic_write_bytes, atomic_write_json

#: Seconds to wait for each answer. A worker answers at once unless its rank holds the GIL (the
#: stacks handler needs it); the frontend's own pages wait up to its ``fetch_timeout`` per rank.
DEFAULT_TIMEOUT_S = 10.0
#: The most bytes read from one answer: a flight-recorder dump of 2000 entries with stack
#: frames is a few MB; anything far larger is not a dump.
MAX_BYTES = 256 << 20
#: What to tell a user whose URL is not a working debug server.
HOW_TO_START = (
    "Every rank must call torch.distributed.debug.start_debug_server(port=PORT) after "
    "init_process_group, and URL is http://<rank 0's host>:PORT; rank 0's environment needs "
    "jinja2, tabulate, and aiohttp or requests (without them start_debug_server raises "
    "ImportError in rank 0's output)"
)

_FRONTEND_TITLE = b"Torch Distributed Debug Server"
_WORKER_TITLE = b"torch.distributed.WorkerServer"
_STORE_KEY = re.compile(r"debug_server/rank(\d{1,7}): b'(https?://[^'\s<>]{1,300})'")
_RANK_SECTION = re.compile(
    r"<h2>Rank (\d{1,7}): ([^<]*)</h2>\s*(?:<p>Failed to fetch: status=(\d+)</p>\s*)?"
    r"<pre>(.*?)</pre>",
    re.S,
)
_HTML_PAGE = re.compile(r"\s*<(?:!doctype html|html)", re.I)
_TAG = re.compile(r"<[^<>]*>")
_MISSING_MODULE = re.compile(r"No module named '?([\w.]+)")
#: Flight-recorder handlers by recorder, best first: a pickle keeps what torch's own tools read.
_FR_HANDLERS = {
    "fr_trace": (("fr_trace", ".pkl"), ("fr_trace_json", ".json")),
    "nccl_trace": (("dump_nccl_trace_pickle", ".pkl"), ("dump_nccl_trace_json", ".json")),
}
_STACKS = "dump_traceback"


class DebugServerError(ValueError):
    """The URL gives nothing to diagnose: no answer, not a torch debug server, or no rank's
    evidence could be fetched. The message says what to do."""


class _NoAnswer(Exception):
    """No HTTP answer at all: refused, unresolvable, timed out, or too large."""


@dataclass
class _Rank:
    """What one rank gave, for the manifest."""

    worker: str | None
    handlers: list[str] | None = None
    files: dict[str, dict[str, str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def fetch_debug_server(
    url: str, dest_dir: str | Path, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Path:
    """Fetch every rank's stacks and flight-recorder dump from the debug server at ``url``.

    ``url`` is the frontend's, ``http://<rank 0's host>:<port given to start_debug_server>``.
    ``dest_dir`` must be new or empty (files of another moment would mix with these); it is
    returned, ready for :func:`rankscope.analyze.diagnose`.

    Raises:
        DebugServerError: nothing answers at ``url``, it is not a torch debug server, or no rank
            gave any evidence.
    """
    base = _base_url(url)
    dest = Path(dest_dir)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise DebugServerError(f"{dest} is not an empty folder; choose a new one")
    started = time.time()
    _check_frontend(base, timeout_s)
    front = _Frontend(base, timeout_s)
    workers, store_error = _workers(front)
    dest.mkdir(parents=True, exist_ok=True)
    ranks = {r: _Rank(worker=w) for r, w in workers.items()}
    if ranks:
        with ThreadPoolExecutor(max_workers=min(32, len(ranks))) as pool:
            list(pool.map(lambda r: _fetch_rank(r, ranks[r], dest, timeout_s), sorted(ranks)))
    _from_frontend(front, ranks, dest)
    manifest = {
        "url": base,
        "source": "torch.distributed.debug",
        "fetched_at": started,
        "duration_s": round(time.time() - started, 3),
        "workers_from": "/tcpstore" if store_error is None else "/stacks",
        "ranks": {
            str(r): {
                "worker": v.worker,
                "handlers": v.handlers,
                "files": v.files,
                "errors": v.errors,
            }
            for r, v in sorted(ranks.items())
        },
        "missing": {
            "stacks": sorted(r for r, v in ranks.items() if "stacks" not in v.files),
            "flight_recorder": sorted(
                r for r, v in ranks.items() if not {"fr_trace", "nccl_trace"} & set(v.files)
            ),
        },
    }
    if store_error is not None:
        manifest["errors"] = [f"/tcpstore: {store_error}"]
    atomic_write_json(dest / "manifest.json", manifest)
    if not any(v.files for v in ranks.values()):
        raise DebugServerError(_nothing_fetched(base, ranks, store_error))
    return dest


# --- HTTP -----------------------------------------------------------------------------------
#: No proxies: a debug server is on the job's own network, where a proxy set for the internet
#: would only be in the way.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http(url: str, timeout_s: float, *, post: bool = False) -> tuple[int, bytes]:
    """Status and body of one request; an HTTP error status is an answer too. The workers
    answer only POST on ``/handler/<name>`` (as the frontend asks them)."""
    request = urllib.request.Request(
        url, data=b"" if post else None, method="POST" if post else "GET"
    )
    request.add_header("User-Agent", "rankscope-attach")
    deadline = time.monotonic() + timeout_s
    try:
        with _OPENER.open(request, timeout=timeout_s) as resp:
            return resp.status, _read_capped(resp, deadline)
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, _read_capped(exc, deadline)
        except _NoAnswer:
            return exc.code, b""
        finally:
            exc.close()
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise _NoAnswer(
            f"{type(reason).__name__}: {reason}" if str(reason) else repr(reason)
        ) from None


def _read_capped(resp: Any, deadline: float) -> bytes:
    chunks, size = [], 0
    while chunk := resp.read(1 << 20):
        size += len(chunk)
        if size > MAX_BYTES:
            raise _NoAnswer(f"answer larger than {MAX_BYTES >> 20} MiB")
        if time.monotonic() > deadline:
            raise _NoAnswer("answer not complete within the timeout")
        chunks.append(chunk)
    return b"".join(chunks)


def _base_url(url: str) -> str:
    text = url.strip()
    if "://" not in text:
        text = f"http://{text}"
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DebugServerError(f"{url!r} is not an http URL. {HOW_TO_START}")
    try:
        parts.port  # noqa: B018 (raises on a port that is not a number)
    except ValueError as exc:
        raise DebugServerError(f"{url!r}: {exc}") from None
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


# --- the frontend ---------------------------------------------------------------------------
def _check_frontend(base: str, timeout_s: float) -> None:
    try:
        status, body = _http(f"{base}/", timeout_s)
    except _NoAnswer as exc:
        raise DebugServerError(
            f"nothing answers at {base} ({exc}): is the job running, with torch's debug "
            f"server? {HOW_TO_START}"
        ) from None
    if _WORKER_TITLE in body:
        raise DebugServerError(
            f"{base} is one rank's worker server, not the frontend; pass rank 0's frontend "
            "instead: the port given to start_debug_server(port=...), 25999 by default"
        )
    if status != 200 or _FRONTEND_TITLE not in body:
        raise DebugServerError(
            f"{base} answers (HTTP {status}) but is not torch's debug server frontend. "
            f"{HOW_TO_START}"
        )


def _workers(front: _Frontend) -> tuple[dict[int, str | None], str | None]:
    """Rank -> its worker's URL, from the store keys the frontend lists (asking no worker);
    else from the ``/stacks`` page's headings, which name every rank's worker too."""
    try:
        status, body = _http(f"{front.base}/tcpstore", front.timeout_s)
        error = None if status == 200 else f"HTTP {status}: {_snippet(body)}"
    except _NoAnswer as exc:
        body, error = b"", str(exc)
    workers: dict[int, str | None] = {}
    for m in _STORE_KEY.finditer(body.decode("utf-8", "replace")):
        workers[int(m[1])] = _worker_url(m[2])
    if workers:
        return workers, None
    sections, page_error = front.sections("/stacks")
    for rank, addr, _, _ in sections:
        workers[rank] = _worker_url(addr)
    error = error or "no debug_server/rank<r> keys listed"
    return workers, error if page_error is None else f"{error}; {page_error}"


def _worker_url(addr: str) -> str | None:
    parts = urllib.parse.urlsplit(addr.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return f"{parts.scheme}://{parts.netloc}"


#: A rank's part of a frontend page: rank, worker address, HTTP status if it failed, its text.
_Section = tuple[int, str, int | None, str]


@dataclass
class _Frontend:
    """Rank 0's frontend, whose pages hold every rank's answer as the frontend fetched it."""

    base: str
    timeout_s: float
    _pages: dict[str, tuple[list[_Section], str | None]] = field(default_factory=dict)

    def sections(self, page: str) -> tuple[list[_Section], str | None]:
        """Each rank's ``<pre>`` of a page (torch's templates do not escape it; unescaping is
        harmless), and why the page itself failed. Each page is fetched once."""
        if page not in self._pages:
            self._pages[page] = self._fetch(page)
        return self._pages[page]

    def _fetch(self, page: str) -> tuple[list[_Section], str | None]:
        try:
            status, body = _http(f"{self.base}{page}", self.timeout_s)
        except _NoAnswer as exc:
            return [], f"{self.base}{page}: {exc}"
        if status != 200:
            return [], f"{self.base}{page}: HTTP {status}: {_snippet(body)}"
        found = [
            (int(m[1]), html.unescape(m[2]), int(m[3]) if m[3] else None, html.unescape(m[4]))
            for m in _RANK_SECTION.finditer(body.decode("utf-8", "replace"))
        ]
        return found, None if found else f"{self.base}{page}: no rank's answer on the page"


def _from_frontend(front: _Frontend, ranks: dict[int, _Rank], dest: Path) -> None:
    """Stacks and flight recorders, through the frontend, of ranks whose worker gave none.

    The NCCL recorder's page is asked only for ranks that may have one (their worker did not
    say, or listed an NCCL handler), and a rank without it (404: a build without NCCL) is no
    error. That page holds only the collectives still in flight (torch asks with onlyactive).
    """
    for what, page in _PAGES:
        need = [r for r, v in ranks.items() if what not in v.files and _may_have(v, what)]
        if not need:
            continue
        sections, error = front.sections(page)
        got = {rank: (status, text) for rank, _, status, text in sections}
        via = f"{front.base}{page}"
        for rank in need:
            state = ranks[rank]
            status, text = got.get(rank, (None, None))
            if text is None:
                state.errors.append(error or f"{via}: rank {rank} is not on the page")
            elif status is not None:
                if not (what == "nccl_trace" and status == 404):
                    state.errors.append(f"{via}: HTTP {status}: {_snippet(text.encode())}")
            elif what == "stacks":
                _keep_stacks(state, rank, text.encode(), via, dest)
            else:
                _keep_dump(state, rank, what, ".json", text.encode(), via, dest)


#: The frontend's pages that hold each rank's answer, by the file they give.
_PAGES = (
    ("stacks", "/stacks"),
    ("fr_trace", "/fr_trace_json"),
    ("nccl_trace", "/fr_trace_nccl_json"),
)


def _may_have(state: _Rank, what: str) -> bool:
    if what != "nccl_trace" or state.handlers is None:
        return True
    return any(h in state.handlers for h, _ in _FR_HANDLERS["nccl_trace"])


# --- the workers ----------------------------------------------------------------------------
def _fetch_rank(rank: int, state: _Rank, dest: Path, timeout_s: float) -> None:
    """Ask one rank's worker for its handler names, its flight recorders, then its stacks."""
    if state.worker is None:
        state.errors.append("the worker's address is not an http URL")
        return
    try:
        status, body = _http(f"{state.worker}/handler/", timeout_s)
    except _NoAnswer as exc:
        state.errors.append(f"{state.worker}: {exc}")
        return
    names = _json(body) if status == 200 else None
    if isinstance(names, list) and all(isinstance(n, str) for n in names):
        state.handlers = names
    available = set(state.handlers or [_STACKS, "fr_trace_json"])
    for recorder, choices in _FR_HANDLERS.items():
        for handler, suffix in choices:
            if handler in available and _ask(
                state, rank, handler, dest, timeout_s, recorder, suffix
            ):
                break
    if _STACKS in available:
        _ask(state, rank, _STACKS, dest, timeout_s, "stacks", ".txt")


def _ask(
    state: _Rank, rank: int, handler: str, dest: Path, timeout_s: float, what: str, suffix: str
) -> bool:
    url = f"{state.worker}/handler/{handler}"
    try:
        status, body = _http(url, timeout_s, post=True)
    except _NoAnswer as exc:
        state.errors.append(f"{url}: {exc}")
        return False
    if status != 200:
        state.errors.append(f"{url}: HTTP {status}: {_snippet(body)}")
        return False
    if what == "stacks":
        return _keep_stacks(state, rank, body, url, dest)
    return _keep_dump(state, rank, what, suffix, body, url, dest)


# --- checks and files -----------------------------------------------------------------------
def _keep_dump(
    state: _Rank, rank: int, recorder: str, suffix: str, raw: bytes, via: str, dest: Path
) -> bool:
    """Write a flight-recorder dump if it is one: a dict with entries or process groups."""
    try:
        dump = safe_pickle.loads(raw) if suffix == ".pkl" else json.loads(raw)
    except (pickle.UnpicklingError, EOFError, ValueError, RecursionError) as exc:
        state.errors.append(f"{via}: not a flight-recorder dump: {type(exc).__name__}: {exc}")
        return False
    if not isinstance(dump, dict) or not {"entries", "pg_config", "pg_status"} & set(dump):
        state.errors.append(f"{via}: not a flight-recorder dump (no entries or pg_config)")
        return False
    name = f"{recorder}_rank{rank}{suffix}"
    atomic_write_bytes(dest / name, raw)
    state.files[recorder] = {"file": name, "via": via}
    return True


def _keep_stacks(state: _Rank, rank: int, data: bytes, via: str, dest: Path) -> bool:
    """Write faulthandler's text after a capture marker, which dates it for the analyzer."""
    text = data.decode("utf-8", "replace")
    if "(most recent call first):" not in text:
        state.errors.append(f"{via}: not a Python stack dump: {_snippet(data)}")
        return False
    name = f"stacks_rank{rank}.txt"
    marker = f"# rankscope capture id=1 t={time.time():.6f} reason=attach\n"
    atomic_write_bytes(dest / name, (marker + text).encode())
    state.files["stacks"] = {"file": name, "via": via}
    return True


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _snippet(data: bytes, limit: int = 200) -> str:
    """The start of an answer, for a message; of an HTML error page (the frontend reports an
    exception with ``send_error``), the text after ``Message:``."""
    text = data[: limit * 8].decode("utf-8", "replace")
    if _HTML_PAGE.match(text):
        text = _TAG.sub(" ", text)
        text = text[text.find("Message: ") + 9 :] if "Message: " in text else text
    text = " ".join(html.unescape(text).split())
    return text[:limit] + ("..." if len(text) > limit else "")


def _nothing_fetched(base: str, ranks: dict[int, _Rank], store_error: str | None) -> str:
    errors = [e for v in ranks.values() for e in v.errors]
    if store_error and not ranks:
        errors.insert(0, f"/tcpstore: {store_error}")
    missing = sorted({m[1] for e in errors for m in _MISSING_MODULE.finditer(e)})
    if missing:
        return (
            f"the debug server at {base} answers, but cannot reach its ranks: rank 0's "
            f"environment lacks {', '.join(missing)}; install it there (pip install aiohttp "
            "jinja2 tabulate) and restart the job"
        )
    if not ranks:
        why = "; ".join(errors) or "no rank registered a worker"
        return f"the debug server at {base} lists no rank's worker ({why}). {HOW_TO_START}"
    first = "; ".join(errors[:4]) or "no evidence in any answer"
    return f"no rank's stacks or flight recorder could be fetched from {base}: {first}"
