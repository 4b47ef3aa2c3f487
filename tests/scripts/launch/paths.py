"""One helper that all_reduces, called from two lines: the normal step and an ``except``
retry. The innermost line (the site) is the same for both; the paths differ. Exits 0."""

import os

import torch
import torch.distributed as dist


def sync(t):
    dist.all_reduce(t)  # site: helper


def step(t, retry):
    if not retry:
        sync(t)  # site: normal
        return
    try:
        raise RuntimeError("a flaky step")
    except RuntimeError:
        sync(t)  # site: retry


dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
t = torch.ones(4)
for _ in range(3):
    step(t, retry=False)  # site: loop
step(t, retry=True)  # site: last
dist.destroy_process_group()
