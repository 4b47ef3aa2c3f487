
import json, os, pickle, sys, time, torch, torch.distributed as dist
from torch._C._distributed_c10d import _dump_nccl_trace
torch.cuda.set_device(0)
dist.init_process_group("nccl")
x = torch.ones(1 << 10, device="cuda")
for _ in range(50):
    dist.all_reduce(x)
torch.cuda.synchronize()
out = sys.argv[1]
with open(os.path.join(out, "nccl_trace_rank_0"), "wb") as f:
    f.write(_dump_nccl_trace())

def cost(n, **kw):
    t = time.perf_counter()
    for _ in range(n):
        _dump_nccl_trace(**kw)
    return (time.perf_counter() - t) / n * 1e3

active = dict(includeCollectives=True, includeStackTraces=False, onlyActive=True)
for _ in range(1950):
    dist.all_reduce(x)
torch.cuda.synchronize()
figures = {"entries": 2000, "active_read_ms_none_active": cost(200, **active),
           "full_read_ms_no_stacks": cost(20, includeStackTraces=False)}
torch.cuda._sleep(int(3 * torch.cuda.get_device_properties(0).clock_rate * 1000))
for _ in range(8):
    dist.all_reduce(x)
d = pickle.loads(_dump_nccl_trace(**active))
figures["active_read_ms_8_active"] = cost(200, **active)
figures["states_while_blocked"] = [e.get("state") for e in d["entries"]]
torch.cuda.synchronize()
figures["torch"] = torch.__version__
figures["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
figures["device"] = torch.cuda.get_device_name(0)
with open(os.path.join(out, "fr_read_cost.json"), "w") as f:
    json.dump(figures, f, indent=1)
dist.destroy_process_group()
