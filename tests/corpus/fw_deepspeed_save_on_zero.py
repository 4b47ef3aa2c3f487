"""DeepSpeed (ZeRO stage 1 on CPU): a checkpoint saved from rank 0 only. `engine.save_checkpoint`
is a collective under ZeRO (every rank writes its optimizer shard; the engine synchronises);
under `if engine.global_rank == 0:` rank 0 waits in it while ranks 1-2 go on training."""
# expect: {"ranks": 3, "verdict": "hang", "cause": "rank_conditional_collective", "recipe": "D21", "culprits": [0], "site": "save", "parting": "decide", "needs": ["deepspeed"], "run": {"startup_timeout_s": 300}}

import os
import tempfile

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import torch

deepspeed.init_distributed(dist_backend="gloo")
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 1))
config = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 1},
    "steps_per_print": 1_000_000,
}
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
out = tempfile.mkdtemp()
for step in range(4):
    loss = engine(torch.randn(2, 16)).pow(2).mean()
    engine.backward(loss)
    engine.step()
    if step == 1 and engine.global_rank == 0:  # site: decide
        engine.save_checkpoint(out)  # site: save
