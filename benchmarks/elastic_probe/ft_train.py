"""One torchft replica group (1 process) training a tiny MLP; logs one JSON line per step.

    TORCHFT_LIGHTHOUSE=http://HOST:29510 python ft_train.py REPLICA_ID STEPS LOGFILE

The global batch of step s is drawn from seed s and cut into num_participants() shards, so the
global batch and lr stay the same whatever the number of live replicas. STEP_WORK_S sleeps to
stand for a transformer's compute per step.
"""

import json
import os
import socket
import sys
import time
from datetime import timedelta

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed import TCPStore
from torchft import DistributedDataParallel, Manager, ProcessGroupGloo

RID, STEPS, LOG = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
GLOBAL_BATCH = 96
WORK_S = float(os.environ.get("STEP_WORK_S", "0.2"))
PG_TIMEOUT = float(os.environ.get("PG_TIMEOUT_S", "10"))
HOST = os.environ.get("BIND_HOST", "127.0.0.1")
STORE_PORT = 29600 + RID
T_START = time.time()

store = TCPStore(HOST, STORE_PORT, is_master=True, wait_for_workers=False)
torch.manual_seed(1234)  # same init everywhere; a joiner is overwritten from a live peer anyway
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
healed_at = []


def state_dict():
    return {"model": model.state_dict(), "optim": opt.state_dict()}


def load_state_dict(sd):
    model.load_state_dict(sd["model"])
    opt.load_state_dict(sd["optim"])
    healed_at.append(time.time())


manager = Manager(
    pg=ProcessGroupGloo(timeout=timedelta(seconds=PG_TIMEOUT)),
    min_replica_size=1,
    load_state_dict=load_state_dict,
    state_dict=state_dict,
    replica_id=f"rep_{RID}",
    store_addr=HOST,
    store_port=STORE_PORT,
    rank=0,
    world_size=1,
    hostname=os.environ.get("ADVERTISE_HOST", socket.gethostname()),
    use_async_quorum=False,
    timeout=timedelta(seconds=PG_TIMEOUT),
    quorum_timeout=timedelta(seconds=60),
    connect_timeout=timedelta(seconds=10),
)
MODE = os.environ.get("GRAD_SYNC", "flat")  # flat: one manager.allreduce; ddp: torchft's DDP
ddp = DistributedDataParallel(manager, model) if MODE == "ddp" else model


def sync_flat_grads():
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    manager.allreduce(flat).wait()  # errors are swallowed and reported to should_commit
    off = 0
    for g in grads:
        g.copy_(flat[off:off + g.numel()].view_as(g))
        off += g.numel()


log = open(LOG, "a", buffering=1)  # noqa: SIM115 (open for the whole run)
log.write(json.dumps({"event": "start", "rid": RID, "t": T_START, "pid": os.getpid()}) + "\n")

while manager.current_step() < STEPS:
    t0 = time.time()
    manager.start_quorum()  # synchronous: heals from a live peer before returning
    n, r = manager.num_participants(), manager.participating_rank()
    step = manager.current_step()
    g = torch.Generator().manual_seed(step)
    x = torch.randn(GLOBAL_BATCH, 64, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    # a non-participating replica still joins the allreduce (torchft zeroes its gradients)
    xs, ys = (x[:1], y[:1]) if r is None else (x[r::n], y[r::n])
    opt.zero_grad(set_to_none=False)
    loss = F.cross_entropy(ddp(xs), ys)
    time.sleep(WORK_S)
    loss.backward()
    if MODE != "ddp":
        sync_flat_grads()
    ok = manager.should_commit()
    if ok:
        opt.step()
    psum = float(sum(p.detach().double().sum() for p in model.parameters()))
    rec = {"event": "step", "rid": RID, "t": time.time(), "dt": time.time() - t0,
           "step": step, "committed": ok, "n": n, "r": r, "loss": float(loss.detach()),
           "psum": round(psum, 6), "healed": len(healed_at)}
    log.write(json.dumps(rec) + "\n")
log.write(json.dumps({"event": "end", "rid": RID, "t": time.time()}) + "\n")
manager.shutdown(wait=False)
