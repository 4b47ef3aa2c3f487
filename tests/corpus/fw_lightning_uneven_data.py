"""Lightning: uneven data split by the user. With `use_distributed_sampler=False` Lightning
leaves the loader as it is, and the script gives each rank its own slice of the samples: ranks
0-1 get 12 samples (3 batches), rank 2 six (2 batches). Rank 2's `fit` ends its epoch and returns
while ranks 0-1 all-reduce the gradients of their third batch with no partner."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "uneven_inputs", "recipe": "D9", "culprits": [2], "site": "fit", "needs": ["lightning"], "run": {"startup_timeout_s": 300}}

import os

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, _):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


rank = int(os.environ["RANK"])
samples = torch.randn(30, 4)
mine = samples[rank * 12 : (rank + 1) * 12]  # site: split
data = DataLoader(TensorDataset(mine), batch_size=4)
trainer = L.Trainer(
    accelerator="cpu",
    devices=int(os.environ["LOCAL_WORLD_SIZE"]),
    strategy="ddp",
    max_epochs=1,
    use_distributed_sampler=False,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(Model(), data)  # site: fit
