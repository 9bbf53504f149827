"""Regression parity with Hugging Face Trainer on an STS-B-like PROXY (not STS-B itself).

    HF_HUB_OFFLINE=1 python benchmarks/regression_parity.py  # lr 2e-5 x 1 epoch, all variants
    HF_HUB_OFFLINE=1 python benchmarks/regression_parity.py --plans short,long --seeds 42,43

No STS-B is available offline, so the proxy is built from GLUE MRPC (read by path from
../shared/data, written to a temp folder in STS-B's TSV layout, never into the repository):
score = 2.5 x paraphrase label + 2.5 x word-set Jaccard overlap of the two sentences, a float
in 0..5 like STS-B's (mean 3.0, variance 1.9 on MRPC train). cpudist reads it as task `stsb`,
exactly the code path of an STS-B run. Both arms train the offline all-MiniLM-L6-v2 with the
same rows, epochs, lr, batch size, seed, max length, precision and classifier initialization;
the variants then change one setting at a time to explain any gap.

Writes benchmarks/results/regression-parity.{json,md}.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MRPC = HERE.parent.parent / "shared" / "data" / "glue" / "MRPC"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
BATCH, MAX_LEN = 32, 128


@dataclass(frozen=True)
class Arm:
    """One training run: which trainer, and the settings where it departs from that trainer's
    defaults."""

    name: str
    trainer: str  # "cpudist" or "hf"
    # cpudist flags (python -m cpudist.rank) or TrainingArguments fields, as strings/numbers.
    overrides: dict[str, Any] = field(default_factory=dict)


# cpudist defaults: warmup 0.1, weight decay 0.01, no clipping, length-grouped batches.
# HF Trainer defaults: warmup 0, weight decay 0, max_grad_norm 1.0, random batches.
ARMS = (
    Arm("cpudist", "cpudist"),
    Arm("hf", "hf"),
    Arm("cpudist warmup=0", "cpudist", {"warmup-ratio": 0}),
    Arm("cpudist weight_decay=0", "cpudist", {"weight-decay": 0}),
    Arm("cpudist sampler=random", "cpudist", {"sampler": "random"}),
    Arm("cpudist as hf but no clip", "cpudist",
        {"warmup-ratio": 0, "weight-decay": 0, "sampler": "random"}),
    Arm("hf max_grad_norm=0 (no clip)", "hf", {"max_grad_norm": 0.0}),
    Arm("hf warmup=0.1", "hf", {"warmup_steps": 0.1}),
    Arm("hf as cpudist", "hf", {"max_grad_norm": 0.0, "warmup_steps": 0.1, "weight_decay": 0.01,
                                "train_sampling_strategy": "group_by_length"}),
)
PLANS = {"short": {"lr": 2e-5, "epochs": 1}, "long": {"lr": 5e-5, "epochs": 3}}


def jaccard(a: str, b: str) -> float:
    """Word-set overlap of two (already tokenized) sentences."""
    x, y = set(a.lower().split()), set(b.lower().split())
    return len(x & y) / len(x | y) if x | y else 0.0


def proxy_rows(path: Path) -> list[tuple[str, str, float]]:
    """MRPC rows as (sentence1, sentence2, score in 0..5)."""
    with path.open(encoding="utf-8-sig", newline="") as f:  # MRPC has a BOM; its quotes are text
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    return [(r[3], r[4], round(2.5 * int(r[0]) + 2.5 * jaccard(r[3], r[4]), 3)) for r in rows]


def write_stsb(rows: list[tuple[str, str, float]], path: Path) -> None:
    """A TSV in GLUE STS-B's layout (index, sentence1, sentence2, score)."""
    lines = ["index\tsentence1\tsentence2\tscore"]
    lines += [f"{i}\t{a}\t{b}\t{s}" for i, (a, b, s) in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def build_proxy(dest: Path, train_rows: int, seed: int) -> dict[str, Any]:
    """Write dest/STS-B/{train,dev}.tsv: a seeded sample of MRPC train, and all of MRPC dev."""
    train = proxy_rows(MRPC / "train.tsv")
    random.Random(seed).shuffle(train)
    train = train[:train_rows]
    dev = proxy_rows(MRPC / "dev.tsv")
    (dest / "STS-B").mkdir(parents=True)
    write_stsb(train, dest / "STS-B" / "train.tsv")
    write_stsb(dev, dest / "STS-B" / "dev.tsv")
    scores = [s for _, _, s in train]
    return {"source": str(MRPC), "train_rows": len(train), "dev_rows": len(dev),
            "train_score_mean": statistics.fmean(scores),
            "train_score_variance": statistics.pvariance(scores),
            "train_score_mean_square": statistics.fmean(x * x for x in scores),
            "formula": "score = 2.5 * MRPC label + 2.5 * word-set Jaccard(sentence1, sentence2)"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env() -> dict[str, str]:
    repo = str(HERE.parent)
    return {**os.environ, "HF_HUB_OFFLINE": "1",  # no Hub here: fail fast instead of retrying
            "PYTHONPATH": repo + os.pathsep + os.environ.get("PYTHONPATH", ""),
            # cpudist.rank always opens a process group, even a world of one.
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}


def cpudist_argv(arm: Arm, data: Path, model: str, plan: dict[str, Any], seed: int,
                 out: Path) -> list[str]:
    base = {"task": "stsb", "data-dir": str(data), "model": model, "epochs": plan["epochs"],
            "lr": plan["lr"], "batch-size": BATCH, "max-seq-len": MAX_LEN, "seed": seed,
            "output-dir": str(out), "log-every": 1, **arm.overrides}
    return [sys.executable, "-m", "cpudist.rank", *[f"--{k}={v}" for k, v in base.items()]]


def run_cpudist(arm: Arm, data: Path, model: str, plan: dict[str, Any], seed: int,
                tmp: Path) -> dict[str, Any]:
    out = tmp / "cpudist-run"
    cmd = cpudist_argv(arm, data, model, plan, seed, out)
    print("$", shlex.join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, env=child_env(), stdout=subprocess.DEVNULL)
    result = json.loads((out / "result.json").read_text())
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    return {"metrics": result["metrics"], "losses": [s["loss"] for s in steps],
            "lrs": [s["lr"] for s in steps], "train_time_s": result["train_time_s"],
            "precision": result["precision"], "command": shlex.join(cmd)}


def run_hf(arm: Arm, data: Path, model: str, plan: dict[str, Any], seed: int) -> dict[str, Any]:
    spec = {"data": str(data), "model": model, "plan": plan, "seed": seed,
            "overrides": arm.overrides}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--hf-arm", json.dumps(spec)]
    print("$", shlex.join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, env=child_env(), stdout=subprocess.PIPE, text=True).stdout
    return {**json.loads(out.strip().splitlines()[-1]), "command": shlex.join(cmd)}


def hf_arm(spec: dict[str, Any]) -> dict[str, Any]:
    """Train with HF Trainer in this process, set up as cpudist sets up its run (child of
    run_hf)."""
    import numpy as np
    import torch
    from transformers import (
        AutoModelForSequenceClassification,
        DataCollatorWithPadding,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from cpudist.cpu import read_cpu
    from cpudist.train.data import load_glue_tsv
    from cpudist.train.metrics import compute_metrics
    from cpudist.train.models import load_tokenizer, resolve_model

    data = load_glue_tsv("stsb", Path(spec["data"]))
    tok = load_tokenizer(spec["model"], None)

    def rows(split: Any) -> list[dict[str, Any]]:
        enc = tok(*split.texts, truncation=True, max_length=MAX_LEN)
        return [{**{k: enc[k][i] for k in enc}, "labels": float(y)} for i,
                y in enumerate(split.labels)]

    losses: list[float] = []
    lrs: list[float] = []  # logged after each step: shows the warmup the arm really had

    class Losses(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))
                lrs.append(float(logs.get("learning_rate", 0.0)))

    torch.manual_seed(spec["seed"])  # as cpudist does right before build_model: the same head init
    model = AutoModelForSequenceClassification.from_pretrained(
        resolve_model(spec["model"]), num_labels=1, problem_type="regression")
    bf16 = read_cpu().has_bf16  # cpudist's precision "auto"
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=BATCH,
                                 per_device_eval_batch_size=64, learning_rate=spec["plan"]["lr"],
                                 num_train_epochs=spec["plan"]["epochs"], use_cpu=True, bf16=bf16,
                                 seed=spec["seed"], report_to=[], save_strategy="no",
                                 eval_strategy="no", logging_strategy="steps", logging_steps=1,
                                 dataloader_num_workers=0, disable_tqdm=True, **spec["overrides"])
        trainer = Trainer(model=model, args=args, train_dataset=rows(data.train),
                          data_collator=DataCollatorWithPadding(tok), callbacks=[Losses()])
        start = time.perf_counter()
        trainer.train()
        train_time = time.perf_counter() - start
        out = trainer.predict(rows(data.validation))
    # group_by_length reorders evaluation too (transformers 5): score against the label_ids that
    # come back with the predictions, in their order, not against the file's
    metrics = compute_metrics(("pearson", "spearmanr"),
                              np.asarray(out.predictions, dtype=np.float64).reshape(-1),
                              np.asarray(out.label_ids, dtype=np.float64).reshape(-1))
    return {"metrics": metrics, "losses": losses, "lrs": lrs, "train_time_s": train_time,
            "precision": "bf16" if bf16 else "fp32"}


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """Metrics, last-step loss and the mean loss of the last tenth of the steps (one step is
    noisy)."""
    losses = run["losses"]
    tail = losses[-max(1, len(losses) // 10):]
    return {"pearson": run["metrics"]["pearson"], "spearmanr": run["metrics"]["spearmanr"],
            "final_loss": losses[-1], "tail_loss": statistics.fmean(tail), "steps": len(losses),
            "first_lrs": run["lrs"][:3], "train_time_s": run["train_time_s"],
            "precision": run["precision"], "command": run["command"]}


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def versions() -> dict[str, str]:
    import torch
    import transformers

    return {"python": sys.version.split()[0], "torch": torch.__version__,
            "transformers": transformers.__version__}


def table(runs: list[dict[str, Any]], plan: str) -> list[str]:
    """Markdown rows: one per arm, seeds averaged, with the gap to cpudist's defaults."""
    mine = [r for r in runs if r["plan"] == plan]
    names = list(dict.fromkeys(r["arm"] for r in mine))
    mean = {n: statistics.fmean(r["pearson"] for r in mine if r["arm"] == n) for n in names}
    def seeds(rs: list[dict[str, Any]]) -> str:
        return ", ".join(f"{r['seed']}: {r['pearson']:.4f}" for r in rs)

    lines = ["| arm | Pearson | Spearman | tail loss | last loss | Pearson - cpudist | per seed "
             "(Pearson) |",
             "|---|---|---|---|---|---|---|"]
    for n in names:
        rs = [r for r in mine if r["arm"] == n]
        lines.append(f"| {n} | {mean[n]:.4f} | {statistics.fmean(r['spearmanr'] for r in rs):.4f} "
                     f"| {statistics.fmean(r['tail_loss'] for r in rs):.3f} | "
                     f"{statistics.fmean(r['final_loss'] for r in rs):.3f} | "
                     f"{mean[n] - mean.get('cpudist', mean[n]):+.4f} | {seeds(rs)} |")
    return lines


def markdown(res: dict[str, Any]) -> str:
    p = res["proxy"]
    lines = ["# Regression parity with HF Trainer (STS-B PROXY built from MRPC, not STS-B)", "",
             f"Made by: `{res['command']}`", "",
             f"CPU: {res['cpu_model']}; {res['versions']}; model {res['model']}; batch {BATCH}, "
             f"max length {MAX_LEN}, precision {res['runs'][0]['precision']} in both arms; same "
             "classifier init.", "",
             f"Proxy data: {p['formula']}; {p['train_rows']} train rows (seeded sample of MRPC "
             f"train), {p['dev_rows']} dev rows (MRPC dev); train score mean "
             f"{p['train_score_mean']:.2f}, variance {p['train_score_variance']:.2f} (the MSE of "
             "always predicting the mean); the MSE of predicting 0, where a fresh regression head "
             f"starts, is {p['train_score_mean_square']:.2f}.", "",
             "Tail loss: mean training MSE over the last tenth of the steps. Arms change one "
             "default at a "
             "time (cpudist: warmup 0.1, weight decay 0.01, no clipping, length-grouped batches; "
             "HF: warmup 0, weight decay 0, max_grad_norm 1.0, random batches).", ""]
    for plan, spec in PLANS.items():
        if any(r["plan"] == plan for r in res["runs"]):
            lines += [f"## lr {spec['lr']}, {spec['epochs']} epoch(s)", "",
                      *table(res["runs"], plan), ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plans", default="short", help="comma list of: " + ", ".join(PLANS))
    ap.add_argument("--seeds", default="42")
    ap.add_argument("--arms",
                    help="comma list of arm numbers (0-based) for plan short; default all")
    ap.add_argument("--long-arms", default="0,1", help="arm numbers for plan long (3 epochs: slow)")
    ap.add_argument("--train-rows", type=int, default=1600)
    ap.add_argument("--model", default=MINILM)
    ap.add_argument("--tag", default="regression-parity")
    ap.add_argument("--hf-arm", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.hf_arm:
        print(json.dumps(hf_arm(json.loads(a.hf_arm))), flush=True)
        return
    short = [ARMS[int(i)] for i in a.arms.split(",")] if a.arms else list(ARMS)
    arms = {"short": short, "long": [ARMS[int(i)] for i in a.long_arms.split(",")]}
    runs = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        proxy = build_proxy(tmp / "data", a.train_rows, seed=0)
        for plan in a.plans.split(","):
            for seed in (int(s) for s in a.seeds.split(",")):
                for arm in arms[plan]:
                    if arm.trainer == "cpudist":
                        run = run_cpudist(arm, tmp / "data", a.model, PLANS[plan], seed,
                                          tmp / f"{len(runs)}")
                    else:
                        run = run_hf(arm, tmp / "data", a.model, PLANS[plan], seed)
                    row = {"plan": plan, "seed": seed, "arm": arm.name, "trainer": arm.trainer,
                           "overrides": arm.overrides, **summarize(run)}
                    runs.append(row)
                    print(json.dumps({k: row[k]
                                      for k in ("plan", "seed", "arm", "pearson", "spearmanr",
                                                "tail_loss", "final_loss", "first_lrs")}),
                          flush=True)
                    res = {"command": "HF_HUB_OFFLINE=1 python benchmarks/regression_parity.py "
                                      + shlex.join(sys.argv[1:]),
                           "cpu_model": cpu_model(), "versions": versions(), "model": a.model,
                           "proxy": proxy,
                           "plans": PLANS,
                           "arms": {p: [asdict(x) for x in xs] for p, xs in arms.items()},
                           "runs": runs}
                    # after every run: an interrupted run keeps what it measured
                    write_results(res, a.tag)
    print(markdown(res))


def write_results(res: dict[str, Any], tag: str) -> None:
    (HERE / "results" / f"{tag}.json").write_text(json.dumps(res, indent=2) + "\n")
    (HERE / "results" / f"{tag}.md").write_text(markdown(res))


if __name__ == "__main__":
    main()
