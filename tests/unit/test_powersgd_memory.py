"""PowerSGD's memory survives a checkpoint and DDP's bucket rebuild: a resumed DDP computes the same
gradients.

A real DistributedDataParallel over a one-rank gloo group, with cpudist's PowerSGD hook (rank 1,
error feedback, warm start, compressing from the third step). Its compression still loses what a
rank-1 approximation cannot hold, so error feedback and Q carry real state from step to step. A
fresh DDP (as a resumed process builds) starts with one bucket of every parameter and rebuilds them
after its first step; given the first one's state it must produce the very same gradients; without
it, other ones.

The gloo group lives in a child interpreter that leaves by os._exit: gloo's threads now and then
abort a process after destroy_process_group (cpudist's ranks leave the same way, train/dist.py), and
in the test worker that abort took the worker down and left pytest-xdist waiting for it for ever.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cpudist.strategies import SyncSpec
from cpudist.train import sync

# The resumed gradients equal the straight run's to the last bits the CPU's GEMM keeps: the first
# step of the fresh DDP compresses from one bucket of every parameter where the straight run had
# rebuilt several, so each matrix is a view at another offset, and AVX2 kernels (seen on an AMD
# EPYC) round differently on differently aligned rows (2.8e-9 on gradients of ~1e-2, 2 ulps), where
# AMX/AVX-512 machines gave identical bits. A checkpoint without the memory moves them by ~1e-2,
# four orders above this bound.
EPS = torch.finfo(torch.float32).eps
ULPS = 16
SPEC = SyncSpec(strategy="ddp", grad_compression="powersgd", powersgd_rank=1, powersgd_start=2,
                bucket_cap_mb=0.002)


ROOT = Path(__file__).resolve().parents[2]


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.Tanh(), torch.nn.Linear(24, 20),
                               torch.nn.Tanh(), torch.nn.Linear(20, 3))


def batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(8, 16, generator=g) for _ in range(8)]


def train(strategy: sync.Strategy, opt: torch.optim.Optimizer,
          xs: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The gradients each step applied, after the exchange."""
    seen = []
    for x in xs:
        strategy.model(x).pow(2).mean().backward()
        seen.append([p.grad.clone() for p in strategy.trained if p.grad is not None])
        opt.step()
        opt.zero_grad(set_to_none=True)
    return seen


def resumed(saved: dict[str, Any], load: bool) -> tuple[sync.Strategy, torch.optim.Optimizer]:
    model = net()
    model.load_state_dict(saved["model"])
    strategy = sync.DDP(model, SPEC, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.load_state_dict(saved["opt"])
    if load:
        strategy.load(saved["sync"], saved["mine"])
    return strategy, opt


def test_a_fresh_ddp_given_the_saved_memory_computes_the_straight_runs_gradients() -> None:
    code = "import os, tests.unit.test_powersgd_memory as t; t.in_one_rank_group(); os._exit(0)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def in_one_rank_group() -> None:
    """The check, in a one-rank gloo group of this (child) process."""
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        check()


def check() -> None:
    model = net()
    strategy = sync.DDP(copy.deepcopy(model), SPEC, 1)
    opt = torch.optim.SGD(strategy.model.parameters(), lr=0.1)
    straight = train(strategy, opt, batches())

    strategy = sync.DDP(model, SPEC, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first = train(strategy, opt, batches()[:4])
    assert all(torch.equal(a, b) for x, y in zip(straight[:4], first, strict=True) for a,
               b in zip(x, y, strict=True))
    # DDP rebuilt its first bucket into several
    assert strategy.memory is not None and len(strategy.memory.layout) > 1
    shared, mine = strategy.state()["powersgd"], strategy.rank_state()["powersgd"]
    # the weights are compressed
    assert shared["iter"] == 4 and all(q is not None for q in shared["q"][::2])
    # what rank 1 approximations left out
    assert all(e is not None and e.abs().sum() > 0 for e in mine["error"][::2])
    saved = {"model": copy.deepcopy(model.state_dict()), "opt": copy.deepcopy(opt.state_dict()),
             "sync": copy.deepcopy(strategy.state()), "mine": copy.deepcopy(strategy.rank_state())}

    going_on = train(*resumed(saved, load=True), batches()[4:])
    for n, (x, y) in enumerate(zip(straight[4:], going_on, strict=True), start=5):
        for a, b in zip(x, y, strict=True):
            torch.testing.assert_close(b, a, rtol=ULPS * EPS, atol=ULPS * EPS
                                       * a.abs().max().item(),
                                       msg=lambda m, n=n: f"step {n} differs: {m}")
    # what a checkpoint without it would do
    forgot = train(*resumed(saved, load=False), batches()[4:])
    assert max((a - b).abs().max().item() / a.abs().max().item()
               for a, b in zip(straight[4], forgot[0], strict=True)) > 1000 * ULPS * EPS
