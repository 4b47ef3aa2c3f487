
import datetime, os, sys, torch, torch.distributed as dist
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=10))
x = torch.ones(1, device="cuda")
for step in range(6):
    if step == 5:
        # a kernel that outlives the timeout (one that never ends leaves the process hung in
        # its abort, after the dump)
        torch.cuda._sleep(int(25 * torch.cuda.get_device_properties(0).clock_rate * 1000))
    dist.all_reduce(x)
    x.item()
