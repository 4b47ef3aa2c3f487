"""Lightning: a callback only rank 0 has. A gradient-norm callback averages each batch's norm
over the ranks (through the strategy) before logging it; it was added to the Trainer's list
under `if LOCAL_RANK == 0`, the usual guard for things that print, so only rank 0 runs it.
After its first batch rank 0 waits in the callback's all_reduce while ranks 1-2 wait in the next
batch's gradient all_reduce. Lightning's loop calls the callback; the decision is the user's
`if` that put it in the list."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [0], "site": "norm", "parting": "zero", "needs": ["lightning"], "run": {"startup_timeout_s": 300}}

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


class GradNormLogger(L.Callback):
    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        norm = torch.stack([p.grad.norm() for p in pl_module.parameters()]).norm()
        mean = trainer.strategy.reduce(norm, reduce_op="mean")  # site: norm
        print(f"grad norm {mean.item():.3f}")


callbacks = []
if int(os.environ.get("LOCAL_RANK", 0)) == 0:  # site: zero
    callbacks.append(GradNormLogger())

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
    callbacks=callbacks,
)
trainer.fit(Model(), data)
