"""Laptop to first step: `cpudist run` from the laptop on a warm 4-node cluster, against torchrun by
hand on the head.

    python benchmarks/startup.py  # MiniLM on MRPC, 4 hosts x 1 rank, 3 alternated repeats
    python benchmarks/startup.py --model tiny --repeats 1

The world is tests/harness/world.py's on-prem one: 4 namespace hosts (own homes, names resolving to
private addresses, sshd each), and a laptop that is not a node (its own home holding the data,
reaching the head by its public address). Both arms train the same job (MRPC, 4 ranks, 1 per host,
batch 32, --max-steps 2) and are timed from their command's start to the moment their observer reads
the first step's progress line:

- cpudist: `cpudist run mrpc --hostfile H --head <public address> --launcher torchrun --log-every 1`
  on the laptop, data in the laptop's home; the observer is the laptop (its `step 1/` line).
  Connecting, checking the staged inputs (unchanged: nothing is sent), the head's agent, torchrun on
  every node, the ranks' start.
- anchor (issue 24 item 4): on the head, by hand, with the data already on every node (the hosts'
  shared /work): one shell starting torchrun on the head and, over ssh (the cluster's ssh that
  `cpudist hosts ssh-setup` set up, ~/.cpudist/cluster/ssh), on the 3 others (`--node-rank i`,
  static rendezvous at the head), each running cpudist's rank module as torchrun's script; the
  observer is the head (rank 0's progress line). What a user who skipped cpudist would type.

Warm: each arm runs once before the timed repeats (staging done, each node's token cache filled, the
OS file cache hot); then the arms alternate. Goal: cpudist <= 1.3x the anchor (medians). `startup`
of rank 0's result.json (the phases before the first step) is kept for each run, and whether its
tokens came from the cache. Two cores serve the 4 hosts here: the ranks' imports compete for them in
both arms alike, so the ratio, not the seconds, is the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the harness lives in tests/, beside the package

from cpudist.cpu import read_cpu  # noqa: E402
from tests.harness.world import World  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "glue" / "MRPC"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
GOAL = 1.3
PORT = 29633


def first_step_after(proc: subprocess.Popen[str], needle: str, started: float,
                     timeout: float) -> float:
    """Seconds from `started` to the first output line holding `needle` (the command keeps
    running)."""
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        if needle in line:
            return time.time() - started
        if time.monotonic() > deadline:
            break
    raise RuntimeError(f"no {needle!r} line within {timeout:.0f} s (exit {proc.poll()})")


def finish(proc: subprocess.Popen[str], timeout: float) -> None:
    assert proc.stdout is not None
    proc.stdout.read()  # drain, so the command never blocks on a full pipe
    if proc.wait(timeout=timeout) != 0:
        raise RuntimeError(f"the command failed (exit {proc.returncode})")


def cpudist_arm(w: World, model: str, out: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "cpudist.cli", "run", "mrpc", "--np", "4", "--ppn", "1",
            "--hostfile", "/srv/cpd-operator/hosts", "--head", w.hosts.public_addr(0), "--user",
            "root", "--identity", "/srv/cpd-operator/.ssh/id_ed25519", "--remote-python",
            sys.executable, "--launcher", "torchrun", "--model", model, "--data-dir",
            "/srv/cpd-operator/data/MRPC", "--max-steps", "2", "--log-every", "1", "--output-dir",
            f"/srv/cpd-operator/runs/{out}"]
    started = time.time()
    proc = w.operator_popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    seconds = first_step_after(proc, "step 1/", started, 600)
    finish(proc, 600)
    result = json.loads(w.operator_path(f"runs/{out}/result.json").read_text())
    return {"arm": "cpudist", "to_first_step_s": seconds, "startup": result.get("startup"),
            "staging": result.get("staging"), "command": shlex.join(argv)}


def anchor_arm(w: World, model: str, out: str) -> dict[str, Any]:
    head = w.hosts.name(0)
    rank_args = ["-m", "cpudist.rank", "--task=mrpc", f"--model={model}", f"--data-dir={DATA}",
                 "--max-steps=2", "--log-every=1"]

    def torchrun(i: int) -> str:
        # HF_HUB_OFFLINE as cpudist sets it on an offline cluster (else each rank tries the Hub
        # first)
        return "HF_HUB_OFFLINE=1 " + shlex.join([
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "4", "--nproc-per-node", "1",
            "--node-rank",
            str(i), "--master-addr", head, "--master-port", str(PORT), *rank_args,
            f"--output-dir=/tmp/{out}-n{i}"])

    script = "\n".join([f"{torchrun(0)} &"]
                       + [f"~/.cpudist/cluster/ssh {w.hosts.name(i)} {shlex.quote(torchrun(i))} "
                            f"> /dev/null 2>&1 &" for i in range(1, 4)]
                       + ["wait"])
    started = time.time()
    proc = subprocess.Popen(w.hosts.exec_argv(0, ["sh", "-c", script]), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    try:
        seconds = first_step_after(proc, '"event": "progress", "step": 1,', started, 600)
        finish(proc, 600)
        result = json.loads(Path(f"/tmp/{out}-n0/result.json").read_text())
    finally:  # the namespace hosts share this machine's /tmp: their run folders go with the arm
        for i in range(4):
            shutil.rmtree(f"/tmp/{out}-n{i}", ignore_errors=True)
    return {"arm": "anchor", "to_first_step_s": seconds, "startup": result.get("startup"),
            "command": script}


def markdown(res: dict[str, Any]) -> str:
    lines = [f"# Laptop to first step ({res['cpu_kind']})", "", f"`{res['command']}`", "",
             f"CPU {res['cpu']}; model {res['model']}; 4 namespace hosts x 1 rank on this "
             f"machine's {os.cpu_count()} cores.", "",
             "| arm | seconds to the first step per repeat | median |", "|---|---|---|"]
    for arm in ("cpudist", "anchor"):
        times = [r["to_first_step_s"] for r in res["runs"] if r["arm"] == arm and not r["warm_up"]]
        lines.append(f"| {arm} | {' / '.join(f'{t:.1f}' for t in times)} | "
                     f"{statistics.median(times):.1f} |")
    s = res["summary"]
    lines += ["",
              f"cpudist / anchor: **{s['ratio']:.2f}x** (goal <= {GOAL}x: "
              f"{'met' if s['met'] else 'not met'}). Rank 0's tokens came from the node's cache in "
              f"every timed cpudist run: {s['tokens_cached']}.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=MINILM)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prefix", default="sup")
    ap.add_argument("--results-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    a = ap.parse_args()
    command = "python benchmarks/startup.py " + shlex.join(sys.argv[1:])
    runs: list[dict[str, Any]] = []
    # a stopped benchmark still takes its world down
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="startup-") as tmp:
        w = World(4, Path(tmp), prefix=a.prefix)
        w.up()
        try:
            key = w.operator_path(".ssh/id_ed25519")
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                           check=True)
            w.on_prem(key.with_suffix(".pub").read_text())
            hosts = "".join(f"{w.hosts.name(i)}\n" for i in range(4))
            (w.state / "hostfile").write_text(hosts)
            w.operator_path("hosts").write_text(hosts)
            admin = w.state / "admin_ed25519"
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(admin)],
                           check=True)
            w.on_prem(admin.with_suffix(".pub").read_text())
            setup = w.hosts.run(0,
                                [sys.executable, "-m", "cpudist.cli", "hosts", "ssh-setup",
                                 "--hostfile", str(w.state / "hostfile"), "--identity", str(admin)])
            if setup.returncode != 0:
                raise SystemExit(setup.stdout + setup.stderr)
            w.operator_path("data").mkdir(parents=True, exist_ok=True)
            # the laptop's own copy; the nodes' is /work
            shutil.copytree(DATA, w.operator_path("data/MRPC"))
            for repeat in range(a.repeats + 1):  # repeat 0 warms both arms up
                for arm in (cpudist_arm, anchor_arm):
                    r = arm(w, a.model, f"{arm.__name__}-{repeat}")
                    r["warm_up"] = repeat == 0
                    runs.append(r)
                    print(f"# {r['arm']} repeat {repeat}: {r['to_first_step_s']:.1f} s",
                          file=sys.stderr, flush=True)
        finally:
            w.down()
    timed = {arm: statistics.median(r["to_first_step_s"] for r in runs if r["arm"] == arm
                                    and not r["warm_up"])
             for arm in ("cpudist", "anchor")}
    ratio = timed["cpudist"] / timed["anchor"]
    cached = all((r.get("startup") or {}).get("tokens_cached") for r in runs
                 if r["arm"] == "cpudist"
                 and not r["warm_up"])
    cpu = read_cpu()
    res = {"command": command, "cpu": cpu.model, "cpu_kind": cpu.kind, "model": a.model,
           "runs": runs,
           "summary": {"median_s": timed, "ratio": ratio, "goal": GOAL, "met": ratio <= GOAL,
                       "tokens_cached": cached}}
    out = a.results_dir / f"startup-{cpu.kind}"
    out.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(res) + "\n")
    print(markdown(res), flush=True)


if __name__ == "__main__":
    main()
