"""`rankscope` on the command line: real jobs, real exit codes, stable option names."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.cli import QUICKSTART, build_parser, lab_command, main

from .conftest import SCRIPTS, leftover_processes

pytestmark = pytest.mark.timeout(120)
DATA = Path(__file__).parent / "data"


def rankscope(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rankscope.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=110,
    )


def test_help_documents_every_run_option():
    text = build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    for option in (
        "--nproc-per-node",
        "--nnodes",
        "--backend",
        "--preset",
        "--stall-timeout",
        "--on-stall",
        "--timeout",
        "--run-dir",
    ):
        assert option in text


@pytest.mark.slow
def test_clean_run_exits_zero_and_names_its_run_dir(tmp_path):
    out = rankscope("run", "--quiet", str(SCRIPTS / "launch/clean.py"), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "job exited" in out.stdout and "0: 0, 1: 0" in out.stdout
    (run,) = (tmp_path / "runs").iterdir()
    assert f"run directory runs/{run.name}" in out.stdout


@pytest.mark.slow
def test_hang_is_caught_and_stopped(tmp_path):
    script = str(SCRIPTS / "launch/conditional_barrier.py")
    out = rankscope("run", "--stall-timeout", "2", "--run-dir", "hang", script, cwd=tmp_path)
    assert out.returncode == 1
    assert (
        "STALL: no progress" in out.stdout
        and "rank 0 in barrier (conditional_barrier.py:16)" in (out.stdout)
    )
    # the card of the frozen job comes with the stall, before the stop; the one after the stop
    # is not printed again when it says the same
    card = out.stdout.index("HANG: rank-conditional collective")
    assert out.stdout.index("STALL") < card < out.stdout.index("rankscope: job stopped")
    assert out.stdout.count("HANG:") == 1, out.stdout
    assert "the diagnosis after the stop is the one above" in out.stdout
    info = json.loads((tmp_path / "hang/run.json").read_text())
    assert info["state"] == "stopped" and info["stop_reason"] == "stall"
    assert not leftover_processes(tmp_path)
    again = rankscope("run", "--run-dir", "hang", script, cwd=tmp_path)
    assert again.returncode == 2 and "already holds a run" in again.stderr


@pytest.mark.slow
def test_a_kept_stall_is_diagnosed_while_the_job_is_still_frozen(tmp_path):
    script = str(SCRIPTS / "launch/conditional_barrier.py")
    args = ("run", "--quiet", "--stall-timeout", "2", "--on-stall", "keep", "--timeout", "20")
    out = rankscope(*args, script, cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    stall = out.stdout.index("STALL: no progress")
    hang = out.stdout.index("HANG: rank-conditional collective")
    ended = out.stdout.index("rankscope: job stopped")
    assert stall < hang < ended, out.stdout
    assert not leftover_processes(tmp_path)


@pytest.mark.slow
def test_failing_rank_gives_nonzero_exit(tmp_path):
    out = rankscope("run", "--quiet", str(SCRIPTS / "launch/raises.py"), cwd=tmp_path)
    assert out.returncode == 1
    assert "1: 1" in out.stdout


@pytest.mark.slow
def test_bad_input_is_a_clear_error(tmp_path):
    out = rankscope("run", "missing.py", cwd=tmp_path)
    assert out.returncode == 2 and "does not exist" in out.stderr
    out = rankscope("status", str(tmp_path), cwd=tmp_path)
    assert out.returncode == 2 and "not a rankscope run directory" in out.stderr


@pytest.mark.slow
def test_presets_are_listed(tmp_path):
    out = rankscope("presets", cwd=tmp_path)
    assert out.returncode == 0
    assert "flight_recorder (on by default)" in out.stdout
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in out.stdout


@pytest.mark.slow
def test_replay_writes_a_standalone_script(tmp_path, capsys):
    dumps = str(DATA / "nccl_fr" / "op")
    out = rankscope(
        "replay", dumps, "-o", "repro.py", "--ranks", "3", "--scale-down", "64", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "repro.py").read_text()
    compile(text, "repro.py", "exec")
    assert "import rankscope" not in text and "def role_1()" in text
    assert "Culprit: original rank 3 = replay rank 2." in out.stdout  # the header
    assert "wrote repro.py (3 ranks)" in out.stdout
    assert "torchrun --nproc-per-node 3 repro.py" in out.stdout

    assert main(["replay", dumps, "-o", "-"]) == 0
    assert capsys.readouterr().out.startswith('"""Replay of op: 4 ranks')


def test_replay_errors_are_clear(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["replay", str(DATA / "nccl_fr" / "clean")]) == 2
    err = capsys.readouterr().err
    assert "rankscope replay: error: no divergence found in clean" in err
    assert "pass the dumps of the run that froze" in err
    assert main(["replay", "nowhere"]) == 2
    assert "nowhere does not exist" in capsys.readouterr().err
    assert main(["replay", str(DATA / "nccl_fr" / "op"), "--ranks", "1"]) == 2
    assert "--ranks 1 is too few" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["replay", str(DATA / "nccl_fr" / "op"), "--scale-down", "x"])
    assert exited.value.code == 2 and "expected a whole number" in capsys.readouterr().err
    assert not (tmp_path / "repro.py").exists()


@pytest.mark.slow
def test_diagnose_says_unknown_and_fails_when_nothing_can_be_read(tmp_path):
    """Two dumps cut short: no readable evidence is not 'OK'."""
    folder = tmp_path / "dumps"
    folder.mkdir()
    (folder / "nccl_trace_rank_0").write_bytes(b"\x80\x04\x95\x10\x00\x00")
    (folder / "nccl_trace_rank_1.json").write_text('{"pg_config": {')
    out = rankscope("diagnose", str(folder), cwd=tmp_path)
    assert out.returncode == 3, out.stdout + out.stderr
    assert out.stdout.startswith("UNKNOWN") and "OK" not in out.stdout
    assert "nccl_trace_rank_0" in out.stdout and "nccl_trace_rank_1.json" in out.stdout
    as_json = json.loads(rankscope("diagnose", "--json", str(folder), cwd=tmp_path).stdout)
    assert as_json["verdict"] == "unknown" and len(as_json["missing"]) == 2


def test_slurm_options_need_the_slurm_launcher(tmp_path, capsys):
    assert main(["run", "--partition", "debug", str(SCRIPTS / "launch" / "clean.py")]) == 2
    assert "--partition are for --launcher slurm" in capsys.readouterr().err
    args = build_parser().parse_args(
        ["run", "--launcher", "slurm", "--time", "5:00", "--sbatch-arg=--qos=x", "t.py"]
    )
    assert (args.launcher, args.time, args.sbatch_arg) == ("slurm", "5:00", ["--qos=x"])


NOTEBOOKS = Path(__file__).parent.parent / "notebooks"


def lab(*, euid: int = 1000, platform: str = "linux", args: tuple[str, ...] = (), **env: str):
    """``rankscope lab``'s command and notes for the repository's notebooks."""
    return lab_command(NOTEBOOKS, jupyter_args=args, euid=euid, env=env, platform=platform)


def test_lab_opens_on_the_quickstart_as_a_normal_user_with_a_display(tmp_path):
    with socket.socket() as s:  # a port nobody listens on, as JupyterLab's first
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv, notes = lab(DISPLAY=":0", JUPYTER_PORT=str(port))
    assert argv[:3] == [sys.executable, "-m", "jupyterlab"]
    assert f"--ServerApp.root_dir={NOTEBOOKS.resolve()}" in argv
    assert "--LabApp.default_url=/lab/tree/00-quickstart.ipynb" in argv
    assert (NOTEBOOKS / QUICKSTART).is_file()
    assert "--allow-root" not in argv and "--no-browser" not in argv
    assert notes == []
    # a folder without the quickstart opens on JupyterLab's own page
    argv, _ = lab_command(tmp_path, euid=1000, env={"DISPLAY": ":0"}, platform="linux")
    assert not [a for a in argv if "default_url" in a]


def test_lab_as_root_allows_root_and_says_what_it_means():
    argv, notes = lab(euid=0, WAYLAND_DISPLAY="wayland-0")
    assert "--allow-root" in argv and "--no-browser" not in argv
    (note,) = [n for n in notes if "root" in n]
    assert "kernels" in note and "normal user" in note and "--user" in note


def test_lab_without_a_display_opens_no_browser_and_points_at_the_url():
    argv, notes = lab()
    assert "--no-browser" in argv
    assert any("no browser" in n and "URL" in n for n in notes)
    # elsewhere than Linux a desktop needs no DISPLAY
    argv, _ = lab(platform="darwin")
    assert "--no-browser" not in argv


def test_lab_says_when_the_first_port_is_taken():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        argv, notes = lab(DISPLAY=":0", JUPYTER_PORT=str(port))
        assert notes == [
            f"port {port} is taken: JupyterLab takes another, the URL below says which"
        ]
        assert not [a for a in argv if "port" in a]  # JupyterLab's own retries pick the next
        # a port the user names is left to JupyterLab, which says so itself
        argv, notes = lab(DISPLAY=":0", JUPYTER_PORT=str(port), args=("--port", "9"))
        assert notes == [] and argv[-2:] == ["--port", "9"]
    with pytest.raises(ValueError, match="JUPYTER_PORT must be a port number"):
        lab(JUPYTER_PORT="eighty")


def test_lab_passes_options_after_the_folder_to_jupyterlab(capsys):
    args = build_parser().parse_args(["lab", "notebooks", "--ip=0.0.0.0", "--port", "9000"])
    assert (args.notebooks, args.jupyter_args) == ("notebooks", ["--ip=0.0.0.0", "--port", "9000"])
    assert build_parser().parse_args(["lab"]).notebooks == "notebooks"
    assert main(["lab", str(NOTEBOOKS / "nothing-here")]) == 2
    assert "is not a folder of notebooks" in capsys.readouterr().err
