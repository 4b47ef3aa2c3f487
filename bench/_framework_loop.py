"""Worker for framework_overhead.py: a framework's own training loop under rankscope's probe,
with the probe switched off and on in blocks of steps (2 ranks, gloo, CPU).

``--framework lightning``: a LightningModule trained by ``L.Trainer`` (DDP strategy);
``--framework trainer``: a tiny model trained by the Hugging Face ``Trainer``. A callback of the
framework's own times every step, from the end of one to the end of the next (the framework's
whole iteration: its data loading, its own collectives, DDP's gradient all-reduce), and at the
end of every ``--block`` steps switches the probe off or on, the order swapped every pair:

  * off: torch.distributed's functions are torch's own again, and the probe's thread sleeps;
  * on: the probe's wrappers are back, and its thread runs as on any rank.

The switch happens between two timed steps, on every rank at the same step. The flight
recorder (which the probe turns on) stays on in both, and DDP's C++ collectives go through
neither arm's wrappers. Woken at the start of each "on" block, the thread makes one look more
than it would: that counts against the probe. Rank 0 prints one JSON line: the step times of
each block, by arm.
"""

import argparse
import json
import os
import tempfile
import threading
import time

import torch
import torch.distributed as dist

import rankscope.probe

ap = argparse.ArgumentParser()
ap.add_argument("--framework", choices=("lightning", "trainer"), required=True)
ap.add_argument("--blocks", type=int, default=50, help="pairs of off/on blocks")
ap.add_argument("--block", type=int, default=20, help="steps per block")
ap.add_argument("--warmup", type=int, default=20, help="steps before the first block")
args = ap.parse_args()
STEPS = args.warmup + 2 * args.blocks * args.block
clock = time.perf_counter_ns


class Gate:
    """Stands in for the probe thread's stop event: while closed, the thread sleeps at its
    next wait (cut short), until the gate opens again or the probe stops."""

    def __init__(self, stop: threading.Event):
        self.stop = stop
        self.cond = threading.Condition()
        self.closed = False
        self.parked = False

    def is_set(self) -> bool:
        return self.stop.is_set()

    def set(self) -> None:
        self.stop.set()
        with self.cond:
            self.cond.notify_all()

    def wait(self, timeout: float) -> bool:
        with self.cond:
            self.cond.wait_for(lambda: self.closed or self.stop.is_set(), timeout)
            self.parked = True
            self.cond.notify_all()
            self.cond.wait_for(lambda: not self.closed or self.stop.is_set())
            self.parked = False
        return self.stop.is_set()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.parked or self.stop.is_set(), 5.0)

    def open(self) -> None:
        with self.cond:
            self.closed = False
            self.cond.notify_all()


class Switch:
    """Times the steps and switches the probe between blocks (see the module docstring)."""

    def __init__(self):
        self.probe = rankscope.probe.current()
        assert self.probe is not None, "run under rankscope's bootstrap"
        self.gate = Gate(self.probe._stop)
        self.probe._stop = self.gate
        self.wrappers = [(m, name, getattr(m, name)) for m, name, _ in self.probe._originals]
        self.times: dict[str, list[list[int]]] = {"off": [], "on": []}
        self.step = 0
        self.mode: str | None = None
        self.last = 0

    def _set(self, mode: str | None) -> None:
        if mode == "off" and self.mode != "off":
            self.gate.close()
            for module, name, fn in self.probe._originals:
                setattr(module, name, fn)
        elif mode != "off" and self.mode == "off":
            for module, name, fn in self.wrappers:
                setattr(module, name, fn)
            self.gate.open()
        self.mode = mode
        # the arm is what it says: torch's own function while off, the probe's wrapper while on
        assert getattr(dist.all_reduce, "__rankscope__", False) == (mode != "off")

    def step_end(self) -> None:
        now = clock()
        if self.mode is not None:
            self.times[self.mode][-1].append(now - self.last)
        self.step += 1
        k = self.step - args.warmup
        if k >= 0 and k % args.block == 0:
            b = k // args.block  # the block that starts now
            if b >= 2 * args.blocks:
                self._set(None)  # the probe on, untimed, to the end
            else:
                pair, second = divmod(b, 2)
                first = "off" if pair % 2 == 0 else "on"
                mode = first if not second else ("on" if first == "off" else "off")
                self._set(mode)
                self.times[mode].append([])
        self.last = clock()

    def finish(self) -> None:
        self._set(None)
        self.probe._stop = self.gate.stop
        if dist.get_rank() == 0:
            print(json.dumps({"framework": args.framework, **self.times}), flush=True)


switch = Switch()

if args.framework == "lightning":
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            return self.layer(batch[0]).pow(2).mean()

        def on_train_batch_end(self, *_):
            switch.step_end()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    world = int(os.environ["WORLD_SIZE"])
    data = DataLoader(TensorDataset(torch.randn(STEPS * world, 4)), batch_size=1)
    L.Trainer(
        accelerator="cpu",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        strategy="ddp",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    ).fit(Model(), data)
else:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def forward(self, x, labels):
            return {"loss": (self.layer(x).squeeze(-1) - labels).pow(2).mean()}

    class Timed(TrainerCallback):
        def on_step_end(self, *_, **__):
            switch.step_end()

    data = [{"x": torch.randn(4), "labels": torch.randn(())} for _ in range(64)]
    Trainer(
        model=Tiny(),
        args=TrainingArguments(
            output_dir=tempfile.mkdtemp(),
            use_cpu=True,
            per_device_train_batch_size=1,
            max_steps=STEPS,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            dataloader_num_workers=0,
        ),
        train_dataset=data,
        callbacks=[Timed()],
    ).train()
switch.finish()
if dist.is_initialized():
    dist.destroy_process_group()
