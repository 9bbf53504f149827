"""Whether a checkpoint may continue this run: the same run (model, data, seed), and a schedule the
resume does not change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cpudist.config import resolved_scaling
from cpudist.errors import BadInput
from cpudist.train.checkpoint_meta import CheckpointMeta

# What must match for a checkpoint to continue a run: another model or data order is another run.
SAME_RUN = ("task", "model", "seed", "sampler", "max_seq_len", "max_train_samples")
# What a resume takes from the checkpoint, whatever the options say: the optimizer (its learning
# rate and weight decay), the schedule over the run's total steps, and the data position in
# micro-batches of --grad-accum. The best evaluation so far is kept by the metric of the run that
# wrote it, too.
SCHEDULE = ("lr", "lr_scaling", "optimizer", "weight_decay", "warmup_ratio", "epochs", "max_steps",
            "grad_accum", "lr_scheduler", "warmup_steps", "metric_for_best_model",
            "greater_is_better")


def check_same_run(meta: CheckpointMeta, cfg: dict[str, Any], path: Path) -> None:
    """Refuse a checkpoint of another run (another model, data or seed), naming what differs."""
    differ = [f"{k}: {meta.config.get(k)!r} there, {cfg.get(k)!r} here" for k in SAME_RUN
              if meta.config.get(k) != cfg.get(k)]
    if differ:
        raise BadInput(f"checkpoint {path} belongs to another run ({'; '.join(differ)})",
                       "Resume with the options of the run that wrote it, or start over without "
                       "--resume")
    # an elastic node's checkpoint holds its own share of the run (a world of 1, the quorum's step)
    if bool(meta.config.get("elastic")) != bool(cfg.get("elastic")):
        kind = "an elastic run's node" if meta.config.get("elastic") else "a run without --elastic"
        raise BadInput(f"checkpoint {path} was written by {kind}; this run "
                       f"{'is not' if meta.config.get('elastic') else 'is'} elastic",
                       "Resume with --elastic as the run that wrote it had it, or start over "
                       "without --resume")


def check_same_schedule(meta: CheckpointMeta, cfg: dict[str, Any], path: Path) -> None:
    """Refuse a resume whose options would change what the checkpoint fixes (SCHEDULE), naming each
    change: the run would go on with the checkpoint's values and record these (a longer --max-steps
    trained nothing more)."""
    # --lr-scaling scales by the rank count that wrote it
    ranks = meta.config.get("lr_world") or meta.world_size

    def same(k: str) -> bool:
        # auto there and linear (or none) here is no change if it scaled alike
        if k == "lr_scaling":
            peft = str(cfg.get("peft", "none"))  # another --peft is refused as another run
            return resolved_scaling(meta.config[k], ranks,
                                    peft) == resolved_scaling(cfg.get(k, "auto"), ranks, peft)
        return bool(meta.config[k] == cfg.get(k))

    differ = [f"--{k.replace('_', '-')}: {meta.config[k]!r} there, {cfg.get(k)!r} here"
              for k in SCHEDULE
              if k in meta.config and not same(k)]  # a key older checkpoints lack: no say
    if differ:
        raise BadInput(f"checkpoint {path} was written with other training options "
                       f"({'; '.join(differ)})",
                       "A resume goes on with the checkpoint's optimizer, learning-rate schedule "
                       "and data position: resume with the options of the run that wrote it (its "
                       "run folder's command.txt), or start a new run without --resume")
