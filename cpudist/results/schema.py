"""RunResult: what one run measured, as written to result.json and the ledger."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1


@dataclass(kw_only=True, frozen=True)
class RunResult:
    """One finished run (keys as in ARCHITECTURE.md, plus what the report needs)."""

    task: str
    model: str
    world_size: int
    nodes: tuple[str, ...]  # distinct hosts, in rank order
    ppn: int
    precision: str
    backend: str
    sync: str
    per_rank_batch_size: int
    grad_accum: int
    global_batch_size: int
    max_seq_len: int
    steps: int
    train_samples: int
    train_time_s: float
    eval_time_s: float
    wall_time_s: float
    train_samples_per_s: float
    steady_samples_per_s: float
    train_tokens_per_s: float
    metrics: dict[str, float]
    comm_bytes_per_step: int
    versions: dict[str, str]
    cpu: dict[str, Any]
    run_id: str = ""
    started_at: str = ""
    rank_hosts: tuple[str, ...] = ()
    epochs: float | None = None
    max_steps: int | None = None
    seed: int = 0
    lr: float = 0.0  # the learning rate used (--lr after --lr-scaling)
    lr_scaling: str = "none"
    threads_per_rank: int = 0  # rank 0's
    # every rank's, in rank order (each sizes its own: train/threads.py)
    rank_threads: tuple[int, ...] = ()
    final_loss: float | None = None
    peak_rss_mb: float = 0.0  # the largest over all ranks
    eval_phases: dict[str, float] = field(default_factory=dict)
    # Seconds per phase before the first step, in order, and their total (cpudist/train/startup.py
    # names them)
    startup: dict[str, Any] = field(default_factory=dict)
    launcher: str = ""
    slurm_job_id: str | None = None  # the Slurm job that ran the ranks (--launcher slurm)
    train_flops_per_s: float = 0.0  # model FLOPs (padding excluded) per second of training
    mfu: float = 0.0  # train_flops_per_s over the peak of the cores used, at the run's precision
    peak_flops_per_s: float = 0.0
    peak_how: str = ""
    cluster: str | None = None
    usd_per_hour: float | None = None  # the price of the nodes the run used, when known
    run_dir: str = ""
    # what a run from outside the cluster sent, and how long
    staging: dict[str, Any] = field(default_factory=dict)
    # the checkpoint's step when this run continued an earlier part
    resumed_from_step: int | None = None
    resumed_from: str | None = None
    parts: int = 1  # train_time_s and wall_time_s count every part
    checkpoints: dict[str, Any] = field(default_factory=dict)  # folder, written, s3, keep
    recoveries: int = 0  # nodes replaced and runs resumed by --on-preemption resume
    time_lost_s: float = 0.0  # wall time between a stop and the resumed run's first step, summed
    # Gradient sync and its traffic (cpudist/traffic.py). `sync` above is the strategy's label (ddp,
    # ddp+bf16, allreduce, gather-scatter, local-sgd:8, diloco:8, ...); its knobs are here.
    sync_options: dict[str, Any] = field(default_factory=dict)
    optimizer: str = "adamw"
    # dropout masks from cpudist/train/dropout.py (False: torch's, or an older run)
    fast_dropout: bool = False
    # of training steps: cpudist-fast-dropout (dropout.py's), sdpa, eager, ... ("": older run)
    attention: str = ""
    last_layer: str = ""  # first-token (cpudist/train/last_layer.py) | full ("": older run)
    # --freeze-embeddings: the word-embedding table was not trained nor sent
    freeze_embeddings: bool = False
    # --gradient-checkpointing: layers whose activations backward recomputed (0: off)
    checkpointed_layers: int = 0
    # --peft lora (cpudist/train/lora.py): r, alpha, dropout, targets, modules_to_save,
    # trainable_params, total_params, merged ({}: every parameter trained)
    peft: dict[str, Any] = field(default_factory=dict)
    # parameters that required a gradient (0: a run from before this was recorded)
    trainable_params: int = 0
    grad_bytes: int = 0  # one fp32 gradient of the trained parameters
    # of the trained parameters: what traffic.py needs to plan
    param_shapes: tuple[tuple[int, ...], ...] = ()
    # every node's interface together, per optimizer step (0: one node)
    expected_tx_bytes_per_step: float = 0.0
    # what their counters saw (None: one node, not measured)
    measured_tx_bytes_per_step: float | None = None
    tx_bytes_by_node: dict[str, float] = field(default_factory=dict)  # measured, per node and step
    traffic_iface: str = ""  # the interface counted (the one towards MASTER_ADDR)
    comm_time_s: float = 0.0  # sync collectives in flight (mean over ranks, all steps of this part)
    exposed_comm_s: float = 0.0  # training time spent waiting for them (the rest is compute)
    # ddp --embedding-sync rows: word-embedding rows sent a step
    embedding_rows_per_step: float | None = None
    bus_bandwidth_gbps: float | None = None  # busiest rank's bytes sent / comm_time_s
    # Rank 0's seconds per step in compute_s, sync_cpu_s, wire_s, wait_s, eval_s, their sum_s, the
    # loop's own step_s, and the steps averaged (cpudist/train/anatomy.py: how; {}: an older run)
    step_anatomy: dict[str, Any] = field(default_factory=dict)
    # The model rank 0 saved (--save-model; cpudist/train/export.py) and the evaluations it was
    # chosen from. With --save-model best, `metrics` are the best evaluation's (as HF's
    # load_best_model_at_end), else the last one's.
    save_model: str = ""  # last | best | none ("": a run from before models were saved)
    model_dir: str | None = None  # where rank 0 wrote it (None: not saved)
    model_step: int | None = None  # the optimizer step whose weights it holds
    model_bytes: int | None = None  # every file of the folder together
    model_save_s: float | None = None  # weights, tokenizer and card
    # --model-s3: url, files, bytes, seconds of the copy (cpudist/train/model_upload.py), or url and
    # error
    model_s3: dict[str, Any] = field(default_factory=dict)
    # {"step", "metrics", "seconds"}, in order; the last is the final one
    evaluations: tuple[dict[str, Any], ...] = ()
    # where the rows came from, how many, the class names
    data: dict[str, Any] = field(default_factory=dict)
    command: str = ""  # the `cpudist run` command line, as typed (the launching side's)
    # the Hub id the saved weights started from (None: a preset's random ones, a folder)
    base_model: str | None = None
    # HF Trainer's choices (cpudist/train/trainer_choices.py): what picked the best evaluation
    metric_for_best_model: str = ""  # "": an older run (the task's first metric)
    greater_is_better: bool | None = None
    lr_scheduler: str = ""  # transformers' get_scheduler name ("": an older run, linear)
    warmup_steps: int | None = None  # the warm-up the schedule took, in optimizer steps
    # Early stopping ended the training: step, reason, metric, patience, threshold, best_step
    # ({}: it did not)
    early_stopping: dict[str, Any] = field(default_factory=dict)
    # --elastic: from which step how many nodes trained, and when (s since the node's start)
    membership: list[dict[str, Any]] = field(default_factory=list)
    schema: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        """Read a result written by this or a later version (unknown keys are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kept = {k: v for k, v in data.items() if k in names}
        for key in ("nodes", "rank_hosts", "rank_threads", "evaluations"):
            if key in kept:
                kept[key] = tuple(kept[key])
        if "param_shapes" in kept:
            kept["param_shapes"] = tuple(tuple(s) for s in kept["param_shapes"])
        return cls(**kept)

    @property
    def comm_share(self) -> float:
        """Share of the training time spent waiting for communication."""
        return self.exposed_comm_s / self.train_time_s if self.train_time_s else 0.0

    @property
    def traffic_error(self) -> float | None:
        """measured / expected - 1 of the bytes between nodes; None when either is unknown."""
        if self.measured_tx_bytes_per_step is None or not self.expected_tx_bytes_per_step:
            return None
        return self.measured_tx_bytes_per_step / self.expected_tx_bytes_per_step - 1

    @property
    def cost_usd(self) -> float | None:
        """What the run's wall time cost on its nodes."""
        return None if self.usd_per_hour is None else self.usd_per_hour * self.wall_time_s / 3600

    def with_updates(self, **changes: Any) -> RunResult:
        return dataclasses.replace(self, **changes)
