"""A ring exchange whose direction one rank decides from its own measurement: every step each
rank passes its block one hop round the ring of 4, clockwise while the link time it measured
stays under budget, else counter-clockwise. At step 3 rank 2 measures a slow link and alone sends
to rank 1 and receives from rank 3. Each step makes two point-to-point calls per rank (isend,
recv), so p2p call #7 is where the paths part: ranks 0, 1, 3 in the clockwise arm, rank 2 in the
other. A gloo send completes only when its peer receives it: rank 0 completes step 3 and waits
at step 4 to receive from rank 3; rank 1 receives from rank 0 but waits on its send to rank 2;
rank 3 waits to receive from rank 2, which sent to rank 1, and rank 2 to receive from rank 3,
which sent to rank 0."""
# expect: {"ranks": 4, "verdict": "hang", "cause": "p2p_peer_mismatch", "culprits": [2], "site": "recv back", "parting": "direction", "values": ["link_ms"], "first": {"pg": "default_pg", "seq": 7, "kind": "p2p"}}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
right, left = (rank + 1) % world, (rank - 1) % world
BUDGET_MS = 5.0


def measured_link_ms(step: int) -> float:
    return 9.5 if (rank == 2 and step == 3) else 1.2  # a noisy local timing


block = torch.full((64,), float(rank))
for step in range(8):
    link_ms = measured_link_ms(step)
    out = torch.empty_like(block)
    if link_ms < BUDGET_MS:  # site: direction
        req = dist.isend(block, right)
        dist.recv(out, left)  # site: recv
    else:
        req = dist.isend(block, left)
        dist.recv(out, right)  # site: recv back
    req.wait()
    block = 0.5 * (block + out)
dist.barrier()
dist.destroy_process_group()
