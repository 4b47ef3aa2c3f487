"""A script launched without rankscope (plain torchrun) that installs the probe itself."""

import rankscope.probe

rankscope.probe.install()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
dist.all_reduce(torch.ones(2))
dist.destroy_process_group()
