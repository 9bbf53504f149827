"""Elastic training across nodes (--elastic): each node is one torchft replica group, which the
Lighthouse on the head admits or drops step by step (why torchft and not torchrun's elastic agent:
benchmarks/elastic_probe/README.md).

Each node's rank trains in a torch.distributed world of its own, so whatever the loop agrees on
stays on the node; across nodes one flat average of the gradients goes through torchft's Manager
after backward, and the optimizer steps only when every participant's exchange went through
(`should_commit`). A dropped step is trained again on the same rows. The global batch is the one of
the planned node count (REPLICAS), cut among the participants of each step's quorum, so neither it
nor the learning rate changes with the membership. A node that joins late or comes back gets the
weights, optimizer, scheduler and step from a live peer (torchft's HTTP transport), not from a
checkpoint.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from cpudist.config import TrainConfig
from cpudist.errors import BadInput
from cpudist.train.features import Encoded
from cpudist.train.sampling import global_batches
from cpudist.wire.elastic_env import ADVERTISE, LIGHTHOUSE, REPLICA_ID, REPLICAS

# what the slice of --elastic built so far does not combine with, and why
REFUSED = (("compile", "static shapes per participant count are not planned yet"),
           ("checkpoint_every", "an elastic run's checkpoints are not resumable yet"),
           ("checkpoint_every_min", "an elastic run's checkpoints are not resumable yet"),
           ("resume", "an elastic run's checkpoints are not resumable yet"),
           ("checkpoint_s3", "an elastic run's checkpoints are not resumable yet"),
           ("model_s3", "every node would copy its model"))


def check(cfg: TrainConfig) -> None:
    """What --elastic takes: the grouped sampler, no accumulation, ddp (replaced by the flat
    average); refused in one line otherwise."""
    if not cfg.elastic:
        return
    if cfg.sampler != "grouped" or cfg.grad_accum != 1 or cfg.sync.strategy != "ddp":
        raise BadInput("--elastic trains with --sampler grouped, --grad-accum 1 and --sync ddp "
                       f"(given: {cfg.sampler}, {cfg.grad_accum}, {cfg.sync.strategy})",
                       "Drop the other --sampler, --grad-accum or --sync")
    for name, why in REFUSED:
        if getattr(cfg, name):
            flag = "--" + name.replace("_", "-")
            raise BadInput(f"{flag} with --elastic: {why}", f"Drop {flag}")


def planned_nodes(env: Mapping[str, str]) -> int:
    """REPLICAS: the nodes the run's global batch is planned for."""
    try:
        nodes = int(env.get(REPLICAS, ""))
    except ValueError:
        nodes = 0
    if nodes < 1:
        raise BadInput(f"--elastic: {REPLICAS} is not a node count ({env.get(REPLICAS)!r})",
                       f"Export {REPLICAS}=N, the nodes the run is planned for, to every node's "
                       "rank")
    return nodes


class Schedule:
    """The global batch of every step, by step number: a step trained again takes the same rows."""

    def __init__(self, cfg: TrainConfig, data: Encoded, nodes: int) -> None:
        self.lengths = [len(ids) for ids in data.input_ids]
        self.rows, self.seed, self.nodes = cfg.batch_size * nodes, cfg.seed, nodes
        self.epochs: dict[int, list[list[int]]] = {}
        self.per_epoch = len(self._epoch(0))
        if self.per_epoch == 0:
            raise BadInput(f"{len(self.lengths)} training row(s) cannot fill one global batch of "
                           f"{self.rows}", "Use more data, or a smaller --batch-size")

    def _epoch(self, epoch: int) -> list[list[int]]:
        if epoch not in self.epochs:  # a short last batch as fed_batches keeps it: a row a node
            self.epochs = {epoch: [b for b in global_batches(self.lengths, self.rows, self.seed,
                                                             epoch) if len(b) >= self.nodes]}
        return self.epochs[epoch]

    def at(self, step: int) -> tuple[int, int, list[int]]:
        """(epoch, index in it, rows) of step `step` (0-based)."""
        epoch, index = divmod(step, self.per_epoch)
        return epoch, index, self._epoch(epoch)[index]


@dataclass(frozen=True)
class Change:
    """The membership from a step on: how many nodes trained it, and when (s since this node's
    start)."""

    step: int
    replicas: int
    at_s: float


class Replica:
    """This node in the quorum: each step's participants, the gradients' average, the commit."""

    def __init__(self, state: Callable[[], dict[str, Any]],
                 load: Callable[[dict[str, Any]], None], env: Mapping[str, str],
                 timeout_s: int) -> None:
        try:
            from torchft import Manager, ProcessGroupGloo
        except ImportError:
            raise BadInput("--elastic needs torchft, which is not installed",
                           "pip install 'cpudist[elastic]' on every node") from None
        if not env.get(LIGHTHOUSE):
            raise BadInput(f"--elastic: {LIGHTHOUSE} is not set",
                           f"Export {LIGHTHOUSE}=http://HEAD:PORT (a torchft_lighthouse) to every "
                           "node's rank")
        timeout = timedelta(seconds=timeout_s)
        host = env.get(ADVERTISE) or socket.gethostname()
        # the replica group's store is the node's own rendezvous (MASTER_ADDR/PORT): world 1
        self.manager = Manager(pg=ProcessGroupGloo(timeout=timeout), min_replica_size=1,
                               load_state_dict=load, state_dict=state,
                               replica_id=env.get(REPLICA_ID) or host, rank=0, world_size=1,
                               hostname=host, use_async_quorum=False, timeout=timeout,
                               quorum_timeout=max(timeout, timedelta(seconds=60)),
                               connect_timeout=timeout)
        self.started = time.monotonic()
        self.changes: list[Change] = []

    @property
    def step(self) -> int:
        """Steps committed so far (a joiner's jumps to its peers' when it heals)."""
        return int(self.manager.current_step())

    def quorum(self) -> tuple[int | None, int]:
        """(this node's share, participants) of the next step; a node behind heals first."""
        self.manager.start_quorum()
        n, r = int(self.manager.num_participants()), self.manager.participating_rank()
        if not self.changes or self.changes[-1].replicas != n:
            self.changes.append(Change(self.step, n, round(time.monotonic() - self.started, 3)))
        return (None if r is None else int(r)), n

    def average(self, params: list[torch.nn.Parameter]) -> None:
        """The participants' mean gradient in every parameter's .grad (zeros where a node had
        none); a failure is kept for commit() to report."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.manager.allreduce(flat).wait()
        offset = 0
        for p, g in zip(params, grads, strict=True):
            p.grad = flat[offset:offset + g.numel()].view_as(g)
            offset += g.numel()

    def commit(self) -> bool:
        """Whether every participant's exchange went through (then the step counts)."""
        return bool(self.manager.should_commit())

    def close(self) -> None:
        self.manager.shutdown(wait=False)
