"""What --elastic takes, checked by `cpudist run` before it launches and by each rank: the trainer's
options it combines with, and the launchers that can run it (cpudist/wire/elastic.py: the run's
contract)."""

from __future__ import annotations

from cpudist.config import TrainConfig
from cpudist.errors import BadInput

# what --elastic does not combine with yet, and why
REFUSED = (("compile", "static shapes per participant count are not planned yet"),
           ("checkpoint_every_min", "the nodes' clocks would checkpoint different steps: give "
                                    "--checkpoint-every N"),
           ("checkpoint_dir", "each node keeps its checkpoints in its own run folder"),
           ("checkpoint_s3", "every node would copy its checkpoints"),
           ("model_s3", "every node would copy its model"))
# why the other launchers cannot run an elastic run
NOT_ELASTIC = {"mpich": "mpirun ends every rank when one ends",
               "impi": "mpirun ends every rank when one ends",
               "openmpi": "mpirun ends every rank when one ends",
               "slurm": "a Slurm step ends with its first lost node, and a replacement is not in "
                        "the allocation"}


def check(cfg: TrainConfig) -> None:
    """What --elastic takes: the grouped sampler, no accumulation, ddp (replaced by the flat
    average) without PowerSGD; refused in one line otherwise."""
    if not cfg.elastic:
        return
    if cfg.sampler != "grouped" or cfg.grad_accum != 1 or cfg.sync.strategy != "ddp":
        raise BadInput("--elastic trains with --sampler grouped, --grad-accum 1 and --sync ddp "
                       f"(given: {cfg.sampler}, {cfg.grad_accum}, {cfg.sync.strategy})",
                       "Drop the other --sampler, --grad-accum or --sync")
    if cfg.sync.grad_compression == "powersgd":
        raise BadInput("--grad-compression powersgd with --elastic: the average sends the "
                       "gradients whole", "Use --grad-compression bf16, fp16 or none")
    for name, why in REFUSED:
        if getattr(cfg, name):
            flag = "--" + name.replace("_", "-")
            raise BadInput(f"{flag} with --elastic: {why}", f"Drop {flag}")


def check_launch(launcher: str, ppn: int, hostfile: bool) -> None:
    """Where --elastic can run: one rank per node of a hostfile, each started over ssh (torchrun's
    route); a one-line refusal elsewhere."""
    if launcher in NOT_ELASTIC:
        raise BadInput(f"--elastic with --launcher {launcher}: {NOT_ELASTIC[launcher]}",
                       "Use --launcher torchrun (or auto) with --hostfile, or drop --elastic")
    if not hostfile:
        raise BadInput("--elastic needs the nodes: a hostfile (each node may leave and come back)",
                       "Pass --hostfile H, or --cluster NAME")
    if ppn != 1:
        raise BadInput(f"--elastic runs one rank per node (given --ppn {ppn})",
                       "Pass --ppn 1: each node's rank uses all its cores")
