"""Hugging Face Trainer: an exception in a callback on one rank. At the end of the first
epoch rank 1's callback reads a score its own evaluation never wrote and raises; ranks 0 and 2
go on into the next epoch and wait in DDP's gradient all-reduce."""
# expect: {"ranks": 3, "verdict": "crash", "cause": "rank_crashed", "recipe": "D20", "culprits": [1], "site": "raise", "needs": ["transformers", "accelerate"], "run": {"startup_timeout_s": 300}}

import tempfile

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x, labels):
        return {"loss": (self.layer(x).squeeze(-1) - labels).pow(2).mean()}


class BestScore(TrainerCallback):
    def __init__(self):
        self.trainer = None
        self.scores = {}

    def on_epoch_end(self, args, state, control, **kwargs):
        if args.process_index != 1:
            self.scores[state.epoch] = state.global_step
        print("best", max(self.scores.values()), "at epoch", state.epoch)  # site: raise


data = [{"x": torch.randn(4), "labels": torch.randn(())} for _ in range(24)]
args = TrainingArguments(
    output_dir=tempfile.mkdtemp(),
    use_cpu=True,
    per_device_train_batch_size=4,
    per_device_eval_batch_size=4,
    num_train_epochs=3,
    report_to=[],
    save_strategy="no",
    logging_strategy="no",
    disable_tqdm=True,
    dataloader_num_workers=0,
)
callback = BestScore()
trainer = Trainer(
    model=Tiny(), args=args, train_dataset=data, eval_dataset=data, callbacks=[callback]
)
callback.trainer = trainer
trainer.train()
