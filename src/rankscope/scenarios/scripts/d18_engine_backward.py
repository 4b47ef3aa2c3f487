"""D18: a loop that goes around the DeepSpeed engine: ``loss.backward()`` and ``optimizer.step()``.

Broken: a plain-PyTorch training loop is moved to DeepSpeed (ZeRO stage 2) and keeps its habits:
it divides the loss by its accumulation steps, calls ``loss.backward()``, and every ACCUM
micro-batches steps the optimizer it created itself. Under ZeRO the engine gave that optimizer
this rank's fp32 partition of the parameters instead of the model's, and only ``engine.step()``
hands it the reduced gradients: ``optimizer.step()`` finds none and changes nothing. No error, no
warning, the loss stays where it started. The script trains the same model on one process over
the same global batches (the reference) and fails when the weights differ.
Fixed (--fix): ``engine.backward(loss)`` and ``engine.step()`` on every micro-batch, and the
accumulation stated once, in the config; the engine scales the loss and steps on the boundary.
``--fix --manual-accumulation`` is the half-done port: the engine's calls, but the loop still
divides the loss and calls ``engine.step()`` only every ACCUM micro-batches while the config
also says ACCUM. The two accumulations multiply: the optimizer steps ACCUM times less often and
the check fails again.

With fp16 on GPUs, ``loss.backward()`` also skips the engine's loss scaling; the fix is the same.
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
parser.add_argument("--manual-accumulation", action="store_true")
args = parser.parse_args()
loop = ("manual accumulation" if args.manual_accumulation else "engine") if args.fix else "torch"

MICRO, ACCUM, STEPS, LR = 4, 4, 4, 0.1
deepspeed.init_distributed(dist_backend=backend)
rank, world = dist.get_rank(), dist.get_world_size()
true_w = torch.arange(1.0, 9.0)


def micro_batches(r: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank r's micro-batches, in order; every rank can build every rank's data."""
    gen = torch.Generator().manual_seed(100 + r)
    xs = [torch.randn(MICRO, 8, generator=gen) for _ in range(STEPS * ACCUM)]
    return [(x, x @ true_w) for x in xs]


def mse(weight: torch.Tensor) -> float:
    """The loss of ``weight`` over every rank's data."""
    batches = [b for r in range(world) for b in micro_batches(r)]
    return sum((x @ weight - y).pow(2).mean().item() for x, y in batches) / len(batches)


def reference() -> torch.Tensor:
    """One process, plain torch: each step averages the loss over the global batch."""
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 1, bias=False)
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    data = [micro_batches(r) for r in range(world)]
    for step in range(STEPS):
        chunk = [b for d in data for b in d[step * ACCUM : (step + 1) * ACCUM]]
        x, y = torch.cat([b[0] for b in chunk]), torch.cat([b[1] for b in chunk])
        (net(x).squeeze(1) - y).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return net.weight.detach().squeeze(0)


torch.manual_seed(0)
model = torch.nn.Linear(8, 1, bias=False)
optimizer = torch.optim.SGD(model.parameters(), lr=LR)
config = {
    "train_micro_batch_size_per_gpu": MICRO,
    "gradient_accumulation_steps": ACCUM,
    "zero_optimization": {"stage": 2},
    "gradient_clipping": 0.0,  # DeepSpeed 0.19 clips at 1.0 unless told; the reference does not
    "zero_allow_untested_optimizer": True,  # plain SGD is not on ZeRO's tested list
    "steps_per_print": 1_000_000,
}
loss_before = mse(model.weight.detach().squeeze(0))
engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)

for i, (x, y) in enumerate(micro_batches(rank)):
    loss = (engine(x.to(engine.device)).squeeze(1) - y.to(engine.device)).pow(2).mean()
    if loop == "torch":
        (loss / ACCUM).backward()
        if (i + 1) % ACCUM == 0:
            optimizer.step()
            optimizer.zero_grad()
    elif loop == "manual accumulation":
        engine.backward(loss / ACCUM)
        if (i + 1) % ACCUM == 0:
            engine.step()
    else:
        engine.backward(loss)
        engine.step()

weight = model.weight.detach().squeeze(0).cpu()
error = (weight - reference()).abs().max().item()
if rank == 0:
    result = {
        "loop": loop,
        "optimizer_steps": engine.global_steps,
        "expected_steps": STEPS,
        "weight_error": error,
        "loss_before": loss_before,
        "loss_after": mse(weight),
    }
    print("result " + json.dumps(result), flush=True)
dist.barrier()
dist.destroy_process_group()
if error > 1e-4:
    raise SystemExit(
        f"rank {rank}: after {STEPS * ACCUM} micro-batches the weights are {error:.3f} away from "
        f"the reference; the engine took {engine.global_steps} optimizer steps, {STEPS} intended"
    )
