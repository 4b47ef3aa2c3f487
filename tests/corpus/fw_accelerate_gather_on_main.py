"""Accelerate: predictions gathered on the main process only. After each epoch the script calls
`accelerator.gather` under `if accelerator.is_main_process:`; ranks 1-2 go on into the next
epoch's backward (DDP's gradient all-reduce)."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [0], "site": "gather", "parting": "decide", "needs": ["accelerate"], "run": {"startup_timeout_s": 300}}

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = DataLoader(TensorDataset(torch.randn(24, 4)), batch_size=4)
model, optimizer, data = accelerator.prepare(model, optimizer, data)
for _epoch in range(3):
    preds = []
    for (x,) in data:
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        preds.append(loss.detach())
    if accelerator.is_main_process:  # site: decide
        accelerator.gather(torch.stack(preds))  # site: gather
accelerator.end_training()
