"""A node lost mid-run and brought back: `cpudist run --elastic` against today's stop-replace-resume
and against the same run untouched, on the miniature cluster (issue 46).

    # in miniature (300 MRPC rows, 1 seed): minutes; answers nothing
    python benchmarks/elastic.py --quick
    # the plan: MRPC 3 epochs on 4 hosts, every arm for each seed; a stretch stops at --hours,
    # the next goes on from the ledger
    python benchmarks/elastic.py --seeds 42,43,44 --hours 1

Hosts: benchmarks/miniature.py's halfcore layout (4 namespace hosts, half a core each by CFS quota,
no two ranks on one core's time), every link shaped to --link-gbps (0.5 Gbit/s unless given).
Arms, each seed:

- straight: `cpudist run mrpc --elastic` on the 4 hosts, untouched;
- elastic: the same; at a step drawn from the seed (20-50% into the run) host 3 is lost as a
  reclaimed spot node is: its link goes down (no FIN or RST reaches anyone), then its rank is
  killed; --away-s later its link is back (the replacement at the same address) and cpudist starts
  it again;
- restart: today's path (no --elastic, ddp, --checkpoint-every): the same loss at the same step
  ends the run; --away-s after the loss the link is back and `--resume auto` goes on from the last
  checkpoint;
- ddp: the restart arm's run untouched (no --elastic): its time lost is measured against this one,
  as an elastic step costs more than a ddp step (a quorum each step).

Measured: each arm's wall time to its end and final accuracy. For elastic, the others' stall (the
head's steps.jsonl: from the last step committed before the loss to the first after it, less the
median step) is the training time a node loss cost them; rejoin_s runs from cpudist starting the
node again (the try that took: it tries every few seconds while the node is away) to the head's
first step committed by all 4 nodes, and rejoin_startup is where the node's own part of it went
(its result's startup phases, the heal in its first step). For restart, the time lost is its
wall time less the straight run's. `summary` holds seconds_lost_per_node_loss, rejoin_s and
accuracy_delta_points (elastic against straight, medians over seeds).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from miniature import CPUDIST, LAYOUTS, miniature, shaped, ssh_setup
from tta_ledger import machine, speed_probe_s

from cpudist.results.launched import RANK_REPORT
from cpudist.wire.elastic import node_folder

HERE = Path(__file__).resolve().parent
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
DATA = HERE.parents[1] / "shared" / "data" / "glue" / "MRPC"
ARMS = ("straight", "elastic", "restart", "ddp")
# bumped by hand when what a run measures changes (elastic-2: the Lighthouse's longer join wait;
# elastic-3: each node draws its own dropout noise; rejoin_s from the start that took, not the
# first try while the node was still away; the returning node's startup recorded; elastic-4: the
# average sends what ddp sends across nodes, the word embedding's touched rows in bf16, not every
# gradient in fp32; straight and ddp record their step anatomy)
PROTOCOL = "elastic-4"
LOST = 3  # the host that is lost
BATCH, LR, EVERY = 32, "5e-5", 20  # per host; --checkpoint-every of the restart arm


def job_args(out: Path, hostfile: Path, seed: int, rows: list[str], elastic: bool) -> list[str]:
    return ["run", "mrpc", "--data-dir", str(DATA), "--model", MODEL, "--hostfile", str(hostfile),
            "--np", "4", "--ppn", "1", "--batch-size", str(BATCH), "--lr", LR, "--epochs", "3",
            "--seed", str(seed), "--log-every", "1", "--save-model", "none", "--output-dir",
            str(out), *rows, *(["--elastic"] if elastic else ["--checkpoint-every", str(EVERY)])]


def head_steps(out: Path) -> list[dict[str, Any]]:
    path = out / "steps.jsonl"
    text = path.read_text() if path.is_file() else ""
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


class Run:
    """`cpudist ARGS` on host 0, its output lines stamped with the time they came."""

    def __init__(self, cluster: Any, args: list[str]) -> None:
        print(f"$ [{cluster.name(0)}] cpudist {shlex.join(args)}", file=sys.stderr, flush=True)
        self.started = time.time()
        self.lines: list[tuple[float, str]] = []
        self.proc = subprocess.Popen(cluster.exec_argv(0, [*CPUDIST, *args]),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def wait(self, timeout: float = 4 * 3600) -> tuple[int, float]:
        code = self.proc.wait(timeout)
        self.reader.join(30)
        return code, time.time() - self.started

    def all_said(self, text: str) -> list[float]:
        return [t for t, line in self.lines if text in line]


def lose(cluster: Any, out: Path, step: int, run: Run) -> float:
    """Wait for the head's `step`, then take host LOST away (link down, rank killed): when."""
    while not head_steps(out) or head_steps(out)[-1]["step"] < step:
        if run.proc.poll() is not None:
            raise RuntimeError(f"the run ended before step {step}: {run.lines[-5:]}")
        time.sleep(0.2)
    subprocess.run(["ip", "-n", cluster.name(LOST), "link", "set", "eth0", "down"], check=True)
    at = time.time()
    for pid in cluster.pids(LOST):
        with contextlib.suppress(OSError):
            if b"cpudist.rank" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
    return at


def back(cluster: Any) -> None:
    subprocess.run(["ip", "-n", cluster.name(LOST), "link", "set", "eth0", "up"], check=True)


def accuracy(out: Path) -> float:
    return float(json.loads((out / "result.json").read_text())["metrics"]["accuracy"])


def straight(cluster: Any, work: Path, seed: int, rows: list[str],
             elastic: bool = True) -> dict[str, Any]:
    out = work / f"{'straight' if elastic else 'ddp'}-{seed}"
    run = Run(cluster, job_args(out, cluster.hostfile, seed, rows, elastic=elastic))
    code, wall = run.wait()
    if code != 0:
        raise RuntimeError(f"straight run failed: {run.lines[-10:]}")
    recorded = json.loads((out / "result.json").read_text())
    return {"wall_s": round(wall, 1), "accuracy": accuracy(out), "steps": len(head_steps(out)),
            # where a step went on the head (elastic: the wire's parts too)
            "step_anatomy": recorded.get("step_anatomy")}


def elastic(cluster: Any, work: Path, seed: int, rows: list[str], step: int,
            away_s: float) -> dict[str, Any]:
    out = work / f"elastic-{seed}"
    run = Run(cluster, job_args(out, cluster.hostfile, seed, rows, elastic=True))
    lost_at = lose(cluster, out, step, run)
    time.sleep(away_s)
    back(cluster)
    code, wall = run.wait()
    if code != 0:
        raise RuntimeError(f"elastic run failed: {run.lines[-10:]}")
    steps = head_steps(out)
    before = [s for s in steps if s["time"] <= lost_at]
    after = [s for s in steps if s["time"] > lost_at]
    median = statistics.median(s["step_time_s"] for s in steps)
    stall = after[0]["time"] - before[-1]["time"] - median
    # cpudist tries to start the node every RETRY_S while it is away; the try that took is the
    # last before the node's first step trained: the first the head committed at 4 nodes after
    # the first try (the node's own steps.jsonl also holds the lines it took from a peer)
    starts = run.all_said(f"starting {cluster.name(LOST)} again")
    full = [s["time"] for s in after if s["replicas"] == 4 and starts and s["time"] > starts[0]]
    restarted = max((t for t in starts if full and t < full[0]), default=None)
    rejoin = full[0] - restarted if restarted is not None and full else None
    # where the rejoin went: the returning node's own startup, from the command's start on the node
    # to its first step (whose quorum holds the heal from a peer)
    report = Path(node_folder(str(out), LOST)) / RANK_REPORT
    startup = json.loads(report.read_text()).get("startup") if report.is_file() else None
    return {"wall_s": round(wall, 1), "accuracy": accuracy(out), "lost_at_step": before[-1]["step"],
            "stall_s": round(stall, 2), "rejoin_s": None if rejoin is None else round(rejoin, 2),
            "membership": json.loads((out / "result.json").read_text())["membership"],
            # the head's steps trained by fewer than 4 nodes (the loss's, or a heal thrashing)
            "steps_short": sum(s["replicas"] < 4 for s in steps),
            "median_step_s": round(median, 3), "start_tries": len(starts),
            "rejoin_startup": startup}


def restart(cluster: Any, work: Path, seed: int, rows: list[str], step: int,
            away_s: float) -> dict[str, Any]:
    out = work / f"restart-{seed}"
    first = Run(cluster, job_args(out, cluster.hostfile, seed, rows, elastic=False))
    lost_at = lose(cluster, out, step, first)
    code, wall1 = first.wait()
    if code == 0:
        raise RuntimeError("the run went on without its node: nothing to compare")
    time.sleep(max(0.0, lost_at + away_s - time.time()))
    back(cluster)
    gap = time.time() - first.started - wall1
    second = Run(cluster, [*job_args(out, cluster.hostfile, seed, rows, elastic=False),
                           "--resume", "auto"])
    code, wall2 = second.wait()
    if code != 0:
        raise RuntimeError(f"the resume failed: {second.lines[-10:]}")
    return {"wall_s": round(wall1 + gap + wall2, 1), "accuracy": accuracy(out),
            "first_s": round(wall1, 1), "away_s": round(gap, 1), "resume_s": round(wall2, 1)}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by = {arm: {r["seed"]: r["run"] for r in runs if r["arm"] == arm} for arm in ARMS}
    med = statistics.median
    out: dict[str, Any] = {}
    # the machines' speeds (tta_ledger.speed_probe_s): arms compare where these agree
    if probes := [r["speed_probe_s"] for r in runs if r.get("speed_probe_s")]:
        out["speed_probe_s"] = [min(probes), max(probes)]
    if ddp := sorted(set(by["straight"]) & set(by["ddp"])):  # what --elastic costs without a loss
        out["straight_elastic_over_ddp"] = round(med(
            by["straight"][s]["wall_s"] / by["ddp"][s]["wall_s"] for s in ddp), 3)
        out["straight_ddp_seeds"] = ddp
    seeds = sorted(set(by["straight"]) & set(by["elastic"]))
    if not seeds:
        return out
    out |= {"seeds": seeds,
            "seconds_lost_per_node_loss": med(by["elastic"][s]["stall_s"] for s in seeds),
            # None: no returning node trained a step before the run ended
            "rejoin_s": med(rejoins) if (rejoins := [by["elastic"][s]["rejoin_s"] for s in seeds
                                                     if by["elastic"][s]["rejoin_s"] is not None])
            else None,
            "accuracy_delta_points": round(100 * (med(by["elastic"][s]["accuracy"] for s in seeds)
                                                  - med(by["straight"][s]["accuracy"]
                                                        for s in seeds)), 2),
            "elastic_wall_lost_s": med(by["elastic"][s]["wall_s"] - by["straight"][s]["wall_s"]
                                       for s in seeds)}
    both = [s for s in seeds if s in by["restart"] and s in by["ddp"]]
    if both:  # today's path against its own untouched run
        out["restart_seconds_lost_per_node_loss"] = med(
            by["restart"][s]["wall_s"] - by["ddp"][s]["wall_s"] for s in both)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="300 rows, 1 seed: answers nothing")
    ap.add_argument("--seeds", default="42,43,44")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--away-s", type=float, default=60.0,
                    help="how long the lost host stays away (a replacement's boot)")
    ap.add_argument("--link-gbps", type=float, default=0.5)
    ap.add_argument("--hours", type=float, help="no run starts past this")
    ap.add_argument("--results-dir", type=Path, default=HERE / "results")
    a = ap.parse_args()
    kind = machine()["cpu_kind"]
    name = f"elastic{'-quick' if a.quick else ''}-{kind}"
    ledger = a.results_dir / f"{name}-ledger.jsonl"
    lines = [json.loads(x) for x in ledger.read_text().splitlines()] if ledger.is_file() else []
    mine = [x for x in lines if x["protocol"] == PROTOCOL and x["cpu_kind"] == kind]
    seeds = [42] if a.quick else [int(s) for s in a.seeds.split(",")]
    rows = ["--max-train-samples", "300", "--max-eval-samples", "100"] if a.quick else []
    todo = [(s, arm) for s in seeds for arm in a.arms.split(",")
            if not any(x["seed"] == s and x["arm"] == arm for x in mine)]
    command = "python benchmarks/elastic.py " + shlex.join(sys.argv[1:])
    deadline = time.monotonic() + a.hours * 3600 if a.hours else None
    if todo:
        # before anything of the stretch computes
        print(f"# speed probe: {speed_probe_s():.3f} s", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="elastic-") as tmp, \
                miniature(LAYOUTS["halfcore"], Path(tmp) / "cluster", "ela") as c:
            work = Path(tmp)
            ssh_setup(c)
            cluster = shaped(c, a.link_gbps)
            for seed, arm in todo:
                if deadline is not None and time.monotonic() > deadline:
                    print("# stretch over", file=sys.stderr, flush=True)
                    break
                steps = 3 * 3668 // (BATCH * 4) if not a.quick else 3 * 300 // (BATCH * 4)
                step = random.Random(seed).randint(steps // 5, steps // 2)
                r = (straight(cluster, work, seed, rows) if arm == "straight"
                     else straight(cluster, work, seed, rows, elastic=False) if arm == "ddp"
                     else elastic(cluster, work, seed, rows, step, a.away_s) if arm == "elastic"
                     else restart(cluster, work, seed, rows, step, a.away_s))
                print(f"# {arm} seed {seed}: {r}", file=sys.stderr, flush=True)
                line = {"protocol": PROTOCOL, **machine(), "speed_probe_s": speed_probe_s(),
                        "arm": arm, "seed": seed,
                        "lost_step": step, "away_s": a.away_s, "link_gbps": a.link_gbps,
                        "command": command, "run": r}
                lines.append(line)
                mine.append(line)
                ledger.parent.mkdir(parents=True, exist_ok=True)
                with ledger.open("a") as f:
                    f.write(json.dumps(line) + "\n")
    res = {"command": command, **machine(), "ledger": str(ledger.name), "cluster": "halfcore x4",
           "summary": summary(mine), "runs": mine,
           # the ledger's earlier protocols, each summed up apart (their runs: the ledger)
           "earlier": {p: summary([x for x in lines if x["protocol"] == p
                                   and x["cpu_kind"] == kind])
                       for p in dict.fromkeys(x["protocol"] for x in lines) if p != PROTOCOL}}
    (a.results_dir / f"{name}.json").write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res["summary"], indent=2))


if __name__ == "__main__":
    main()
