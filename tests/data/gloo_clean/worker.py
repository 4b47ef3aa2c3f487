"""A clean 2-rank gloo job: a few collectives on the world group and on a subgroup, then a JSON
flight-recorder dump next to the probe's pickle (ranks/<rank>/fr.json)."""

import os
from pathlib import Path

import torch
import torch.distributed as dist

import rankscope.probe

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4) * (rank + 1)
for step in range(2):
    dist.all_reduce(t)
    rankscope.probe.step(step)
dist.broadcast(t, src=0)
out = [torch.zeros(4) for _ in range(dist.get_world_size())]
dist.all_gather(out, t)
pair = dist.new_group([0, 1])
dist.all_reduce(torch.ones(2, 3, dtype=torch.float64), group=pair)
dist.barrier()
json_dump = torch._C._distributed_c10d._dump_fr_trace_json()
Path(os.environ["RANKSCOPE_RUN_DIR"], "ranks", str(rank), "fr.json").write_bytes(json_dump)
print(f"rank {rank} sum {t.sum().item():.0f}", flush=True)
dist.destroy_process_group()
