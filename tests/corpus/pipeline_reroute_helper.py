"""Four pipeline stages pass a block around a ring through one helper, ``hand_off``, that sends
to ``dst`` and receives from ``src`` (even stages send first, odd ones receive first). The loop
works out each step's peers and, when a stage measures its next neighbour as lagging, reroutes
its block one stage further on. At step 2 only stage 1 measures such a lag: its send, from the
helper's line that every step uses, goes to stage 3 while stage 2 waits for it. Nothing in the
helper decides anything; the branch that set the peer is the caller's, before the call."""
# expect: {"ranks": 4, "verdict": "hang", "cause": "p2p_peer_mismatch", "culprits": [1], "site": "send", "parting": "reroute", "values": ["lag_ms"]}

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
LAG_LIMIT_MS = 50.0


def neighbour_lag_ms(step: int) -> float:
    return 80.0 if (rank == 1 and step == 2) else 5.0 + rank  # a noisy local timing


def hand_off(block: torch.Tensor, dst: int, src: int) -> torch.Tensor:
    incoming = torch.empty_like(block)
    if rank % 2 == 0:
        dist.send(block, dst)
        dist.recv(incoming, src)
    else:
        dist.recv(incoming, src)
        dist.send(block, dst)  # site: send
    return incoming


block = torch.full((32,), float(rank))
for step in range(5):
    lag_ms = neighbour_lag_ms(step)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    if lag_ms > LAG_LIMIT_MS:  # site: reroute
        nxt = (rank + 2) % world
    block = hand_off(block, nxt, prv)
dist.barrier()
dist.destroy_process_group()
