"""Ranks for test_sync_exchange: every --sync strategy on a small model, over real gloo.

    # root: loopback counts our bytes
    unshare --net -- python -m tests.integration.exchange_ranks OUT 2 count
    # anywhere: no byte counts
    python -m tests.integration.exchange_ranks OUT 2

The launcher starts WORLD ranks of this module. Each rank runs every case of CASES on a fresh model
(the same on every rank) for STEPS steps of its own data. In each step it first computes its own
gradients without any exchange (under torch's `no_sync` for DDP), then runs the step the way
cpudist's loop does (`skip()` around all but the last micro-batch, `gradients()`, the optimizer,
`parameters()`), and keeps both: the test checks what the exchange made of the ranks' own gradients.
Rank 0 reads loopback's sent-bytes counter between barriers around each micro-batch and each step
(from /proc/self/net/dev: unshare does not remount /sys, whose counters stay the outer namespace's);
inside a network namespace of its own, that counter sees this job's traffic only. Every rank writes
OUT/rank<R>.pt.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

MODULE = "tests.integration.exchange_ranks"
# all ranks, every case: about 15 s here, 40 s with six test sessions sharing 2 cores
DEADLINE_S = 300
# this process's network namespace (/sys/class/net may show another one's)
NET_DEV = Path("/proc/self/net/dev")
STEPS = 5
# rows per rank and micro-batch: each weight's gradient has rank <= ROWS x ranks (see PowerSGD's
# case)
ROWS = 2
# (name, SyncSpec fields, micro-batches per step)
CASES: list[tuple[str, dict[str, Any], int]] = [
    ("ddp", {"strategy": "ddp"}, 1),
    ("ddp+bf16", {"strategy": "ddp", "grad_compression": "bf16"}, 1),
    ("ddp+fp16", {"strategy": "ddp", "grad_compression": "fp16"}, 1),
    ("ddp+powersgd:1", {"strategy": "ddp", "grad_compression": "powersgd", "powersgd_rank": 1}, 1),
    ("ddp+powersgd:4", {"strategy": "ddp", "grad_compression": "powersgd", "powersgd_rank": 4}, 1),
    ("ddp+accum", {"strategy": "ddp"}, 2),
    ("allreduce", {"strategy": "allreduce"}, 1),
    ("gather-scatter", {"strategy": "gather-scatter"}, 1),
    ("local-sgd:2", {"strategy": "local-sgd", "sync_every": 2, "local_sgd_warmup": 1}, 1),
]
# On a model with a word embedding (token_model): ddp leaves it out, sends the rows a step touched
# (sync.EmbeddingRows)
TOKEN_CASES: list[tuple[str, dict[str, Any], int]] = [
    ("tokens:ddp", {"strategy": "ddp"}, 1),
    ("tokens:ddp+bf16", {"strategy": "ddp", "grad_compression": "bf16"}, 1),
    ("tokens:ddp+accum", {"strategy": "ddp"}, 2),
    ("tokens:ddp+dense-emb", {"strategy": "ddp", "embedding_sync": "dense"}, 1),
]
# token ids per row: 2 rows of 6 touch at most 12 of the vocabulary's rows per rank and micro-batch
TOKENS = 6


def model(hidden: int) -> Any:
    """Three layers: two weights PowerSGD compresses (at rank 1 and 4), biases and a 2-row weight it
    does not."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(96, hidden), torch.nn.Tanh(),
                               torch.nn.Linear(hidden, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))


def token_model(vocab: int, dim: int) -> Any:
    """A word embedding (mean-pooled) under two layers, found as transformers models find theirs."""
    import torch

    class TokenModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, dim)
            self.head = torch.nn.Sequential(torch.nn.Linear(dim, 32), torch.nn.Tanh(),
                                            torch.nn.Linear(32, 2))

        def get_input_embeddings(self) -> torch.nn.Embedding:
            return self.embed

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.embed(ids).mean(1))

    torch.manual_seed(0)
    return TokenModel()


def sent() -> tuple[int, int, int] | None:
    """(bytes, packets, bytes sent again) of loopback, read on rank 0 once every rank got here (None
    when not counting)."""
    import torch.distributed as dist

    dist.barrier()
    if os.environ.get("EXCHANGE_COUNT") != "1" or dist.get_rank() != 0:
        return None
    return (*lo_sent(), retransmitted())


def lo_sent() -> tuple[int, int]:
    """Loopback's transmitted (bytes, packets) in this process's network namespace."""
    for line in NET_DEV.read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == "lo":
            tx = counters.split()[8:10]  # receive has 8 columns, then transmit's bytes and packets
            return int(tx[0]), int(tx[1])
    raise RuntimeError(f"no lo in {NET_DEV}")


def retransmitted() -> int:
    """Payload bytes TCP has sent again on this namespace's connections (`ss`'s bytes_retrans, shown
    when not 0). Loopback drops frames when a starved CPU lets its backlog fill: a 2-rank all-reduce
    once counted two 64 KiB segments more than its payload on a busy 2-core CI machine; loopback
    counted them, the exchange did not."""
    out = subprocess.run(["ss", "-tinH"], capture_output=True, text=True, check=True).stdout
    return sum(int(n) for n in re.findall(r"bytes_retrans:(\d+)", out))


def between(start: tuple[int, ...] | None, end: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """What each counter grew by (a connection closed in between takes its retransmits along: never
    below 0)."""
    if start is None or end is None:
        return None
    return tuple(max(0, b - a) if i == 2 else b - a for i,
                 (a, b) in enumerate(zip(start, end, strict=True)))


def run_case(name: str, fields: dict[str, Any], micro: int, rank: int, world: int, hidden: int,
             keep: bool) -> dict[str, Any]:
    """STEPS steps of one case: per step, this rank's own gradients and what the exchange gave (when
    `keep`), and loopback's (bytes, packets) per micro-batch and after the optimizer step. A
    `tokens:` case trains token_model, of a vocabulary of 8 x `hidden` rows of `hidden // 16` (the
    wide one: 32,768 x 256)."""
    import torch

    from cpudist.strategies import SyncSpec
    from cpudist.train import sync

    tokens = name.startswith("tokens:")
    net = token_model(8 * hidden, hidden // 16) if tokens else model(hidden)
    strategy = sync.make(net, SyncSpec(bucket_cap_mb=0.05, **fields), world)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    strategy.use(opt)
    # two empty windows: what the barriers alone send
    idle = [between(sent(), sent()) for _ in range(2)]
    steps = []
    for step in range(1, STEPS + 1):
        gen = torch.Generator().manual_seed(1000 * step + rank)  # each rank its own data
        batches = [(torch.randint(0, 8 * hidden, (ROWS, TOKENS), generator=gen) if tokens
                    else torch.randn(ROWS, 96, generator=gen),
                    torch.randint(0, 2, (ROWS,), generator=gen))
                   for _ in range(micro)]
        before = strategy.rows.rows_synced if getattr(strategy, "rows", None) is not None else None
        record = one_step(strategy, opt, batches, step)
        # embedding rows sent
        record["rows"] = None if before is None else strategy.rows.rows_synced - before
        steps.append(record if keep else {**record, "own": [], "got": []})
    return {"name": name, "spec": fields, "micro": micro,
            "shapes": [tuple(p.shape) for p in net.parameters()], "idle_sent": idle, "steps": steps}


def one_step(strategy: Any, opt: Any, batches: list[tuple[Any, Any]], step: int) -> dict[str, Any]:
    """This rank's own gradients of `batches` (no exchange), then the step as cpudist's loop takes
    it."""
    import torch

    model = strategy.model
    params = [p for p in model.parameters()]

    def backward(x: Any, y: Any) -> None:
        torch.nn.functional.cross_entropy(model(x), y).backward()

    alone = model.no_sync() if isinstance(model, torch.nn.parallel.DistributedDataParallel) \
        else contextlib.nullcontext()
    with alone:
        for x, y in batches:
            backward(x, y)
    own = [p.grad.detach().clone() for p in params]
    opt.zero_grad(set_to_none=True)
    windows = []
    for k, (x, y) in enumerate(batches):
        start = sent()
        if k < len(batches) - 1:
            with strategy.skip():  # the loop's way: no exchange before the last micro-batch
                backward(x, y)
        else:
            backward(x, y)
            strategy.gradients(step)
        windows.append(between(start, sent()))
    got = [p.grad.detach().clone() for p in params]
    start = sent()
    opt.step()
    strategy.parameters(step)
    after = between(start, sent())
    opt.zero_grad(set_to_none=True)
    return {"own": own, "got": got, "micro_sent": windows, "after_sent": after}


def rank_main(out: Path) -> None:
    import torch
    import torch.distributed as dist

    # the own-gradient pass and the exchanged one compute the very same numbers
    torch.set_num_threads(1)
    # a rank that died ends its peers
    dist.init_process_group("gloo", timeout=timedelta(seconds=DEADLINE_S))
    rank, world = dist.get_rank(), dist.get_world_size()
    # Small layers keep every number for the exactness checks; wide ones make payloads dwarf gloo's
    # framing (a few hundred bytes per collective) for the byte counts.
    exact = [run_case(name, fields, micro, rank, world, 160, True) for name, fields, micro in CASES
             + TOKEN_CASES]
    wide = [run_case(name, fields, micro, rank, world, 4096, False) for name, fields,
            micro in CASES + TOKEN_CASES]
    torch.save({"rank": rank, "world": world, "counted": os.environ.get("EXCHANGE_COUNT") == "1",
                "exact": exact, "wide": wide}, out / f"rank{rank}.pt")
    # Leave without tearing gloo down one by one (see test_local_sgd_moments): what matters is
    # saved.
    dist.barrier()
    os._exit(0)


def launch(out: Path, world: int, count: bool) -> int:
    """Start `world` ranks of this module here (inside the caller's network namespace); their exit
    code."""
    from cpudist.launch.tools import free_port

    if count:
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    env = {**os.environ, "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()),
           "OMP_NUM_THREADS": "1", "EXCHANGE_COUNT": "1" if count else "0"}
    procs = [subprocess.Popen([sys.executable, "-m", MODULE, "rank", str(out)],
                              env={**env, "RANK": str(r)})
             for r in range(world)]
    deadline = time.monotonic() + DEADLINE_S
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()  # only the ranks this launcher started
            return 124
    return max(codes)


if __name__ == "__main__":
    if sys.argv[1] == "rank":
        rank_main(Path(sys.argv[2]))
    else:
        sys.exit(launch(Path(sys.argv[1]), int(sys.argv[2]), count=len(sys.argv) > 3
                        and sys.argv[3] == "count"))
