"""Lightning: an exception in a hook on one rank. Rank 1's epoch-end hook raises (a lookup of a
metric only it misses); ranks 0 and 2 go on into the next epoch and wait for it in DDP's
gradient all-reduce."""
# expect: {"ranks": 3, "verdict": "crash", "cause": "rank_crashed", "recipe": "D20", "culprits": [1], "site": "raise", "needs": ["lightning"], "run": {"startup_timeout_s": 300}}

import os

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.seen = {}

    def training_step(self, batch, _):
        return self.layer(batch[0]).pow(2).mean()

    def on_train_epoch_end(self):
        if self.global_rank != 1:
            self.seen["best"] = self.current_epoch
        print("best epoch", self.seen["best"])  # site: raise

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


data = DataLoader(TensorDataset(torch.randn(24, 4)), batch_size=4)
trainer = L.Trainer(
    accelerator="cpu",
    devices=int(os.environ["LOCAL_WORLD_SIZE"]),
    strategy="ddp",
    max_epochs=3,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(Model(), data)
