"""Accelerate: uneven data through the framework's sampler. With `even_batches=False` (its DataLoaderConfiguration) the
prepared loader does not pad the last batches: of 5 batches rank 0 gets 3 and rank 1 two. Rank
1 leaves the loop and waits in `wait_for_everyone` while rank 0's third backward all-reduces
its gradients with no partner."""
# expect: {"ranks": 2, "verdict": "hang", "cause": "uneven_inputs", "recipe": "D9", "culprits": [1], "site": "barrier", "needs": ["accelerate"], "run": {"startup_timeout_s": 300}}

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from torch.utils.data import DataLoader, TensorDataset

accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(even_batches=False))
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = DataLoader(TensorDataset(torch.randn(20, 4)), batch_size=4)
model, optimizer, data = accelerator.prepare(model, optimizer, data)
for (x,) in data:
    loss = model(x).pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
accelerator.wait_for_everyone()  # site: barrier
accelerator.end_training()
