"""D17: a DeepSpeed config written for one world size, launched on another.

Broken: the config comes from an 8-GPU node and states all three batch knobs: train_batch_size
32 = train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 1 x 8 ranks. On 2 ranks the
product is 8, and ``deepspeed.initialize`` fails on every rank with DeepSpeed's own assertion
"train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size".
Fixed (--fix): the config states what the run is about, the global batch (the learning rate was
tuned for it) and the micro-batch (what fits in a device's memory), and leaves the accumulation
out: DeepSpeed derives it from the world size (32 / (4 x 2) = 4 on 2 ranks, 1 on 8). The script
checks first that the global batch splits evenly, because DeepSpeed derives the accumulation by
integer division and would otherwise fail with the same assertion. Rank 0 prints the knobs the
engine resolved, ``knobs {json}``, including the ones the config never mentioned
(gradient_clipping defaults to 1.0 in DeepSpeed 0.19).
"""

import argparse
import json
import os

# DeepSpeed picks its accelerator when it is imported; gloo means CPU ranks.
backend = os.environ.get("RANKSCOPE_BACKEND", "gloo")
if backend == "gloo":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--fix", action="store_true")
args = parser.parse_args()

GLOBAL_BATCH, MICRO_BATCH, OPTIMIZER_STEPS = 32, 4, 2
deepspeed.init_distributed(dist_backend=backend)
rank, world = dist.get_rank(), dist.get_world_size()

config = {
    "train_micro_batch_size_per_gpu": MICRO_BATCH,
    "zero_optimization": {"stage": 2},
    "zero_allow_untested_optimizer": True,  # plain SGD is not on ZeRO's tested list
    "steps_per_print": 1_000_000,
}
if args.fix:
    if GLOBAL_BATCH % (MICRO_BATCH * world):
        raise SystemExit(
            f"a global batch of {GLOBAL_BATCH} does not split into micro-batches of "
            f"{MICRO_BATCH} on {world} ranks; pick a global batch divisible by {MICRO_BATCH * world}"
        )
    config["train_batch_size"] = GLOBAL_BATCH
else:
    # Copied from the 8-GPU node's config: 4 x 1 x 8 = 32 there.
    config.update(train_batch_size=GLOBAL_BATCH, gradient_accumulation_steps=1)

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)

accumulation = engine.gradient_accumulation_steps()
gen = torch.Generator().manual_seed(rank)
for _ in range(OPTIMIZER_STEPS * accumulation):
    x = torch.randn(engine.train_micro_batch_size_per_gpu(), 8, generator=gen).to(engine.device)
    engine.backward(engine(x).pow(2).mean())
    engine.step()

knobs = {
    "world_size": world,
    "train_batch_size": engine.train_batch_size(),
    "train_micro_batch_size_per_gpu": engine.train_micro_batch_size_per_gpu(),
    "gradient_accumulation_steps": accumulation,
    "zero_stage": engine.zero_optimization_stage(),
    "gradient_clipping": engine.gradient_clipping(),
    "optimizer_steps": engine.global_steps,
}
if rank == 0:
    print("knobs " + json.dumps(knobs), flush=True)
dist.barrier()
dist.destroy_process_group()
product = knobs["train_micro_batch_size_per_gpu"] * accumulation * world
assert knobs["train_batch_size"] == product == GLOBAL_BATCH, knobs
assert knobs["optimizer_steps"] == OPTIMIZER_STEPS, knobs
