"""The branch is in a library: the training loop calls a checkpoint helper every second step,
and the helper's barrier is inside `if leader:`, true on local rank 0 only. Rank 0 waits in the
barrier; rank 1 went on to the next step's all_reduce."""
# expect: {"ranks": 2, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [0], "site": "lib_barrier", "parting": "lib_decide", "values": ["leader"]}

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from corpus_lib import checkpointing

dist.init_process_group("gloo")
w = torch.ones(4)
for step in range(1, 6):
    dist.all_reduce(w)
    checkpointing.save(w, every=2, step=step)
dist.destroy_process_group()
