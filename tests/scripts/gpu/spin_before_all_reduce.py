"""One rank on nccl: a few healthy steps, then a kernel that spins (``torch.cuda._sleep``) in
front of an all_reduce. The all_reduce is enqueued behind it and never starts; the rank waits
in ``.item()`` (a stream synchronize, which spins a core). With ``healthy``, every step's
kernel ends after about ``SLEEP_S`` seconds (a job of long kernels) and the job finishes."""

import os
import sys

import torch
import torch.distributed as dist

torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
dist.init_process_group("nccl")
x = torch.ones(1, device="cuda")
# the device's clock in cycles a second (clock_rate is in kHz; an H100 runs near 1.98 GHz)
hz = getattr(torch.cuda.get_device_properties(0), "clock_rate", 1_500_000) * 1000
healthy = sys.argv[1:] == ["healthy"]
for step in range(8):
    if healthy:
        torch.cuda._sleep(int(float(os.environ.get("SLEEP_S", "1.0")) * hz))
    elif step == 4:
        torch.cuda._sleep(1 << 62)  # site: spin
    dist.all_reduce(x)  # site: all_reduce
    x.item()  # site: wait
dist.destroy_process_group()
