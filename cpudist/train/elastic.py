"""Elastic training across nodes (--elastic): each node is one torchft replica group, which the
Lighthouse on the head admits or drops step by step (why torchft and not torchrun's elastic agent:
benchmarks/elastic_probe/README.md).

Each node's rank trains in a torch.distributed world of its own, so whatever the loop agrees on
stays on the node; across nodes one flat average of the gradients (what ddp sends across nodes: the
word embedding's touched rows, in the wire's dtype) goes through torchft's Manager after backward,
and the optimizer steps only when every participant's exchange went through (`should_commit`). A
dropped step is trained again on the same rows. The global batch is the one of the planned node
count (REPLICAS), cut among the participants of each step's quorum, so neither it nor the learning
rate changes with the membership. A node that joins late or comes back gets the weights, optimizer,
scheduler and step from a live peer (torchft's HTTP transport), not from a checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch.distributed import ReduceOp

from cpudist.config import TrainConfig, resolved_compression
from cpudist.errors import BadInput
from cpudist.strategies import SyncSpec
from cpudist.train.embedding_rows import rows_wanted, word_embedding
from cpudist.train.exchange import wire_dtype
from cpudist.train.features import Encoded
from cpudist.train.sampling import global_batches
from cpudist.wire.elastic import ADVERTISE, EXCHANGE_TIMEOUT_S, LIGHTHOUSE, REPLICA_ID, REPLICAS


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


@dataclass(frozen=True, kw_only=True)
class Change:
    """The membership from a step on: how many nodes trained it, and when (s since the run's first
    node started: a node that joins takes its peers' history and origin, Replica.adopt); which
    nodes, those that left since the last change and those that joined (a node started again is in
    both when the quorum never went on without it)."""

    step: int
    replicas: int
    at_s: float
    nodes: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    joined: tuple[str, ...] = ()

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> Change:
        """A change as dataclasses.asdict left it (or JSON, or a record from before the names)."""
        return cls(step=int(d["step"]), replicas=int(d["replicas"]), at_s=float(d["at_s"]),
                   nodes=tuple(d.get("nodes", ())), left=tuple(d.get("left", ())),
                   joined=tuple(d.get("joined", ())))


def _name(replica_id: str) -> str:
    """A node's name (REPLICA_ID, node<i>) from torchft's replica id (that name, a uuid per
    process)."""
    return replica_id.split(":")[0]


class _Quorums:
    """torchft's client of this node's ManagerServer, keeping the replica ids of the last quorum it
    answered: the Manager keeps only their count, and who left or came back is the run's record
    (a node started again has a new id, even when the others never went on without it)."""

    def __init__(self, client: Any) -> None:
        self.client, self.ids = client, tuple[str, ...]()

    def _quorum(self, *args: Any, **kwargs: Any) -> Any:
        quorum = self.client._quorum(*args, **kwargs)
        self.ids = tuple(quorum.replica_ids)
        return quorum

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def _transport(host: str, timeout: timedelta) -> Any:
    """torchft's HTTP transport of a node's state to a joiner, at the address its peers reach this
    node at: torchft's own names socket.gethostname(), which may resolve to loopback
    (Debian's `127.0.1.1 <hostname>`) or to nothing on the peers."""
    from torchft.checkpointing.http_transport import HTTPTransport

    where = f"[{host}]" if ":" in host else host

    class Advertised(HTTPTransport[dict[str, Any]]):
        def address(self) -> str:
            return f"http://{where}:{self._server.socket.getsockname()[1]}/checkpoint/"

    return Advertised(timeout=timeout, num_chunks=0)


def wire_of(model: torch.nn.Module, sync: SyncSpec) -> tuple[torch.dtype | None, int | None]:
    """What the average sends across the nodes, as a ddp run across nodes does: the dtype of
    --grad-compression (auto: bf16) and the index among the trained parameters of the word
    embedding whose touched rows alone go (None: all of every gradient)."""
    compression = resolved_compression(sync.grad_compression, "ddp", True)
    spec = dataclasses.replace(sync, grad_compression=compression)
    found = word_embedding(model) if rows_wanted(spec) else None
    return wire_dtype(compression), (found[2] if found is not None else None)


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
        # a CUDA tracer's warning at each new quorum, meaningless on CPUs
        logging.getLogger("torchft.manager").addFilter(
            lambda record: "flight recorder" not in record.getMessage())
        # a silent peer (a cut link) holds the others up this long at most
        timeout = timedelta(seconds=min(timeout_s, EXCHANGE_TIMEOUT_S))
        host = env.get(ADVERTISE) or socket.gethostname()
        # the replica group's store is the node's own (MASTER_ADDR/PORT: its address, world 1),
        # which the quorum hands its peers
        self.manager = Manager(pg=ProcessGroupGloo(timeout=timeout), min_replica_size=1,
                               load_state_dict=load, state_dict=state,
                               checkpoint_transport=_transport(host, timeout),
                               replica_id=env.get(REPLICA_ID) or host, rank=0, world_size=1,
                               hostname=host, use_async_quorum=False, timeout=timeout,
                               quorum_timeout=max(timeout, timedelta(seconds=60)),
                               connect_timeout=timeout)
        # torchft 0.2's Manager asks its quorums through `_client` (pinned in constraints.txt)
        self.quorums = self.manager._client = _Quorums(self.manager._client)
        self.started, self.origin = time.monotonic(), time.time()
        # this process's start and step, not a peer's (adopt): what waits() reads
        self.began, self.first, self.trained = self.started, 0, False
        self.changes: list[Change] = []
        self.ids: tuple[str, ...] = ()  # the replica ids of the last change's quorum

    def record(self) -> dict[str, Any]:
        """The run's membership history as this node holds it, for a joiner (with the state)."""
        return {"origin": self.origin, "changes": [dataclasses.asdict(c) for c in self.changes],
                "ids": list(self.ids)}

    def adopt(self, record: Mapping[str, Any]) -> None:
        """A live peer's history replaces this node's (it was away, or just started): the changes
        while it was not there are the run's too, timed from the run's first start."""
        self.origin = float(record["origin"])
        self.started = time.monotonic() - (time.time() - self.origin)
        self.changes = [Change.of(c) for c in record["changes"]]
        self.ids = tuple(record.get("ids", ()))

    def saved(self) -> dict[str, Any]:
        """What a checkpoint keeps of this node's place in the run: the committed steps as
        torchft counts them, and the membership record."""
        return {"torchft": dict(self.manager.state_dict()), "record": self.record()}

    def resume(self, saved: Mapping[str, Any]) -> None:
        """Go on from a checkpoint's `saved()`: its step is this node's (a node at fewer steps
        heals from one at the most), its record the run's."""
        self.manager.load_state_dict({k: int(v) for k, v in saved["torchft"].items()})
        self.adopt(saved["record"])
        self.first = self.step

    @property
    def step(self) -> int:
        """Steps committed so far (a joiner's jumps to its peers' when it heals)."""
        return int(self.manager.current_step())

    def quorum(self) -> tuple[int | None, int]:
        """(this node's share, participants) of the next step; a node behind heals first."""
        self.manager.start_quorum()
        r = self.manager.participating_rank()
        return (None if r is None else int(r)), int(self.manager.num_participants())

    def waits(self, n: int, planned: int, wait_s: float) -> bool:
        """Whether this node holds the step of a quorum of `n` nodes back, to wait for the
        `planned`: at the run's start (no step committed by this process, and its step still the
        one it started from, so no node has trained since), for `wait_s` from this process's
        start at most. The first node up would otherwise train alone, the others healing from it
        as they come."""
        return (not self.trained and self.step == self.first and n < planned
                and time.monotonic() - self.began < wait_s)

    def note(self) -> Change | None:
        """The membership change of the quorum just formed, recorded (None if the same nodes)."""
        ids = self.quorums.ids
        if ids == self.ids:
            return None
        change = Change(
            step=self.step, replicas=len(ids), at_s=round(time.monotonic() - self.started, 3),
            nodes=tuple(sorted(_name(i) for i in ids)),
            left=tuple(sorted(_name(i) for i in set(self.ids) - set(ids))),
            joined=tuple(sorted(_name(i) for i in set(ids) - set(self.ids))))
        self.changes.append(change)
        self.ids = ids
        return change

    def average(self, params: list[torch.nn.Parameter], n: int, wire: torch.dtype | None = None,
                rows_at: int | None = None) -> float:
        """The `n` participants' mean gradient in every parameter's .grad (zeros where a node had
        none), sent in `wire`'s dtype (None: the gradients' own) and summed in it, divided in fp32
        once back; `rows_at`: the index in `params` of a word embedding, of which only the rows
        some participant touched are sent (embedding_rows.py: the others are zero on every node).
        Returns the seconds spent waiting for the exchanges; a failure is kept for commit() to
        report."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        sent = list(grads)
        waited = 0.0
        rows = None
        if rows_at is not None:
            touched = grads[rows_at].ne(0).any(dim=1).to(torch.uint8)
            t0 = time.perf_counter()
            self.manager.allreduce(touched, reduce_op=ReduceOp.MAX).wait()
            waited += time.perf_counter() - t0
            rows = touched.nonzero().squeeze(1)
            sent[rows_at] = grads[rows_at].index_select(0, rows)
        flat = torch.cat([g.reshape(-1) for g in sent])
        crossing = flat.to(wire) if wire is not None else flat
        t0 = time.perf_counter()
        self.manager.allreduce(crossing, reduce_op=ReduceOp.SUM).wait()
        waited += time.perf_counter() - t0
        flat = crossing.to(flat.dtype).div_(n)
        offset = 0
        for i, (p, g, part) in enumerate(zip(params, grads, sent, strict=True)):
            mean = flat[offset:offset + part.numel()].view_as(part)
            offset += part.numel()
            if i == rows_at and rows is not None:
                g.index_copy_(0, rows, mean)  # rows no participant touched stay zero
                p.grad = g
            else:
                p.grad = mean
        return waited

    def commit(self, hold: bool = False) -> bool:
        """Whether every participant's exchange went through (then the step counts); `hold`:
        this node has the step not count, for every participant."""
        if hold:
            self.manager.report_error(RuntimeError("waiting for the planned nodes"))
        committed = bool(self.manager.should_commit())
        self.trained = self.trained or committed
        return committed

    def close(self) -> None:
        self.manager.shutdown(wait=False)
