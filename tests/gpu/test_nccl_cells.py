"""A cell on every rank with nccl: a real kernel starts the ranks with the default backend
(``auto``), which is nccl where every rank has a GPU of its own; a cell's all_reduce runs on the
GPU, and the run directory's calls table holds it as nccl's. One rank: NCCL refuses two ranks on
one GPU, and the lent machines have one. Skipped, saying why, where torch sees no CUDA device."""

from __future__ import annotations

import pytest

from rankscope.collect import load_run

from ..test_cells import Kernel, _wait_view
from . import ON_A_GPU

pytestmark = [*ON_A_GPU, pytest.mark.timeout(300)]


def test_a_cell_s_all_reduce_runs_on_the_gpu_by_default(tmp_path):
    k = Kernel(tmp_path)
    try:
        k.run("%load_ext rankscope")
        _, out = k.run(f"%ranks start 1 --runs {tmp_path / 'runs'}", timeout=240)
        assert "1 rank, incarnation 1: running" in out, out
        cell, _ = k.run(
            "%%ranks\nt = torch.ones(4, device=device)\ndist.all_reduce(t)\n"
            "torch.cuda.synchronize()\nprint(dist.get_backend(), t.device, t.sum().item())"
        )
        text = _wait_view(k, cell, r"done on every rank", timeout=120)
        assert "--- rank 0 ---\nnccl cuda:0 4.0" in text, text
        (run,) = (tmp_path / "runs").glob("*-cells-*/*-cells-1-*")
        k.run("%ranks stop", timeout=120)
        calls = load_run(run).collectives
        mine = calls[calls["op"] == "all_reduce"]
        assert len(mine) == 1 and mine["rank"].tolist() == [0], calls
    finally:
        k.close()
