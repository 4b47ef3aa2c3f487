"""A hand-written ring exchange of 4 ranks: every step each rank passes its block to the next
rank and takes the previous one's (even ranks send first, odd ranks receive first). A rebalancing
branch, meant for a rank whose measured load is far over budget, sends that step's block two hops
on instead; at step 2 only rank 1 measures such a load, so its send goes to rank 3 while rank 2
waits to receive from it. The send's line is the one every step uses: what parted rank 1 from
the others is the branch that set its peer, before the exchange."""
# expect: {"ranks": 4, "verdict": "hang", "cause": "p2p_peer_mismatch", "culprits": [1], "site": "send", "parting": "rebalance", "values": ["load"]}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
BUDGET = 4.0


def measured_load(step: int) -> float:
    return 9.0 if (rank == 1 and step == 2) else 1.0 + 0.1 * rank  # a noisy local timing


block = torch.full((32,), float(rank))
for step in range(5):
    load = measured_load(step)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    if load > 2 * BUDGET:  # site: rebalance
        nxt = (rank + 2) % world
    incoming = torch.empty_like(block)
    if rank % 2 == 0:
        dist.send(block, nxt)
        dist.recv(incoming, prv)
    else:
        dist.recv(incoming, prv)
        dist.send(block, nxt)  # site: send
    block = incoming
dist.barrier()
dist.destroy_process_group()
