"""Two pipelines of two stages each (ranks 0->1 and 2->3, data parallel across them). Training
steps send activations forward and gradients back; every third step is an evaluation whose
`eval_forward` computes the previous stage as `stage - 1`, a stage index, where the training
code uses the global rank. On the first pipeline the two agree; on the second, rank 3 receives
its evaluation input from rank 0, which never sends to it. Rank 3 blocks at its p2p call #5 (the
evaluation at step 2) and rank 2 in its send to rank 3 there, which rank 3 never receives;
ranks 0 and 1 finish and wait in the final barrier."""
# expect: {"ranks": 4, "verdict": "hang", "cause": "p2p_peer_mismatch", "culprits": [3], "site": "eval recv", "first": {"pg": "default_pg", "seq": 5, "kind": "p2p"}}

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank = dist.get_rank()
STAGES = 2
stage = rank % STAGES
first_rank = rank - stage  # this pipeline's stage 0, as a global rank
torch.manual_seed(stage)
layer = nn.Linear(16, 16)
EVAL_EVERY = 3


def train_step() -> None:
    if stage == 0:
        act = layer(torch.randn(4, 16))
        dist.send(act.detach(), rank + 1)
        grad = torch.empty_like(act)
        dist.recv(grad, rank + 1)
        act.backward(grad)
    else:
        act = torch.empty(4, 16, requires_grad=False)
        dist.recv(act, rank - 1)
        act.requires_grad_()
        layer(act).sum().backward()
        dist.send(act.grad, rank - 1)


@torch.no_grad()
def eval_forward() -> None:
    if stage == 0:
        dist.send(layer(torch.randn(4, 16)), first_rank + 1)
    else:
        act = torch.empty(4, 16)
        dist.recv(act, stage - 1)  # site: eval recv
        layer(act)


for step in range(6):
    if step % EVAL_EVERY == EVAL_EVERY - 1:
        eval_forward()
    else:
        train_step()
dist.barrier()
dist.destroy_process_group()
