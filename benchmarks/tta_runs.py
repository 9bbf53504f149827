"""One run of benchmarks/time_to_accuracy.py: `cpudist run` on host 0, or HF Trainer under torchrun
by hand or under `cpudist launch`.

Both are timed alike: from the launch of the command on host 0 to the end of each evaluation (the
hosts share this machine's clock), the evaluations every fixed number of samples, on the same hosts,
link and ballast.
"""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from miniature import ballast, cpu_lock, on_head

HF_SCRIPT = Path(__file__).resolve().parent / "tta_hf.py"
HF_PORT = 29641
KEEP = ("run_id", "steps", "wall_time_s", "train_samples_per_s", "world_size", "global_batch_size",
        "sync", "lr",
        "metrics", "precision", "threads_per_rank", "comm_time_s", "exposed_comm_s",
        "measured_tx_bytes_per_step",
        "step_anatomy",  # rank 0's seconds per step in each part (cpudist/train/anatomy.py)
        "startup")  # rank 0's phases before its first step: what a host count adds before training


def steps_of(budget: int, batch: int, hosts: int) -> int:
    """Optimizer steps that train on `budget` samples at `batch` per host."""
    return max(1, budget // (batch * hosts))


def evaluations(seen: list[dict[str, Any]], launched: float) -> list[dict[str, Any]]:
    return [{"step": e["step"], "accuracy": e["metrics"]["accuracy"],
             "after_s": round(e["at"] - launched, 2),
             "eval_s": round(e["seconds"] or 0.0, 2)} for e in seen]


def cpudist_run(cluster: Any, work: Path, lock: Path | None, job: dict[str, Any],
                flags: tuple[str, ...], rows: list[str]) -> dict[str, Any]:
    """`cpudist run` for the job's budget, evaluating every fixed number of samples; its time to
    each evaluation."""
    hosts, batch = job["hosts"], job["batch"]
    out = Path(tempfile.mkdtemp(dir=work, prefix="run-"))
    args = ["run", job["task"], "--data-dir", str(job["data"]), "--model", job["model"],
            "--hostfile", str(cluster.hostfile), "--nodes", str(hosts), "--ppn", "1",
            "--batch-size", str(batch), "--lr", job["lr"], "--max-steps",
            str(steps_of(job["budget"], batch, hosts)), "--seed", str(job["seed"]), "--eval-every",
            str(steps_of(job["eval_every"], batch, hosts)), "--save-model", "none", "--output-dir",
            str(out / "run"), "--json", "--quiet", *rows, *flags]
    launched = time.time()
    try:
        r = on_head(cluster, args, lock, timeout=4 * 3600, used=hosts)
    except RuntimeError as e:
        print(f"# failed: {e}", file=sys.stderr, flush=True)
        return {"error": str(e)[-600:], "flags": list(flags), "seed": job["seed"], "hosts": hosts}
    return {**{k: r.get(k) for k in KEEP}, "hosts": hosts, "seed": job["seed"],
            "flags": list(flags), "eval_every": steps_of(job["eval_every"], batch, hosts),
            "evaluations": evaluations(list(r["evaluations"]), launched), "cpu": r["cpu"],
            "versions": r["versions"], "command": "cpudist " + shlex.join(args)}


def hf_lr(base: str, hosts: int) -> float:
    """The base lr times the processes: Accelerate's guide ("Comparing performance across
    distributed setups")."""
    return float(base) * hosts


def hf_args(job: dict[str, Any], out: Path, rows: list[str]) -> list[str]:
    """The HF Trainer script and its arguments for the job (its result in OUT/result.json)."""
    hosts, batch = job["hosts"], job["batch"]
    return [str(HF_SCRIPT), "--task", job["task"], "--data-dir", str(job["data"]), "--model",
            job["model"], "--batch-size", str(batch), "--lr", f"{hf_lr(job['lr'], hosts):g}",
            "--max-steps", str(steps_of(job["budget"], batch, hosts)), "--eval-steps",
            str(steps_of(job["eval_every"], batch, hosts)), "--seed", str(job["seed"]), "--out",
            str(out / "result.json"), *rows]


def hf_script(cluster: Any, job: dict[str, Any], out: Path, rows: list[str]) -> str:
    """What a user types on the head: torchrun there and, over the cluster's ssh, on every other
    host."""
    hosts, script = job["hosts"], hf_args(job, out, rows)

    def torchrun(i: int) -> str:
        return "HF_HUB_OFFLINE=1 " + shlex.join([
            sys.executable, "-m", "torch.distributed.run", "--nnodes", str(hosts),
            "--nproc-per-node", "1",
            "--node-rank", str(i), "--master-addr", cluster.name(0), "--master-port", str(HF_PORT),
            *script])

    others = [f"~/.cpudist/cluster/ssh {cluster.name(i)} {shlex.quote(torchrun(i))} > "
              f"{out}/node{i}.log 2>&1 &"
              for i in range(1, hosts)]
    return "\n".join([*others, f"{torchrun(0)} > {out}/node0.log 2>&1", "wait"])


def hf_run(cluster: Any, work: Path, lock: Path | None, job: dict[str, Any],
           rows: list[str]) -> dict[str, Any]:
    """HF Trainer under torchrun on the job's hosts, started by hand on the head; its time to each
    evaluation."""
    out = Path(tempfile.mkdtemp(dir=work, prefix="hf-"))
    script = hf_script(cluster, job, out, rows)
    print(f"$ [{cluster.name(0)}] {script}", file=sys.stderr, flush=True)
    launched = time.time()
    with cpu_lock(lock), ballast(cluster, job["hosts"]):
        done = cluster.run(0, ["sh", "-c", script], timeout=4 * 3600)
    result = out / "result.json"
    if done.returncode != 0 or not result.is_file():
        logs = "".join(p.read_text()[-1500:] for p in sorted(out.glob("node*.log")))
        print(f"# failed: HF Trainer exit {done.returncode}: {logs}", file=sys.stderr, flush=True)
        return {"error": logs[-600:], "seed": job["seed"], "hosts": job["hosts"]}
    r = json.loads(result.read_text())
    return {**r, "hosts": job["hosts"], "seed": job["seed"],
            "evaluations": evaluations(r["evaluations"], launched),
            "command": script, "launcher": "torchrun by hand on the head"}



def hf_launch_run(cluster: Any, work: Path, lock: Path | None, job: dict[str, Any],
                  rows: list[str]) -> dict[str, Any]:
    """The same HF Trainer script started by `cpudist launch` on the head (cpudist sets each rank's
    threads, allocator and rendezvous); its time to each evaluation."""
    hosts = job["hosts"]
    out = Path(tempfile.mkdtemp(dir=work, prefix="hfl-"))
    args = ["launch", "--hostfile", str(cluster.hostfile), "--nodes", str(hosts), "--ppn", "1",
            "--env", "HF_HUB_OFFLINE=1", "--output-dir", str(out / "launch"), "--quiet", "--",
            sys.executable, *hf_args(job, out, rows)]
    launched = time.time()
    try:
        on_head(cluster, args, lock, timeout=4 * 3600, used=hosts)
    except RuntimeError as e:
        print(f"# failed: {e}", file=sys.stderr, flush=True)
        return {"error": str(e)[-600:], "seed": job["seed"], "hosts": hosts}
    r = json.loads((out / "result.json").read_text())
    return {**r, "hosts": hosts, "seed": job["seed"],
            "evaluations": evaluations(r["evaluations"], launched),
            "command": "cpudist " + shlex.join(args), "launcher": "cpudist launch on the head"}
