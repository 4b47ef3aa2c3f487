"""Hugging Face Trainer: a callback evaluates on the main process only. At the end of each
epoch `if state.is_world_process_zero:` runs `trainer.evaluate()`, whose loss gathering is a
collective; ranks 1-2 go on into the next epoch's training step (DDP's gradient all-reduce)."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [0], "site": "evaluate", "parting": "decide", "needs": ["transformers", "accelerate"], "run": {"startup_timeout_s": 300}}

import tempfile

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x, labels):
        return {"loss": (self.layer(x).squeeze(-1) - labels).pow(2).mean()}


class EvalOnMain(TrainerCallback):
    def __init__(self):
        self.trainer = None

    def on_epoch_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:  # site: decide
            self.trainer.evaluate()  # site: evaluate


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
callback = EvalOnMain()
trainer = Trainer(
    model=Tiny(), args=args, train_dataset=data, eval_dataset=data, callbacks=[callback]
)
callback.trainer = trainer
trainer.train()
