"""Rank program of `cpudist hosts bench`: gloo all-reduce of fp32 tensors, the median time of each
size.

    mpiexec.hydra -launcher ssh -f HOSTFILE -np 2 -ppn 1 \\
        -genv MASTER_ADDR head -genv MASTER_PORT 29500 \\
        python -m cpudist.hosts.bench_rank --sizes 1000000,64000000 --iters 10 --warmup 2

Every rank times each all-reduce between barriers; an iteration takes as long as its slowest rank
(the times are all-reduced with MAX), and rank 0 prints the median per size as one event line.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist

from cpudist.cpu import read_cpu
from cpudist.train.dist import discover_rank, exit_rank, init_distributed, shutdown_distributed
from cpudist.wire import events, programs


def time_size(nbytes: int, iters: int, warmup: int) -> float:
    """Median seconds of one all-reduce of `nbytes` of fp32, over `iters` timed calls after
    `warmup`."""
    # The values do not matter to gloo; zeros never overflow to inf over repeated sums.
    tensor = torch.zeros(max(1, nbytes // 4), dtype=torch.float32)
    for _ in range(warmup):
        dist.all_reduce(tensor)
    times = torch.zeros(iters, dtype=torch.float64)
    for i in range(iters):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        times[i] = time.perf_counter() - start
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return float(statistics.median(times.tolist()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=programs.usage(programs.BENCH_RANK))
    parser.add_argument("--sizes", required=True, help="bytes per all-reduce, comma-separated")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=300,
                        help="seconds before a missing peer fails")
    args = parser.parse_args(argv)
    info = discover_rank(os.environ)
    init_distributed(info, "gloo", os.environ, args.timeout)
    hosts: list[object] = [None] * info.world_size
    dist.all_gather_object(hosts, socket.gethostname())
    sizes = [int(s) for s in args.sizes.split(",")]
    medians = [time_size(n, args.iters, args.warmup) for n in sizes]
    if info.rank == 0:
        events.emit(events.BENCH, hosts=hosts, sizes=sizes, medians=medians, iters=args.iters,
                    warmup=args.warmup, world_size=info.world_size, cpu=read_cpu().summary())
    shutdown_distributed()


if __name__ == "__main__":
    main()
    exit_rank(0)
