"""D14: bf16 with FSDP2 by casting the model — no fp32 master weights, updates rounded away.

Broken: the model is cast with ``model.to(torch.bfloat16)`` before ``fully_shard``, the way one
would do it without FSDP. FSDP2 then shards bf16 parameters: the optimizer updates bf16 weights and
keeps its momentum in bf16, and the gradients are reduced in bf16. A bf16 number has 8 bits of
mantissa, so an update smaller than about 1/256 of the weight is lost to rounding. The script
trains the same model on the same global batches in fp32 on one process (the reference), measures
how far each sharded weight ends from the reference relative to how far the reference moved, and
fails above the tolerance.
Fixed (--fix): the model stays fp32 and ``MixedPrecisionPolicy(param_dtype=bfloat16,
reduce_dtype=float32)`` is given to every ``fully_shard``: forward and backward run in bf16 on
gathered copies, the sharded weights, gradients and optimizer state stay fp32, and gradients are
reduced in fp32. Buffers are not FSDP2's business (it has no buffer dtype): they keep the dtype
the model gave them.

Each rank prints ``rankscope-dtypes {json}``: the dtypes it holds (sharded parameters, parameters
seen in forward, gradients, optimizer state, the buffer) and the measured drift.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

parser = argparse.ArgumentParser()
parser.add_argument("--fix", action="store_true")
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()

IN, HIDDEN, BATCH, LR, MOMENTUM = 32, 64, 16, 1e-4, 0.9
TOLERANCE = 0.02  # drift from the fp32 reference, as a fraction of the reference's own movement


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.full((IN,), 0.5))  # a fixed input normalisation
        self.hidden = torch.nn.Linear(IN, HIDDEN)
        self.out = torch.nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(x * self.scale)))


def fresh() -> Net:
    torch.manual_seed(0)
    return Net()


backend = os.environ.get("RANKSCOPE_BACKEND", "gloo")
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
if backend == "nccl":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
device = torch.device("cuda" if backend == "nccl" else "cpu")
mesh = init_device_mesh(device.type, (world,))

gen = torch.Generator().manual_seed(1)
true_w = torch.randn(IN, 1, generator=gen)
batches = []
for _ in range(args.steps):
    x = torch.randn(BATCH * world, IN, generator=gen)
    batches.append((x, x @ true_w))

# The reference: fp32 on one process, every global batch whole.
reference = fresh()
ref_opt = torch.optim.SGD(reference.parameters(), lr=LR, momentum=MOMENTUM)
for x, y in batches:
    (reference(x) - y).pow(2).mean().backward()
    ref_opt.step()
    ref_opt.zero_grad()

model = fresh().to(device)
if args.fix:
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for unit in (model.hidden, model.out, model):
        fully_shard(unit, mesh=mesh, mp_policy=policy)
else:
    model = model.to(torch.bfloat16)  # BUG: the sharded (master) weights become bf16
    for unit in (model.hidden, model.out, model):
        fully_shard(unit, mesh=mesh)

seen = {}


def note_forward_dtype(module: torch.nn.Module, inputs: object) -> None:
    seen["forward"] = module.weight.dtype  # the gathered copy that forward computes with


model.hidden.register_forward_pre_hook(note_forward_dtype)
opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
input_dtype = torch.float32 if args.fix else torch.bfloat16  # what the model's layers take
for x, y in batches:
    x, y = x.chunk(world)[rank].to(device, input_dtype), y.chunk(world)[rank].to(device)
    (model(x).float() - y).pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=False)

x, y = batches[-1]  # the loss on the last global batch, whole, after training
with torch.no_grad():
    loss = (model(x.to(device, input_dtype)).float() - y.to(device)).pow(2).mean()
    reference_loss = (reference(x) - y).pow(2).mean()
start = fresh()
drift = {}
for (name, p), ref, p0 in zip(
    model.named_parameters(), reference.parameters(), start.parameters(), strict=True
):
    full = p.detach().full_tensor().float().cpu()
    drift[name] = ((full - ref.detach()).norm() / (ref.detach() - p0).norm()).item()
first = next(model.parameters())
report = {
    "rank": rank,
    "world": world,
    "setting": "model.to(bfloat16)" if not args.fix else "MixedPrecisionPolicy(bf16, fp32)",
    "sharded_param": str(first.dtype),
    "forward_param": str(seen["forward"]),
    "grad": str(first.grad.dtype),
    "optimizer_state": str(opt.state[first]["momentum_buffer"].dtype),
    "buffer": str(model.scale.dtype),
    "drift": drift,
    "loss": loss.item(),
    "reference_loss": reference_loss.item(),
    "steps": args.steps,
}
print("rankscope-dtypes " + json.dumps(report), flush=True)
dist.destroy_process_group()

worst = max(drift, key=drift.get)
if drift[worst] > TOLERANCE:
    raise SystemExit(
        f"rank {rank}: {worst} ends {drift[worst]:.1%} of its own training away from the fp32 "
        f"reference (tolerance {TOLERANCE:.0%}): the sharded weights are bf16"
    )
