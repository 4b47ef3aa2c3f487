"""Pipeline parallel, two pipelines of two stages (0 -> 1, 2 -> 3): the first stage sends each
microbatch's activations to the second, then every rank all_reduces its gradients. Rank 0
computed its microbatch count from its own data and sends 3 where its second stage expects 4:
rank 1 waits in its fourth recv from rank 0, which went on to the gradient all_reduce."""
# expect: {"ranks": 4, "verdict": "hang", "cause": "uneven_inputs", "recipe": "D9", "culprits": [0], "site": "send", "chain": [0, 1]}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
first, peer = rank % 2 == 0, rank + 1 if rank % 2 == 0 else rank - 1
act = torch.ones(16)
for step in range(3):
    micro = 3 if (rank == 0 and step == 2) else 4
    for _ in range(micro):
        if first:
            dist.send(act, dst=peer)  # site: send
        else:
            dist.recv(act, src=peer)  # site: recv
    dist.all_reduce(torch.ones(4))  # site: grads
dist.destroy_process_group()
