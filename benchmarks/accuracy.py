"""Accuracy check: fine-tune the offline all-MiniLM-L6-v2 with `cpudist run` on 2 ranks.

    python benchmarks/accuracy.py                 # MRPC and emotion, 3 epochs each
    python benchmarks/accuracy.py --tasks mrpc --epochs 1

Writes benchmarks/results/accuracy-<task>.json and accuracy.md with the exact commands.
The majority-class baseline is computed from the same dev file, so the gain is measured.
"""

from __future__ import annotations

import argparse
import collections
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data"
MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # resolved to the pip-packaged copy offline

TASKS = {
    "mrpc": ["mrpc", "--data-dir", str(DATA / "glue" / "MRPC")],
    "emotion": ["custom", "--train-file", str(DATA / "emotion" / "train.txt"), "--validation-file",
                str(DATA / "emotion" / "val.txt"), "--label-column", "label_name"],
}


def majority(task: str) -> float:
    """Accuracy of always predicting the most frequent dev label."""
    if task == "mrpc":
        lines = ((DATA / "glue" / "MRPC" / "dev.tsv").read_text(encoding="utf-8-sig")
                 .splitlines()[1:])
        labels = [line.split("\t")[0] for line in lines if line.strip()]
    else:
        lines = (DATA / "emotion" / "val.txt").read_text().splitlines()[1:]
        labels = [line.rsplit(";", 1)[1] for line in lines if line.strip()]
    return collections.Counter(labels).most_common(1)[0][1] / len(labels)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="mrpc,emotion")
    ap.add_argument("--epochs", type=float, default=3.0)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args()
    rows = []
    for task in args.tasks.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = ["cpudist", "run", *TASKS[task], "--model", MODEL, "--np", str(args.np),
                   "--epochs", f"{args.epochs:g}", "--lr", f"{args.lr:g}", "--batch-size",
                   str(args.batch_size), "--max-seq-len", "128", "--output-dir", f"{tmp}/run",
                   "--ledger", f"{tmp}/ledger.jsonl", "--json", "--quiet"]
            print("$", shlex.join(cmd), file=sys.stderr, flush=True)
            out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
        result = json.loads(out)
        row = {"task": task, "command": shlex.join(cmd), "majority_class_accuracy": majority(task),
               "metrics": result["metrics"], "world_size": result["world_size"],
               "train_time_s": result["train_time_s"],
               "train_samples_per_s": result["train_samples_per_s"],
               "precision": result["precision"], "cpu": result["cpu"],
               "versions": result["versions"]}
        (HERE / "results" / f"accuracy-{task}.json").write_text(json.dumps(row, indent=2) + "\n")
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("task", "majority_class_accuracy", "metrics")}),
              flush=True)
    md = ["# Accuracy of `cpudist run` (offline all-MiniLM-L6-v2)", "",
          f"Made by: `python benchmarks/accuracy.py --tasks {args.tasks} --epochs {args.epochs:g}`",
          "",
          "| task | ranks | precision | majority class | accuracy | other metrics | train time (s) "
          "| samples/s |",
          "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        other = " ".join(f"{k}={v:.4f}" for k, v in r["metrics"].items() if k != "accuracy")
        md.append(f"| {r['task']} | {r['world_size']} | {r['precision']} | "
                  f"{r['majority_class_accuracy']:.4f} | {r['metrics']['accuracy']:.4f} | {other} "
                  f"| {r['train_time_s']:.0f} | {r['train_samples_per_s']:.1f} |")
    md += ["", "Train times here are not speed claims (they vary with what else the machine runs): "
           "benchmarks/throughput.py measures speed.", "", "Commands:",
           ""] + [f"- `{r['command']}`" for r in rows]
    (HERE / "results" / "accuracy.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
