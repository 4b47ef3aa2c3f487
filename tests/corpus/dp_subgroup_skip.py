"""DP x TP with a call skipped on a data-parallel subgroup, long before the hang: tp0 [0, 1],
tp1 [2, 3], dp0 [0, 2], dp1 [1, 3]. Each step all-reduces activations on the rank's tp group and
gradients on its dp group, the latter behind a guard that skips an all-zero gradient. At step 4
rank 1's batch is all padding, its gradient is zero and it skips its dp1 all_reduce. Every dp
call comes from the same line, so gloo pairs rank 1's step-5 call with rank 3's step-4 call and
nothing fails; after the last step rank 1 has made 7 calls on dp1 and rank 3 8. Ranks 0, 1, 2
wait in the final barrier, rank 3 in its dp1 all_reduce #8. On the final stacks rank 3 looks
like the culprit; the paths first part on dp1 at #8 (rank 3 calls, rank 1 has gone on), and the
guard that decided it, at step 4, is on no rank's final stack."""
# expect: {"ranks": 4, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [1], "first": {"pg": "dp1", "seq": 8}}

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank = dist.get_rank()
tp = [dist.new_group([0, 1], group_desc="tp0"), dist.new_group([2, 3], group_desc="tp1")]
dp = [dist.new_group([0, 2], group_desc="dp0"), dist.new_group([1, 3], group_desc="dp1")]
tp, dp = tp[rank // 2], dp[rank % 2]
torch.manual_seed(rank % 2)
layer = nn.Linear(8, 8, bias=False)


def batch(step: int) -> torch.Tensor:
    if rank == 1 and step == 4:
        return torch.zeros(16, 8)  # a batch of padding only
    return torch.randn(16, 8)


for step in range(8):
    layer.zero_grad()
    out = layer(batch(step))
    partial = out.detach().clone()
    dist.all_reduce(partial, group=tp)  # site: tp
    (out * partial).sum().backward()
    grad = layer.weight.grad
    if grad.abs().sum() > 0:  # site: guard
        dist.all_reduce(grad, group=dp)  # site: dp
dist.barrier()  # site: final
dist.destroy_process_group()
