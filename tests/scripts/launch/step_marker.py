"""A plain loop that calls rankscope.probe.step() so progress shows without collectives."""

import os

import torch
import torch.distributed as dist

import rankscope.probe

dist.init_process_group(os.environ.get("RANKSCOPE_BACKEND", "gloo"))
for i in range(5):
    dist.all_reduce(torch.ones(1))
    rankscope.probe.step(i)
dist.destroy_process_group()
