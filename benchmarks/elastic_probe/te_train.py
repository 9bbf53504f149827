"""A torchrun worker: tiny MLP under torch DDP over gloo, checkpointing to a shared folder.

    torchrun --nnodes 1:3 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29400 \
        --rdzv-id probe46 --max-restarts 5 te_train.py STEPS RUN_DIR

Every (re)start resumes from RUN_DIR/ckpt.pt; the global batch of step s is drawn from seed s and
cut into WORLD_SIZE shards. One JSON line per step goes to RUN_DIR/worker-<node>.jsonl.
"""

import json
import os
import sys
import time
from datetime import timedelta

T_START = time.time()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

STEPS, RUN = int(sys.argv[1]), sys.argv[2]
GLOBAL_BATCH, CKPT_EVERY = 96, int(os.environ.get("CKPT_EVERY", "10"))
WORK_S = float(os.environ.get("STEP_WORK_S", "0.2"))
NODE = os.environ.get("PROBE_NODE", "?")
log = open(os.path.join(RUN, f"worker-{NODE}.jsonl"), "a", buffering=1)  # noqa: SIM115


def emit(**kw):
    log.write(json.dumps(dict(kw, node=NODE, pid=os.getpid(), t=time.time())) + "\n")


emit(event="start", t_start=T_START, restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)))
dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ.get("PG_TIMEOUT_S",
                                                                                "30"))))
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(1234)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
step = 0
ckpt = os.path.join(RUN, "ckpt.pt")
if os.path.exists(ckpt):
    sd = torch.load(ckpt, weights_only=False)
    model.load_state_dict(sd["model"])
    opt.load_state_dict(sd["optim"])
    step = sd["step"]
ddp = nn.parallel.DistributedDataParallel(model)
emit(event="ready", rank=rank, world=world, resumed_step=step)

while step < STEPS:
    t0 = time.time()
    g = torch.Generator().manual_seed(step)
    x = torch.randn(GLOBAL_BATCH, 64, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    loss = F.cross_entropy(ddp(x[rank::world]), y[rank::world])
    time.sleep(WORK_S)
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    if rank == 0 and step % CKPT_EVERY == 0:
        torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step},
                   ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)
    psum = float(sum(p.detach().double().sum() for p in model.parameters()))
    emit(event="step", step=step, rank=rank, world=world, dt=time.time() - t0,
         loss=float(loss.detach()), psum=round(psum, 6))
emit(event="end")
dist.destroy_process_group()
