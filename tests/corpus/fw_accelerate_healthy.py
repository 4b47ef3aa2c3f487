"""Accelerate, healthy: training with the prepared model, optimizer and data loader, the loss
reduced across ranks each epoch and printed by the main process. No stall may be called."""
# expect: {"ranks": 3, "verdict": "ok", "needs": ["accelerate"], "run": {"startup_timeout_s": 300}}

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = DataLoader(TensorDataset(torch.randn(24, 4)), batch_size=4)
model, optimizer, data = accelerator.prepare(model, optimizer, data)
for epoch in range(2):
    for (x,) in data:
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    mean = accelerator.reduce(loss.detach(), reduction="mean")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print("epoch", epoch, "loss", float(mean))
accelerator.end_training()
