"""Lightning, healthy: predictions gathered on every rank and the validation loss logged with
`sync_dist=True`; Lightning's own collectives (its barriers, the stop-signal broadcast, the
metric syncs) run on every rank alike. No stall may be called."""
# expect: {"ranks": 3, "verdict": "ok", "needs": ["lightning"], "run": {"startup_timeout_s": 300}}

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

    def validation_step(self, batch, _):
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("val_loss", loss, sync_dist=True)

    def on_validation_epoch_end(self):
        self.all_gather(torch.ones(2))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


data = DataLoader(TensorDataset(torch.randn(24, 4)), batch_size=4)
trainer = L.Trainer(
    accelerator="cpu",
    devices=int(os.environ["LOCAL_WORLD_SIZE"]),
    strategy="ddp",
    max_epochs=2,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    num_sanity_val_steps=0,
)
trainer.fit(Model(), data, data)
