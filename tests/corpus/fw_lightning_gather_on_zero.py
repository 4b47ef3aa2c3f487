"""Lightning: predictions gathered on the global zero only. The validation hook calls
`self.all_gather` under `if self.trainer.is_global_zero:`: rank 0 goes into Lightning's
all_gather while ranks 1-2 leave the hook and go on into the next training epoch."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [0], "site": "gather", "parting": "decide", "needs": ["lightning"], "run": {"startup_timeout_s": 300}}

import os

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.outs = []

    def training_step(self, batch, _):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, _):
        self.outs.append(self.layer(batch[0]).detach())

    def on_validation_epoch_end(self):
        preds = torch.cat(self.outs)
        self.outs.clear()
        if self.trainer.is_global_zero:  # site: decide
            self.all_gather(preds)  # site: gather

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
