"""How `cpudist run --help` (and `cpudist sweep --help`) groups the options (cli/run_options.py)."""

from __future__ import annotations

from cpudist.cli.batch_options import batch_sections
from cpudist.cli.hf_options import HEADING, SECTION

# --help lists the options under these headings (parameter names); anything unlisted comes last.
SECTIONS: dict[str, tuple[str, ...]] = {
    "Where and how many ranks": ("np_", "ppn", "nodes", "hostfile", "launcher", "oversubscribe"),
    "Model and data": ("model", "tokenizer", "data_dir", "train_file", "validation_file",
                       "text_columns", "label_column", "max_seq_len", "max_train_samples",
                       "max_eval_samples", "synthetic_samples"),
    "Training": ("epochs", "max_steps", "batch_size", "grad_accum", "lr", "lr_scaling", "optimizer",
                 "weight_decay", "warmup_ratio", "max_grad_norm", "seed", "precision", "dropout",
                 "sampler", "freeze_embeddings", "gradient_checkpointing", "do_eval", "eval_every",
                 "eval_batch_size", "save_model", "model_s3", "log_every", "report_to",
                 "mlflow_uri"),
    HEADING: SECTION,
    "Gradient sync": ("sync", "grad_compression", "embedding_sync", "bucket_cap_mb", "sync_every",
                      "local_sgd_warmup", "average_moments", "second_moment_every",
                      "outer_optimizer", "outer_lr", "outer_momentum", "backend", "dist_timeout"),
    "LoRA (--peft lora)": ("peft", "lora_r", "lora_alpha", "lora_dropout", "lora_targets",
                           "lora_modules_to_save", "merge_lora"),
    "Speed levers": ("fast_dropout", "first_token_last_layer", "allocator", "openmp", "compile",
                     "ipex"),
    "Launch": ("mpirun", "ssh", "iface", "env_pairs", "secret_names", "env_files", "shared_fs",
               "timeout"),
    "Checkpoints and spot instances": ("checkpoint_every", "checkpoint_every_min", "checkpoint_dir",
                                       "keep_checkpoints", "checkpoint_s3", "resume", "imds",
                                       "on_preemption", "elastic"),
    "From outside the cluster (AWS cluster or on-prem head)": (
        "cluster_name", "head_addr", "user", "identity", "remote_python", "stage_code",
        "fetch_model", "detach"),
    **batch_sections(trainer=True),
    "Output": ("output_dir", "overwrite_output_dir", "ledger", "fmt", "quiet", "dry_run", "config"),
}
