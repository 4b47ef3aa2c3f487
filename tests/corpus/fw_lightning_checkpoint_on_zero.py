"""Lightning: a checkpoint saved from the global zero only. `trainer.save_checkpoint` is a
collective (the strategy's barrier around the write); called under
`if self.trainer.is_global_zero:` in a training hook, rank 0 waits in it while ranks 1-2 go on
training."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [0], "site": "save", "parting": "decide", "needs": ["lightning"], "run": {"startup_timeout_s": 300}}

import os
import tempfile

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

CKPT = os.path.join(tempfile.mkdtemp(), "last.ckpt")


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, _):
        return self.layer(batch[0]).pow(2).mean()

    def on_train_epoch_end(self):
        if self.trainer.is_global_zero:  # site: decide
            self.trainer.save_checkpoint(CKPT)  # site: save

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
