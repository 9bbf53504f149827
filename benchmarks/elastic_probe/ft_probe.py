"""torchft on loopback: a Lighthouse + N one-process replica groups; one is SIGKILLed and restarted.

    /tmp/ftvenv/bin/python ft_probe.py --replicas 3 --kill-at 12 --back-at 24 --steps 150 --out run1

Prints a JSON summary: the survivors' longest step gap around the loss (seconds of their training a
loss cost), the returning replica's start to its first committed step, whether it healed from a
live peer, and whether all replicas end with the same weights.
"""

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = Path(os.environ.get("PROBE_OUT", "/tmp/probe46"))  # logs and runs go here, not in the repo
PY = sys.executable


def start_replica(rid, args, out, env):
    log = out / f"rep{rid}.jsonl"
    err = open(out / f"rep{rid}.err", "a")  # noqa: SIM115 (the child keeps it)
    return subprocess.Popen([PY, str(HERE / "ft_train.py"), str(rid), str(args.steps), str(log)],
                            env=env, stdout=err, stderr=subprocess.STDOUT)


def all_at_full_size(out, n):
    for rid in range(n):
        try:
            rows = read(out, rid)
        except (OSError, ValueError):
            return False
        if not any(r["event"] == "step" and r["n"] == n and r["committed"] for r in rows):
            return False
    return True


def read(out, rid):
    return [json.loads(line) for line in open(out / f"rep{rid}.jsonl")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--kill-at", type=float, default=12.0)
    ap.add_argument("--back-at", type=float, default=24.0)
    ap.add_argument("--victim", type=int, default=2)
    ap.add_argument("--heartbeat-timeout-ms", type=int, default=5000)
    ap.add_argument("--join-timeout-ms", type=int, default=60000)
    ap.add_argument("--out", default="run")
    args = ap.parse_args()
    out = OUT / args.out
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("*"):
        f.unlink()
    env = dict(os.environ, TORCHFT_LIGHTHOUSE="http://127.0.0.1:29510",
               ADVERTISE_HOST="127.0.0.1")
    lh = subprocess.Popen(
        [str(Path(PY).parent / "torchft_lighthouse"), "--min_replicas", "1",
         "--bind", "[::]:29510", "--quorum_tick_ms", "100",
         "--join_timeout_ms", str(args.join_timeout_ms),
         "--heartbeat_timeout_ms", str(args.heartbeat_timeout_ms)],
        stdout=open(out / "lighthouse.log", "w"), stderr=subprocess.STDOUT)  # noqa: SIM115
    time.sleep(1)
    procs = {rid: start_replica(rid, args, out, env) for rid in range(args.replicas)}
    events = {"launched": time.time()}
    try:
        while not all_at_full_size(out, args.replicas):
            time.sleep(0.2)
        t0 = events["t0"] = time.time()
        events["launch_to_full_size_s"] = round(t0 - events["launched"], 2)
        while time.time() - t0 < args.kill_at:
            time.sleep(0.2)
        procs[args.victim].send_signal(signal.SIGKILL)
        procs[args.victim].wait()
        events["killed"] = time.time()
        while time.time() - t0 < args.back_at:
            time.sleep(0.2)
        events["restarted"] = time.time()
        procs[args.victim] = start_replica(args.victim, args, out, env)
        for p in procs.values():
            p.wait(timeout=600)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        lh.send_signal(signal.SIGTERM)
        lh.wait()
    print(json.dumps(summarize(out, args, events), indent=1))


def summarize(out, args, ev):
    res = {"config": vars(args), "launch_to_full_size_s": ev["launch_to_full_size_s"]}
    survivors = [r for r in range(args.replicas) if r != args.victim]
    for rid in survivors:
        steps = [r for r in read(out, rid) if r["event"] == "step"]
        around = [s for s in steps if ev["killed"] - 5 < s["t"] < ev["killed"] + 120]
        ts = [s["t"] for s in around if s["committed"]]
        gaps = [b - a for a, b in itertools.pairwise(ts)]
        normal = sorted(s["dt"] for s in steps if s["committed"])[len(steps) // 2]
        first_n_minus = next((s for s in steps if s["t"] > ev["killed"]
                              and s["n"] == args.replicas - 1 and s["committed"]), None)
        back_n = next((s for s in steps if s["t"] > ev["restarted"]
                       and s["n"] == args.replicas and s["committed"]), None)
        res[f"rep{rid}"] = {
            "median_step_s": round(normal, 3),
            "max_gap_after_kill_s": round(max(gaps), 2) if gaps else None,
            "kill_to_first_commit_at_n_minus_1_s":
                round(first_n_minus["t"] - ev["killed"], 2) if first_n_minus else None,
            "uncommitted_steps": sum(not s["committed"] for s in steps),
            "restart_to_first_step_at_n_s":
                round(back_n["t"] - ev["restarted"], 2) if back_n else None,
            "final_psum": steps[-1]["psum"], "final_step": steps[-1]["step"],
        }
    v = read(out, args.victim)
    starts = [r for r in v if r["event"] == "start"]
    after = [r for r in v if r["event"] == "step" and r["t"] > ev["restarted"]]
    first = next((s for s in after if s["committed"]), None)
    res["victim"] = {
        "steps_before_kill": max((r["step"] for r in v if r["event"] == "step"
                                  and r["t"] < ev["killed"]), default=None),
        "final_step": after[-1]["step"] if after else None,
        "restart_to_python_start_s": round(starts[-1]["t"] - ev["restarted"], 2),
        "restart_to_first_commit_s": round(first["t"] - ev["restarted"], 2) if first else None,
        "first_step_after_restart": first["step"] if first else None,
        "healed_from_peer": bool(first and first["healed"]),
        "final_psum": after[-1]["psum"] if after else None,
    }
    return res


if __name__ == "__main__":
    main()
