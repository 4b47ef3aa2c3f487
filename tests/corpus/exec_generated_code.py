"""Collectives from generated code: the step is built as text and run by `exec` (as code
generators and some configuration systems do), so its frames' file is `<string>`, with no
source to read. Rank 1's generated step has a barrier the others' has not; the card names the
culprit and its call, and says that it could not read the source of `<string>` rather than
naming a line."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [1], "chain": [0, 1, 2], "unread": ["<string>"]}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
body = ["t = torch.ones(4)", "dist.all_reduce(t)"]
if rank == 1:
    body.insert(0, "dist.barrier()")
step = compile("\n".join(["def step():", *("    " + line for line in body)]), "<string>", "exec")
namespace = {"torch": torch, "dist": dist}
exec(step, namespace)
for _ in range(3):
    namespace["step"]()
dist.destroy_process_group()
