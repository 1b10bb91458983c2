"""ups doctor's DDP smoke test, run by torchrun on 2 ranks (see ups.doctor.checks.check_ddp).

A job entry point like the others: it imports torch, so it lives here, not in ups.doctor.
"""

import os

import torch
import torch.distributed as dist

backend = os.environ.get("UPS_DOCTOR_BACKEND", "gloo")
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else torch.device("cpu")
dist.init_process_group(backend)
t = torch.ones(1, device=device)
dist.all_reduce(t)
assert t.item() == dist.get_world_size(), t
dist.destroy_process_group()
print("ok", flush=True)
