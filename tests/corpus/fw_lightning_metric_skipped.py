"""Lightning: a metric sync skipped on one rank. The validation hook reduces its loss across
ranks through the strategy only where the loss is finite; rank 2's data holds a NaN, so rank 2
skips the reduce and goes on while ranks 0-1 wait in it: the conditional collective is theirs."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [0, 1], "site": "reduce", "parting": "finite", "needs": ["lightning"], "run": {"startup_timeout_s": 300}}

import os

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.losses = []

    def training_step(self, batch, _):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, _):
        x = batch[0] + (float("nan") if self.global_rank == 2 else 0.0)
        self.losses.append(self.layer(x).pow(2).mean().detach())

    def on_validation_epoch_end(self):
        local = torch.stack(self.losses).mean()
        self.losses.clear()
        if torch.isfinite(local):  # site: finite
            self.trainer.strategy.reduce(local, reduce_op="mean")  # site: reduce

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
    num_sanity_val_steps=0,
)
trainer.fit(Model(), data, data)
