"""Accelerate: a metric sync skipped on one rank. After training the script reduces its final
loss across ranks only where the loss is finite; rank 2's data holds a NaN, so rank 2 skips the
reduce and waits in `wait_for_everyone` while ranks 0-1 wait in the reduce: rank 2 left the
path the others share (as in plain torch, `early_stop_local_metric`)."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [2], "site": "barrier", "parting": "finite", "needs": ["accelerate"], "run": {"startup_timeout_s": 300}}

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
data = DataLoader(TensorDataset(torch.randn(24, 4)), batch_size=4)
model, optimizer, data = accelerator.prepare(model, optimizer, data)
bad = float("nan") if accelerator.process_index == 2 else 0.0
for _epoch in range(2):
    for (x,) in data:
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
metric = loss.detach() + bad
if torch.isfinite(metric):  # site: finite
    accelerator.reduce(metric, reduction="mean")  # site: reduce
accelerator.wait_for_everyone()  # site: barrier
accelerator.end_training()
