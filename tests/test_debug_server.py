"""`rankscope attach`: a live job that rankscope did not start, read through torch's debug server.

The slow tests start a real 2-rank gloo job under plain torchrun (no probe) that starts
``torch.distributed.debug.start_debug_server`` and hangs: rank 1 sleeps while rank 0 waits in an
all_reduce. The fast ones use a fake server in a thread: the errors a user meets, and answers
that must not be trusted.
"""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import pickle
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from rankscope.analyze import diagnose
from rankscope.cli import main
from rankscope.collect import Problems, debug_server
from rankscope.collect.debug_server import DebugServerError, fetch_debug_server
from rankscope.collect.discover import discover

from .conftest import SCRIPTS, processes_with, site_of

pytestmark = pytest.mark.timeout(120)
SCRIPT = SCRIPTS / "debug_server" / "hang.py"
#: Set in the job's environment: what finds its processes, wherever they were reparented.
MARK = "RANKSCOPE_TEST_DEBUG_SERVER"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_url() -> str:
    """A URL nobody answers: a port just released."""
    return f"http://127.0.0.1:{free_port()}"


# --- fast: errors and untrusted answers, against a server in a thread ---------------------------
Route = tuple[int, bytes]


@pytest.fixture
def fake_server() -> Iterator[Callable[[dict[str, Route], dict[str, Route]], str]]:
    """``fake_server(get_routes, post_routes)`` serves fixed answers on 127.0.0.1; its URL.
    A path without a route gets ``send_error(404)``; a route with status 500 is sent as torch's
    frontend sends an exception (``send_error``, which escapes the message)."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(get: dict[str, Route], post: dict[str, Route]) -> str:
        class Handler(http.server.BaseHTTPRequestHandler):
            def answer(self, routes: dict[str, Route]) -> None:
                status, body = routes.get(self.path, (404, b"not found"))
                if status == 500:
                    self.send_error(500, body.decode())
                    return
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self.answer(get)

            def do_POST(self) -> None:
                self.answer(post)

            def log_message(self, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


FRONT_PAGE = b"<nav><h1>Torch Distributed Debug Server</h1></nav>"
NCCL = "dump_nccl_trace_pickle"
STACKS = b'Thread 0x00007f (most recent call first):\n  File "/job/train.py", line 9 in <module>\n'


def test_a_url_nobody_answers_says_how_to_start_the_debug_server(tmp_path, monkeypatch, capsys):
    url = closed_url()
    with pytest.raises(DebugServerError, match="nothing answers at") as err:
        fetch_debug_server(url, tmp_path / "out", timeout_s=2)
    assert "start_debug_server(port=PORT)" in str(err.value)
    assert not (tmp_path / "out").exists()

    monkeypatch.chdir(tmp_path)
    assert main(["attach", url, "--timeout", "2"]) == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith("rankscope attach: error: nothing answers at")
    assert "start_debug_server" in stderr
    assert not list((tmp_path / "runs").glob("*-attach-*")), "a failed attach leaves no folder"


def test_a_server_that_is_not_the_frontend_is_named_for_what_it_is(tmp_path, fake_server):
    other = fake_server({"/": (200, b"<h1>hello</h1>")}, {})
    with pytest.raises(DebugServerError, match="is not torch's debug server frontend"):
        fetch_debug_server(other, tmp_path / "a", timeout_s=2)
    worker = fake_server({"/": (200, b"<h1>torch.distributed.WorkerServer</h1>")}, {})
    with pytest.raises(DebugServerError, match="one rank's worker server"):
        fetch_debug_server(worker, tmp_path / "b", timeout_s=2)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "old.txt").write_text("x")
    with pytest.raises(DebugServerError, match="not an empty folder"):
        fetch_debug_server(other, tmp_path / "c", timeout_s=2)


def test_a_frontend_without_its_dependencies_says_what_to_install(tmp_path, fake_server):
    missing = "Exception: ModuleNotFoundError(\"No module named 'requests'\")"
    url = fake_server(
        {"/": (200, FRONT_PAGE), "/tcpstore": (500, b"boom"), "/stacks": (500, missing.encode())},
        {},
    )
    with pytest.raises(DebugServerError, match="lacks requests; install it there"):
        fetch_debug_server(url, tmp_path / "out", timeout_s=2)


def test_answers_are_checked_and_unreachable_workers_read_through_the_frontend(
    tmp_path, fake_server
):
    """Rank 0's worker answers: its stacks and NCCL pickle are kept, its other pickle (which
    names os.system) is refused unread. Rank 1's worker is out of reach: the frontend's pages
    give its evidence. Discovery takes every file kept for what it is."""
    dump = {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": []}
    worker = fake_server(
        {"/handler/": (200, json.dumps(["fr_trace", "dump_traceback", NCCL]).encode())},
        {
            "/handler/fr_trace": (200, pickle.dumps(os.system)),
            "/handler/dump_traceback": (200, STACKS),
            f"/handler/{NCCL}": (200, pickle.dumps(dump)),
        },
    )
    store = f"debug_server/rank0: b'{worker}'\ndebug_server/rank1: b'{closed_url()}'"
    section = "<h2>Rank {}: http://x/handler/h?</h2>\n{}"
    url = fake_server(
        {
            "/": (200, FRONT_PAGE),
            "/tcpstore": (200, f"<pre>\n{store}\n</pre>".encode()),
            "/stacks": (200, section.format(1, f"<pre>{STACKS.decode()}</pre>").encode()),
            "/fr_trace_json": (
                200,
                (
                    section.format(0, "<p>Failed to fetch: status=408</p>\n<pre>Timeout</pre>")
                    + section.format(1, f"<pre>{json.dumps(dump, indent=2)}</pre>")
                ).encode(),
            ),
        },
        {},
    )
    out = fetch_debug_server(url, tmp_path / "out", timeout_s=2)
    manifest = json.loads((out / "manifest.json").read_text())
    rank0, rank1 = manifest["ranks"]["0"], manifest["ranks"]["1"]
    assert rank0["files"] == {
        "nccl_trace": {"file": "nccl_trace_rank0.pkl", "via": f"{worker}/handler/{NCCL}"},
        "stacks": {"file": "stacks_rank0.txt", "via": f"{worker}/handler/dump_traceback"},
    }
    assert any("refused: the pickle asks for" in e for e in rank0["errors"])
    assert any("HTTP 408: Timeout" in e for e in rank0["errors"])
    assert rank1["files"]["stacks"]["via"] == f"{url}/stacks"
    assert rank1["files"]["fr_trace"] == {
        "file": "fr_trace_rank1.json",
        "via": f"{url}/fr_trace_json",
    }
    assert manifest["missing"] == {"stacks": [], "flight_recorder": []}
    text = (out / "stacks_rank0.txt").read_text()
    assert text.startswith("# rankscope capture id=1 t=") and text.endswith(STACKS.decode())

    problems = Problems()
    inv = discover(out, False, {}, problems)
    assert sorted((s.name, s.rank) for s in inv.flight_recorder) == [
        ("fr_trace_rank1.json", 1),
        ("nccl_trace_rank0.pkl", 0),
    ]
    assert sorted((s.name, s.rank) for s in inv.stacks) == [
        ("stacks_rank0.txt", 0),
        ("stacks_rank1.txt", 1),
    ]
    assert not problems.rows, problems.rows


# --- slow: a real job under torchrun ------------------------------------------------------------
def _debug_server_unavailable() -> str | None:
    try:
        from torch.distributed.debug import start_debug_server  # noqa: F401
    except ImportError as exc:
        import torch

        return (
            f"torch {torch.__version__} has no torch.distributed.debug.start_debug_server ({exc})"
        )
    for module in ("jinja2", "tabulate"):
        if importlib.util.find_spec(module) is None:
            return f"torch's debug server needs {module}: pip install aiohttp jinja2 tabulate"
    if importlib.util.find_spec("aiohttp") is None and importlib.util.find_spec("requests") is None:
        return "torch's debug server needs aiohttp or requests: pip install aiohttp"
    return None


#: Why the live tests cannot run here, or None.
UNAVAILABLE = _debug_server_unavailable()
needs_debug_server = pytest.mark.skipif(UNAVAILABLE is not None, reason=UNAVAILABLE or "")


def _marked(token: str) -> list[psutil.Process]:
    return processes_with(MARK, lambda value: value == token)


class HungJob:
    """The job of ``scripts/debug_server/hang.py``, once rank 0 waits in its all_reduce."""

    def __init__(self, folder: Path):
        self.token = secrets.token_hex(8)
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = folder / "job.log"
        ready = folder / "rank1.ready"
        env = {
            **os.environ,
            MARK: self.token,
            "DEBUG_SERVER_PORT": self.url.rsplit(":", 1)[1],
            "READY_FILE": str(ready),
            "TORCH_FR_BUFFER_SIZE": "2000",
        }
        env.pop("RANKSCOPE_RUN_DIR", None)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                # --standalone: a free rendezvous port, not 29500, which another job may hold
                [*TORCHRUN, "--standalone", "--nproc-per-node", "2", str(SCRIPT)],
                env=env,
                cwd=folder,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while not (ready.exists() and " in all_reduce" in self._page("/stacks")):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the job did not hang as planned:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.5)

    def _page(self, path: str) -> str:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as resp:
                return resp.read().decode()
        except OSError:
            return ""

    def stop(self) -> list[psutil.Process]:
        """SIGTERM to the job's session, SIGKILL after 10 s; the processes still there after."""
        for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                self.proc.poll()
                if self.proc.returncode is not None and not _marked(self.token):
                    return []
                time.sleep(0.2)
        self.proc.wait(timeout=5)
        left = _marked(self.token)
        for proc in left:
            proc.kill()
        return left


@pytest.fixture(scope="module")
def hung_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HungJob]:
    job = HungJob(tmp_path_factory.mktemp("hung_job"))
    try:
        yield job
    finally:
        job.stop()


def _culprit_line() -> str:
    return site_of("debug_server/hang.py", "sleep")  # hang.py:<line>


@pytest.mark.slow
@needs_debug_server
def test_attach_fetches_every_rank_and_names_the_sleeper(hung_job, tmp_path):
    out = fetch_debug_server(hung_job.url, tmp_path / "attach", timeout_s=10)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["missing"] == {"stacks": [], "flight_recorder": []}
    for rank in ("0", "1"):
        files = manifest["ranks"][rank]["files"]
        assert set(files) == {"stacks", "fr_trace"}, manifest["ranks"][rank]
        assert "/handler/" in files["stacks"]["via"], "read from the rank's own worker"

    stacks = {r: (out / f"stacks_rank{r}.txt").read_text() for r in (0, 1)}
    assert " in all_reduce" in stacks[0] and "hang.py" in stacks[0]
    file, line = _culprit_line().split(":")
    assert f'{file}", line {line} in <module>' in stacks[1]
    dumps = {r: json.loads((out / f"fr_trace_rank{r}.json").read_text()) for r in (0, 1)}
    ops = {r: [e["profiling_name"] for e in d["entries"]] for r, d in dumps.items()}
    assert ops == {0: ["gloo:all_reduce"] * 4, 1: ["gloo:all_reduce"] * 3}

    diagnosis = diagnose(out)
    assert diagnosis.verdict == "hang", diagnosis.render()
    assert diagnosis.culprit_ranks == [1], diagnosis.render()
    assert diagnosis.waiting_ranks == [0], diagnosis.render()
    assert _culprit_line() in diagnosis.summary


@pytest.mark.slow
@needs_debug_server
def test_workers_out_of_reach_are_read_through_the_frontend(hung_job, tmp_path, monkeypatch):
    """The workers register ``http://<hostname>:<port>``, which may not resolve where the user
    attaches from; the frontend's pages hold the same answers."""
    unreachable = closed_url()
    monkeypatch.setattr(debug_server, "_worker_url", lambda addr: unreachable)
    out = fetch_debug_server(hung_job.url, tmp_path / "attach", timeout_s=10)
    manifest = json.loads((out / "manifest.json").read_text())
    for rank in ("0", "1"):
        files = manifest["ranks"][rank]["files"]
        assert files["stacks"]["via"] == f"{hung_job.url}/stacks"
        assert files["fr_trace"]["via"] == f"{hung_job.url}/fr_trace_json"
        assert any("ConnectionRefusedError" in e for e in manifest["ranks"][rank]["errors"])
    diagnosis = diagnose(out)
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == ("hang", [1]), diagnosis.render()


@pytest.mark.slow
@needs_debug_server
def test_cli_attach_prints_the_diagnosis_and_keeps_the_evidence(
    hung_job, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "evidence"
    assert main(["attach", hung_job.url, "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert "HANG: a rank is stuck outside the collectives" in captured.out
    assert "culprit ranks: 1; waiting ranks: 0" in captured.out
    assert captured.err.startswith("rankscope attach: 2 ranks -> ")
    assert json.loads((out / "diagnosis.json").read_text())["culprit_ranks"] == [1]

    monkeypatch.chdir(tmp_path)
    assert main(["attach", hung_job.url.removeprefix("http://"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["culprit_ranks"] == [1]
    (folder,) = (tmp_path / "runs").glob("*-attach-*")
    assert (folder / "stacks_rank1.txt").is_file()


@pytest.mark.slow
@needs_debug_server
def test_the_workbench_attaches_to_the_debug_server(hung_job, tmp_path):
    from rankscope.widgets import Workbench

    wb = Workbench(runs_root=tmp_path / "runs", attach=False)
    try:
        with pytest.raises(ValueError, match="enter a run directory or the URL"):
            wb.attach_any("")
        wb.attach_to.value = hung_job.url
        wb.attach_button.click()
        deadline = time.monotonic() + 60
        while wb.results.diagnosis is None:
            assert time.monotonic() < deadline, wb.attach_errors.outputs
            time.sleep(0.1)
        d = wb.results.diagnosis
        assert (d.verdict, d.culprit_ranks) == ("hang", [1]), d.render()
        assert wb.results.card.value == d.to_html()  # the card shows it
        (folder,) = (tmp_path / "runs").glob("*-attach-*")
        assert (folder / "stacks_rank0.txt").is_file()
    finally:
        wb.close()


@pytest.mark.slow
@needs_debug_server
def test_a_worker_url_is_refused_with_the_frontend_to_use(hung_job, tmp_path):
    out = fetch_debug_server(hung_job.url, tmp_path / "attach", timeout_s=10)
    worker = json.loads((out / "manifest.json").read_text())["ranks"]["1"]["worker"]
    port = worker.rsplit(":", 1)[1]
    with pytest.raises(DebugServerError, match="one rank's worker server"):
        fetch_debug_server(f"http://127.0.0.1:{port}", tmp_path / "worker", timeout_s=10)


@pytest.mark.slow
@needs_debug_server
def test_stopping_the_job_leaves_no_process(hung_job):
    assert hung_job.stop() == [], "processes outlived the job's SIGTERM and SIGKILL"
    assert _marked(hung_job.token) == []
    with pytest.raises(DebugServerError, match="nothing answers"):
        fetch_debug_server(hung_job.url, hung_job.log.parent / "after", timeout_s=2)
