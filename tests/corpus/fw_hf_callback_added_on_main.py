"""Hugging Face Trainer: a callback added on the main process only. A loss-averaging callback
all-reduces each step's loss so that the number it prints is the global one; it is added with
`trainer.add_callback` inside `if trainer.is_world_process_zero():`, next to the code that sets
up printing. Rank 0 then makes one collective more at every step's end, from the Trainer's
callback handler; ranks 1-2 go on into the next step's DDP gradient all-reduce."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [0], "site": "average", "parting": "main", "needs": ["transformers", "accelerate"], "run": {"startup_timeout_s": 300}}

import tempfile

import torch
import torch.distributed as dist
from transformers import Trainer, TrainerCallback, TrainingArguments


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x, labels):
        return {"loss": (self.layer(x).squeeze(-1) - labels).pow(2).mean()}


class GlobalLoss(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        step = torch.tensor([float(state.global_step)])
        dist.all_reduce(step)  # site: average
        print(f"step {state.global_step}: {step.item() / dist.get_world_size():.1f}")


data = [{"x": torch.randn(4), "labels": torch.randn(())} for _ in range(24)]
args = TrainingArguments(
    output_dir=tempfile.mkdtemp(),
    use_cpu=True,
    per_device_train_batch_size=4,
    num_train_epochs=2,
    report_to=[],
    save_strategy="no",
    logging_strategy="no",
    disable_tqdm=True,
    dataloader_num_workers=0,
)
trainer = Trainer(model=Tiny(), args=args, train_dataset=data)
if trainer.is_world_process_zero():  # site: main
    trainer.add_callback(GlobalLoss)
trainer.train()
