"""The sync strategies as data: one row per `--sync`, read by the traffic model
(cpudist/traffic.py), the planner (cpudist/results/planner.py), the option checks (sync_flags) and,
through its name, the trainer.

A new strategy is one Strategy class in cpudist/train/sync.py (how ranks exchange) and one row in
TABLE (its knobs, its label, whether DDP-style overlap hides its traffic, its accuracy risk, its
traffic plan). A SyncSpec is TrainConfig.sync, its knobs named as their flags name them (the
strategy, `--sync`, excepted); result.json records the resolved one as `sync_options`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cpudist.errors import BadInput

COMPRESSIONS = ("none", "bf16", "fp16", "powersgd")
RING, GATHER_SCATTER = "ring", "gather-scatter"  # the collectives a strategy's exchanges use
# knobs every strategy accepts (DDP's buckets, local SGD's; the others ignore it)
SHARED = ("bucket_cap_mb",)
# What result.json's sync_options called the knobs in earlier cpudist versions.
OLD_NAMES = {"sync": "strategy", "compression": "grad_compression",
             "warmup_steps": "local_sgd_warmup",
             "outer": "outer_optimizer", "moments": "average_moments"}
RISKS = {  # what a strategy does to the optimization, as the plan's recommendation states it
    "bf16": "gradients are rounded to bf16 before averaging "
            "(a small change; check the metric once)",
    "powersgd": "PowerSGD averages a low-rank approximation of the gradients (error feedback keeps "
                "the rest for later): it changes the optimization, "
                "so compare the metric with a ddp run",
    "local-sgd": "local SGD lets every rank take {k} steps on its own between model averages: it "
                 "changes the optimization, so compare the metric with a ddp run",
}


@dataclass(kw_only=True, frozen=True)
class SyncSpec:
    """How the ranks agree on the model: the strategy and its knobs (TrainConfig.sync).

    As asked (ASKED, `cpudist run`'s flags) grad_compression may be auto, which the rank resolves
    (config.resolved_compression); `spec_of` gives the resolved spec a run trains with, which is
    what labels, traffic plans and result.json describe.
    """

    strategy: str = field(default="ddp", metadata={"flag": "sync"})
    # ddp: none | bf16 | fp16 | powersgd; local-sgd: none | bf16; asked: also auto
    grad_compression: str = "none"
    powersgd_rank: int = 1  # --grad-compression powersgd:RANK
    # steps of plain fp32 all-reduce before PowerSGD compresses (spec_of: a share of the run)
    powersgd_start: int = 2
    bucket_cap_mb: float = 25.0
    # ddp: rows (the word embedding's touched rows only, after backward) | dense
    embedding_sync: str = "rows"
    sync_every: int = 8  # local-sgd: K, steps between parameter averages
    local_sgd_warmup: int = 0  # local-sgd: synchronous (gradient-averaging) steps first
    outer_optimizer: str = "none"  # local-sgd: none | nesterov (DiLoCo's outer optimizer)
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    # local-sgd: AdamW's moments averaged with the parameters: none|first|second|both
    average_moments: str = "none"
    # local-sgd: the second moment joins every J-th average only (it moves slowly)
    second_moment_every: int = 1

    @property
    def row(self) -> Sync:
        """This strategy's row of TABLE."""
        return TABLE[self.strategy]

    @property
    def label(self) -> str:
        """Short name for tables: ddp, ddp+bf16, ddp+powersgd:2, local-sgd:8, diloco:8, ..."""
        return self.row.label(self)


@dataclass(kw_only=True, frozen=True)
class Phase:
    """A stretch of a run's traffic plan: `count` exchanges of the same payload."""

    count: float  # exchanges in the run
    # how the payload crosses: none (fp32 gradients), bf16, fp16, powersgd
    compression: str = "none"
    powersgd_rank: int = 1
    # payloads of the gradients' size per exchange (local SGD: the parameters, then a moment)
    copies: int = 1
    calls: float = 1.0  # collective calls per exchange, per bucket when `per_bucket`
    per_bucket: bool = True


@dataclass(kw_only=True, frozen=True)
class Sync:
    """One `--sync` strategy, as the planner, the traffic model and the option checks see it (its
    code: the Strategy class of the same name in cpudist/train/sync.py)."""

    name: str
    knobs: tuple[str, ...]  # TrainConfig knobs it takes, besides --sync and SHARED ones
    collective: str  # RING or GATHER_SCATTER
    hides: bool  # DDP-style: buckets go out during backward, which hides a share of the traffic
    cpu_by_compression: bool  # its compression changes the sync's CPU work per byte (DDP's hooks)
    label: Callable[[SyncSpec], str]
    risk: Callable[[SyncSpec], str]  # what it changes in the optimization ('' for exact averaging)
    plan: Callable[[SyncSpec, int], tuple[Phase, ...]]  # the exchanges of a run of that many steps
    # the spec of one of its labels (None: not its label)
    from_label: Callable[[str], SyncSpec | None]
    check: Callable[[SyncSpec], None] = lambda s: None  # refuses knob values it cannot run with


# a ddp label's tag for --embedding-sync dense (rows, the default, has none)
DENSE_TAG = "+dense-emb"


def _ddp_label(s: SyncSpec) -> str:
    # same bytes
    dense = DENSE_TAG if s.embedding_sync == "dense" and s.grad_compression != "powersgd" else ""
    if s.grad_compression == "none":
        return "ddp" + dense
    return f"ddp+{s.grad_compression}" + (f":{s.powersgd_rank}" if s.grad_compression == "powersgd"
                                          else "") + dense


def _ddp_risk(s: SyncSpec) -> str:
    if s.grad_compression in ("bf16", "fp16"):
        return RISKS["bf16"].replace("bf16", s.grad_compression)
    return RISKS["powersgd"] if s.grad_compression == "powersgd" else ""


def _ddp_plan(s: SyncSpec, steps: int) -> tuple[Phase, ...]:
    # fp32 steps first, then three calls a bucket (vectors, P, Q)
    if s.grad_compression == "powersgd":
        start = min(s.powersgd_start, steps)
        return Phase(count=start), Phase(count=steps - start, compression="powersgd",
                                         powersgd_rank=s.powersgd_rank, calls=3)
    return (Phase(count=steps, compression=s.grad_compression),)


def _ddp_from_label(label: str) -> SyncSpec | None:
    embedding = "dense" if label.endswith(DENSE_TAG) else "rows"
    name, _, knob = label.removesuffix(DENSE_TAG).partition(":")
    if name == "ddp":
        return SyncSpec(embedding_sync=embedding)
    if not name.startswith("ddp+"):
        return None
    return SyncSpec(grad_compression=name[4:], powersgd_rank=int(knob or 1),
                    embedding_sync=embedding)


MOMENT_TAGS = {"none": "", "first": "+m", "second": "+v", "both": "+mv"}


def _local_label(s: SyncSpec) -> str:
    moments = MOMENT_TAGS[s.average_moments]
    # +m+v/2: v every other average
    if s.second_moment_every > 1 and s.average_moments in ("second", "both"):
        moments = ("+m" if s.average_moments == "both" else "") + f"+v/{s.second_moment_every}"
    wire = "" if s.grad_compression == "none" else f"+{s.grad_compression}"
    return (f"{'diloco' if s.outer_optimizer == 'nesterov' else 'local-sgd'}:"
            f"{s.sync_every}{moments}{wire}")


def _local_plan(s: SyncSpec, steps: int) -> tuple[Phase, ...]:
    warm = min(s.local_sgd_warmup, steps)
    # the last one at the end of training
    averages = math.ceil((steps - warm) / max(1, s.sync_every))
    # the parameters (or, on a 16-bit wire, their changes) and the moments averaged with them in the
    # same buckets; the second moment only with every J-th average (the i-th average takes it when J
    # divides i)
    first, second = s.average_moments in ("first", "both"), s.average_moments in ("second", "both")
    return (Phase(count=warm),
            Phase(count=averages, compression=s.grad_compression, copies=1 + first),
            Phase(count=averages // s.second_moment_every, compression=s.grad_compression,
                  copies=second, calls=0))


def _local_from_label(label: str) -> SyncSpec | None:
    name, _, knob = label.partition(":")
    if name not in ("local-sgd", "diloco"):
        return None
    k, *tags = knob.split("+")
    first = second = False
    every, wire = 1, "none"
    for tag in tags:
        if tag in ("m", "mv"):
            first, second = True, second or tag == "mv"
        elif tag == "v" or tag.startswith("v/"):
            second, every = True, int(tag[2:] or 1)
        else:
            wire = tag
    moments = {(False, False): "none", (True, False): "first", (False, True): "second",
               (True, True): "both"}
    return SyncSpec(strategy="local-sgd", grad_compression=wire, sync_every=int(k or 1),
                    average_moments=moments[first, second], second_moment_every=every,
                    outer_optimizer="nesterov" if name == "diloco" else "none")


def _local_check(s: SyncSpec) -> None:
    if s.grad_compression not in ("auto", "none", "bf16"):
        raise BadInput(f"--grad-compression {s.grad_compression}: local SGD averages in fp32 "
                       "(none) or bf16",
                       "Use --grad-compression bf16 with --sync local-sgd, or --sync ddp for "
                       "PowerSGD")
    if s.second_moment_every > 1 and s.average_moments not in ("second", "both"):
        raise BadInput(f"--second-moment-every {s.second_moment_every}: the second moment is not "
                       f"averaged (--average-moments {s.average_moments})",
                       "Add --average-moments both (or second), or drop --second-moment-every")


def _plain(name: str, collective: str, calls: float) -> Sync:
    """A strategy without knobs whose exchange is one flattened payload of fp32 gradients per
    step."""
    return Sync(name=name, knobs=(), collective=collective, hides=False, cpu_by_compression=False,
                label=lambda s: name, risk=lambda s: "",
                plan=lambda s, steps: (Phase(count=steps, calls=calls, per_bucket=False),),
                from_label=lambda label: SyncSpec(strategy=name) if label.partition(":")[0] == name
                else None)


LOCAL_KNOBS = ("sync_every", "local_sgd_warmup", "outer_optimizer", "outer_lr", "outer_momentum",
               "average_moments", "second_moment_every")
TABLE: dict[str, Sync] = {s.name: s for s in (
    # DistributedDataParallel: buckets all-reduced during backward through a comm hook (fp32, bf16,
    # fp16, PowerSGD)
    Sync(name="ddp", knobs=("grad_compression", "embedding_sync"), collective=RING, hides=True,
         cpu_by_compression=True, label=_ddp_label, risk=_ddp_risk, plan=_ddp_plan,
         from_label=_ddp_from_label),
    # after backward, one all-reduce of every gradient flattened (the teaching baseline)
    _plain("allreduce", RING, 1.0),
    # rank 0 gathers every gradient, averages, scatters the mean back: one gather and one scatter
    _plain("gather-scatter", GATHER_SCATTER, 2.0),
    # each rank steps alone, parameters averaged every K steps (bucketed) after synchronous warm-up
    # steps; with an outer Nesterov optimizer it is DiLoCo
    Sync(name="local-sgd", knobs=("grad_compression", *LOCAL_KNOBS), collective=RING, hides=False,
         cpu_by_compression=False, label=_local_label,
         risk=lambda s: RISKS["local-sgd"].format(k=s.sync_every),
         plan=_local_plan, from_label=_local_from_label, check=_local_check),
)}
STRATEGIES = tuple(TABLE)
def parse_label(label: str) -> SyncSpec:
    """SyncSpec of a table label; unknown labels are DDP (what runs before sync strategies
    recorded)."""
    return next((spec for row in TABLE.values() if (spec := row.from_label(label)) is not None),
                SyncSpec())


def from_record(options: Mapping[str, Any], label: str) -> SyncSpec:
    """The sync a result.json recorded: its `sync_options` under their names of any cpudist version,
    else its label."""
    named = {OLD_NAMES.get(k, k): v for k, v in options.items()}
    if "strategy" not in named:
        return parse_label(label)
    # recorded before rows existed:
    if named["strategy"] == "ddp" and named.get("grad_compression") != "powersgd":
        named.setdefault("embedding_sync", "dense")  # DDP all-reduced all of the word embedding
    fields = {f.name for f in dataclasses.fields(SyncSpec)}
    return SyncSpec(**{k: v for k, v in named.items() if k in fields})
