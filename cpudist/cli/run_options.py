"""The options of `cpudist run` (and of each run of `cpudist sweep`), in the sections its --help
shows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from cpudist.cli.batch_options import batch_options
from cpudist.cli.cluster_options import imds_callback
from cpudist.cli.defaults import config_option
from cpudist.cli.hf_options import hf_options
from cpudist.cli.launch_options import launch_options, route_options
from cpudist.cli.lora_options import lora_options
from cpudist.cli.options import output_options
from cpudist.cloud.connect import check_store_url
from cpudist.config import (
    BACKENDS,
    LR_SCALINGS,
    MOMENTS,
    OPTIMIZERS,
    PRECISIONS,
    SAMPLERS,
    SAVE_MODELS,
)
from cpudist.strategies import STRATEGIES
from cpudist.sync_flags import parse_compression
from cpudist.train.report_to import parse_report_to
from cpudist.train.tasks import normalize_task, task_names


def _task(ctx: click.Context, param: click.Parameter, value: str) -> str:
    return normalize_task(value)


def _complete_task(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    return [t for t in task_names() if t.startswith(incomplete.lower())]


def _s3(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        check_store_url(value)
    return value


def _report_to(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...]:
    return parse_report_to(value)


def _compression(ctx: click.Context, param: click.Parameter, value: str) -> str:
    parse_compression(value)
    return value


OPTIONS: list[Callable[[Any], Any]] = [
    click.argument("task", callback=_task, shell_complete=_complete_task),
    launch_options,
    batch_options(trainer_only=True),
    route_options,
    click.option("--fetch-model", type=click.Choice(["yes", "no"]), default="yes",
                 show_default=True,
                 help="With --cluster or --head: bring the run's model/ home into the local run "
                      "folder "
                 "(sha256-checked), or leave it in the run folder on the head."),
    click.option("--detach", is_flag=True,
                 help="With --cluster or --head: return once the ranks are up; the run goes on "
                      "under the head's "
                 "agent. `cpudist logs -f RUN` follows it and brings its result home, `cpudist "
                 "stop RUN` stops it."),
    click.option("--model", default="bert-base-uncased", show_default=True,
                 help="Preset (tiny, minilm-l6, bert-base, distilbert-base, bert-large), local "
                      "folder or Hub id."),
    click.option("--tokenizer", help="Tokenizer source, when not the model's."),
    click.option("--data-dir", type=click.Path(path_type=Path),
                 help="GLUE task folder (TSV layout)."),
    click.option("--train-file", type=click.Path(path_type=Path),
                 help="Custom data: csv, tsv, txt (;), json, jsonl."),
    click.option("--validation-file", type=click.Path(path_type=Path),
                 help="Custom data: the evaluation rows, in the same format."),
    click.option("--text-columns",
                 help="Custom data: 1 or 2 columns, comma-separated [default: text]."),
    click.option("--label-column", help="Custom data: the label column [default: label]."),
    click.option("--max-seq-len", type=click.IntRange(8, 8192), default=128, show_default=True,
                 help="Tokens per row at most (longer rows are cut; batches pad to their longest "
                      "row)."),
    click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True,
                 help="Per rank."),
    click.option("--eval-batch-size", type=click.IntRange(min=1), default=64, show_default=True,
                 help="Rows per evaluation batch, per rank."),
    click.option("--grad-accum", type=click.IntRange(min=1), default=1, show_default=True,
                 help="Micro-batches per optimizer step (one exchange per step)."),
    click.option("--epochs", type=click.FloatRange(min=0, min_open=True), default=3.0,
                 show_default=True,
                 help="Passes over the training rows (fractions allowed); --max-steps wins."),
    click.option("--max-steps", type=click.IntRange(min=1),
                 help="Stop after this many optimizer steps."),
    click.option("--lr", type=click.FloatRange(min=0, min_open=True, max=10), default=2e-5,
                 show_default=True,
                 help="Peak learning rate, for one rank's batch (see --lr-scaling)."),
    click.option("--weight-decay", type=click.FloatRange(min=0), default=0.01, show_default=True,
                 help="AdamW's decoupled weight decay."),
    click.option("--warmup-ratio", type=click.FloatRange(0, 1), default=0.1, show_default=True,
                 help="Share of the steps with a linear lr warm-up (then --lr-scheduler's decay); "
                 "--warmup-steps wins."),
    click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=42, show_default=True,
                 help="Seed of the model head, the data order and dropout (seed + rank)."),
    click.option("--precision", type=click.Choice(PRECISIONS), default="auto", show_default=True,
                 help="auto: bf16 autocast where the CPU has native bf16, else fp32."),
    click.option("--backend", type=click.Choice(BACKENDS), default="gloo", show_default=True,
                 help="torch.distributed backend: gloo, or ccl (Intel's "
                      "oneccl_bindings_for_pytorch)."),
    click.option("--sampler", type=click.Choice(SAMPLERS), default="grouped", show_default=True,
                 help="grouped: length-grouped global batches (less padding); random: "
                      "DistributedSampler."),
    click.option("--dropout", type=click.FloatRange(0, 1, max_open=True),
                 help="Override the model's dropout (0 turns it off)."),
    click.option("--max-train-samples", type=click.IntRange(min=1),
                 help="Train on the first N rows only."),
    click.option("--max-eval-samples", type=click.IntRange(min=1),
                 help="Evaluate on the first N rows only."),
    click.option("--synthetic-samples", type=click.IntRange(min=1), default=2048, show_default=True,
                 help="Task synthetic: rows of random tokens (throughput runs)."),
    click.option("--eval/--no-eval", "do_eval", default=True, show_default=True,
                 help="Evaluate on the validation rows after training."),
    click.option("--eval-every", type=click.IntRange(min=1),
                 help="Also evaluate every N optimizer steps during training (as HF's eval_steps); "
                      "local SGD: at "
                 "parameter averages only (N a multiple of K), where the ranks hold one model."),
    click.option("--save-model", type=click.Choice(SAVE_MODELS), default="last", show_default=True,
                 help="Rank 0 writes the model to <run folder>/model/ (save_pretrained: "
                      "safetensors, tokenizer, "
                 "id2label with the task's class names, README.md model card), loadable with "
                 "transformers' pipeline('text-classification', model=...): last: as trained "
                 "(local SGD/DiLoCo: the ranks' average, as evaluated); best: the best "
                 "evaluation's by --metric-for-best-model (with --eval-strategy; HF's "
                 "load_best_model_at_end); none. From a laptop it comes home too (--fetch-model); "
                 "a scheduler's run: in the run folder on the shared filesystem. Task synthetic "
                 "saves none."),
    click.option("--model-s3", callback=_s3,
                 help="s3://bucket/prefix: rank 0 also copies the saved model to <prefix>/<run "
                      "id>/model/, SHA256SUMS "
                 "last (result.json's model_s3 says where; a failed copy warns). Credentials as "
                 "boto3 finds them."),
    click.option("--log-every", type=click.IntRange(min=1), default=10, show_default=True,
                 help="Optimizer steps between lines of steps.jsonl and progress."),
    click.option("--report-to", default="none", show_default=True, callback=_report_to,
                 help="tensorboard, mlflow (or both, comma-separated): rank 0 also writes every "
                      "step's loss, "
                 "learning rate, grad norm, samples/s and comm share and every evaluation as "
                 "TensorBoard event files in <run folder>/tensorboard/ (pip install "
                 "'cpudist[tensorboard]'; `tensorboard --logdir runs/`) or an MLflow run (pip "
                 "install 'cpudist[mlflow]'; to --mlflow-uri, or a file store in <run "
                 "folder>/mlruns/), as HF Trainer's report_to; from a laptop they come home with "
                 "the run."),
    click.option("--mlflow-uri",
                 help="--report-to mlflow's tracking URI (a server, or a store rank 0 can reach); "
                      "default: the file "
                 "store <run folder>/mlruns/ (`MLFLOW_ALLOW_FILE_STORE=true mlflow ui "
                 "--backend-store-uri ...`)."),
    click.option("--dist-timeout", type=click.IntRange(min=1), default=300, show_default=True,
                 help="Seconds before a missing peer fails the job."),
    click.option("--max-grad-norm", type=click.FloatRange(min=0), default=1.0, show_default=True,
                 help="Clip the gradient norm (as HF Trainer does); 0 turns clipping off."),
    click.option("--checkpoint-every", type=click.IntRange(min=1),
                 help="Write a checkpoint every N optimizer steps."),
    click.option("--checkpoint-every-min", type=click.FloatRange(min=0, min_open=True),
                 help="Write a checkpoint every N minutes."),
    click.option("--checkpoint-dir",
                 help="Checkpoints folder on the head node [default: <run folder>/checkpoints]."),
    click.option("--keep-checkpoints", type=click.IntRange(min=1), default=2, show_default=True,
                 help="Checkpoints kept; older ones are deleted."),
    click.option("--checkpoint-s3", callback=_s3,
                 help="s3://bucket/prefix: a durable copy of every checkpoint "
                 "(survives the head)."),
    click.option("--resume",
                 help="auto: go on from the newest usable checkpoint of the run folder (without "
                 "--output-dir: the newest unfinished run of this task and model), if any; or a "
                 "checkpoint path."),
    click.option("--imds-endpoint", "imds", default="auto", show_default=True,
                 callback=imds_callback,
                 help="Instance metadata service polled for spot interruption notices: auto "
                      "(AWS's, on EC2 "
                 "only), off, or a URL."),
    click.option("--on-preemption", type=click.Choice(["stop", "resume"]), default="stop",
                 show_default=True,
                 help="With --cluster: when a node is reclaimed, stop (and say how to resume) or "
                      "replace it with "
                 "`cluster up` and resume from the checkpoint."),
    click.option("--elastic", is_flag=True,
                 help="A lost node does not end the run: the others go on, and the node (or its "
                      "replacement) joins again with a live peer's weights (torchft; torchrun "
                      "with --hostfile, --ppn 1)."),
    click.option("--freeze-embeddings", is_flag=True,
                 help="Do not train the word-embedding table (half of MiniLM's gradient bytes and "
                      "AdamW work)."),
    click.option("--gradient-checkpointing", is_flag=True,
                 help="Recompute each layer's activations in backward "
                 "instead of keeping them: less memory, slower steps (benchmarks/README.md)."),
    lora_options,
    hf_options,
    click.option("--compile", is_flag=True,
                 help="torch.compile the model (batches padded to multiples of 32 "
                 "tokens; kernels cached in ~/.cpudist/inductor across runs)."),
    click.option("--fast-dropout/--torch-dropout", default=True, show_default=True,
                 help="Dropout masks from a cheaper generator (same p and seeding), "
                 "or torch's own."),
    click.option("--first-token-last-layer/--full-last-layer", default=True, show_default=True,
                 help="The last encoder layer computes only the first token, the one the "
                      "classifier reads (BERT, "
                 "RoBERTa, XLM-R, ELECTRA: the same logits and gradients, fewer FLOPs), or every "
                 "token as transformers does."),
    click.option("--ipex", is_flag=True,
                 help="Apply Intel Extension for PyTorch's optimize() (needs its matching "
                 "torch; archived upstream in 2026)."),
    click.option("--sync", type=click.Choice(STRATEGIES), default="ddp", show_default=True,
                 help="How ranks agree: ddp (buckets all-reduced in backward), allreduce (one "
                      "flattened all-reduce "
                 "after it), gather-scatter (through rank 0), local-sgd (average parameters every "
                 "--sync-every)."),
    click.option("--bucket-cap-mb", type=click.FloatRange(min=0, min_open=True), default=25.0,
                 show_default=True,
                 help="Size of DDP's gradient buckets and of local SGD's averaging buckets."),
    click.option("--grad-compression", default="auto", show_default=True, callback=_compression,
                 help="ddp: auto (bf16 when the ranks span nodes, else none), none, bf16, fp16 or "
                      "powersgd[:RANK] "
                 "(DDP hooks); local-sgd: none (auto) or bf16 (the averages cross as bf16 changes "
                 "since the last)."),
    click.option("--embedding-sync", type=click.Choice(["rows", "dense"]), default="rows",
                 show_default=True,
                 help="ddp: all-reduce only the word-embedding rows a step touched (the same "
                      "mean), or all as DDP."),
    click.option("--sync-every", type=click.IntRange(min=1), default=8, show_default=True,
                 help="local-sgd: optimizer steps between parameter averages (K)."),
    click.option("--local-sgd-warmup", type=click.IntRange(min=0), default=0, show_default=True,
                 help="local-sgd: synchronous (gradient-averaging) steps before the first local "
                      "one."),
    click.option("--outer-optimizer", type=click.Choice(["none", "nesterov"]), default="none",
                 show_default=True,
                 help="local-sgd: nesterov applies the averaged change with an outer Nesterov SGD "
                      "(DiLoCo)."),
    click.option("--outer-lr", type=click.FloatRange(min=0, min_open=True), default=0.7,
                 show_default=True,
                 help="DiLoCo (--outer-optimizer nesterov): the outer learning rate."),
    click.option("--outer-momentum", type=click.FloatRange(0, 1, max_open=True), default=0.9,
                 show_default=True, help="DiLoCo: the outer Nesterov momentum."),
    click.option("--average-moments", type=click.Choice(MOMENTS), default="none", show_default=True,
                 help="local-sgd: also average AdamW's first moment, its second, or both at each "
                      "average."),
    click.option("--second-moment-every", type=click.IntRange(min=1), default=1, show_default=True,
                 help="local-sgd with --average-moments second|both: average the second moment at "
                      "every J-th "
                 "average only (fewer bytes, less accuracy: benchmarks/README.md)."),
    click.option("--lr-scaling", type=click.Choice(LR_SCALINGS), default="auto", show_default=True,
                 help="Scale --lr (one rank's) with the global batch: linear (x ranks, Goyal et "
                      "al.), sqrt, none, or "
                 "auto: linear on more than one rank (sqrt with LoRA). Local SGD too: "
                 "the ranks' averaged steps move the model as one step on the global batch does."),
    click.option("--optimizer", type=click.Choice(OPTIMIZERS), default="adamw", show_default=True,
                 help="adamw (as HF Trainer), or sgd: plain SGD, linear in the gradient (for "
                      "teaching and checks)."),
    click.option("--output-dir", type=click.Path(path_type=Path),
                 help="Run folder [default: runs/<task>-...]."),
    click.option("--ledger", type=click.Path(path_type=Path),
                 help="Results ledger [default: ~/.cpudist/results.jsonl]."),
    click.option("--shared-fs", is_flag=True,
                 help="Every node sees this node's paths (NFS): run from the head without staging "
                      "its inputs."),
    click.option("--dry-run", is_flag=True, help="Print the command and environment; run nothing."),
    output_options(),
    click.option("--quiet", is_flag=True,
                 help="Only errors and the final line (rank output: ranks.log)."),
    config_option,
]


def run_options(f: Any) -> Any:
    """Add every option of `cpudist run` to a command, in the order --help lists them within a
    section."""
    for option in reversed(OPTIONS):
        f = option(f)
    return f
