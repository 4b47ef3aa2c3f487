"""DeepSpeed (ZeRO stage 1 on CPU), healthy: a few steps and a checkpoint that every rank
saves. No stall may be called."""
# expect: {"ranks": 3, "verdict": "ok", "needs": ["deepspeed"], "run": {"startup_timeout_s": 300}}

import os
import tempfile

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import torch

deepspeed.init_distributed(dist_backend="gloo")
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 1))
config = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 1},
    "steps_per_print": 1_000_000,
}
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
out = tempfile.mkdtemp()
for _step in range(4):
    loss = engine(torch.randn(2, 16)).pow(2).mean()
    engine.backward(loss)
    engine.step()
engine.save_checkpoint(out)
