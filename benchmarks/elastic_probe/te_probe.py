"""torchrun's elastic agent on loopback: 3 agents (--nnodes 1:3, c10d rendezvous); one node is lost
(its worker, or its agent and worker, SIGKILLed by PID) and a new agent for it joins later.

    python te_probe.py --kill worker --out te_worker
    python te_probe.py --kill agent --rdzv-conf last_call_timeout=2,keep_alive_interval=1 \
        --out te_a2

Prints a JSON summary: the survivors' longest gap between steps, the steps trained again after the
restart (resumed from the shared checkpoint), and the new agent's start to its first step.
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


def agent(node, args, run):
    env = dict(os.environ, PROBE_NODE=str(node), CKPT_EVERY=str(args.ckpt_every))
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes",
            f"{args.min_nodes}:{args.nodes}", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", "127.0.0.1:29400", "--rdzv-id", "probe46", "--max-restarts", "10",
            "--monitor-interval", "0.5", "--local-addr", "127.0.0.1"]
    if args.rdzv_conf:
        argv += ["--rdzv-conf", args.rdzv_conf]
    argv += [str(HERE / "te_train.py"), str(args.steps), str(run)]
    return subprocess.Popen(argv, env=env, stdout=open(run / f"agent{node}.log", "a"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def rows(run, node):
    try:
        return [json.loads(x) for x in open(run / f"worker-{node}.jsonl")]
    except (OSError, ValueError):
        return []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--min-nodes", type=int, default=1)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--kill", choices=["worker", "agent"], default="agent")
    ap.add_argument("--kill-at", type=float, default=8.0)
    ap.add_argument("--back-at", type=float, default=40.0)
    ap.add_argument("--rdzv-conf", default="")
    ap.add_argument("--out", default="te_run")
    args = ap.parse_args()
    run = OUT / args.out
    run.mkdir(parents=True, exist_ok=True)
    for f in run.glob("*"):
        f.unlink()
    victim = args.nodes - 1
    ev = {"launched": time.time()}
    agents = {0: agent(0, args, run)}
    time.sleep(3)  # agent 0 starts first, so it is the one hosting the c10d rendezvous store
    agents.update({n: agent(n, args, run) for n in range(1, args.nodes)})
    try:
        while not all(any(r["event"] == "step" and r["world"] == args.nodes for r in rows(run, n))
                      for n in range(args.nodes)):
            if time.time() - ev["launched"] > 120:
                raise SystemExit(f"never trained at {args.nodes} nodes: see {run}/agent*.log")
            time.sleep(0.2)
        t0 = ev["t0"] = time.time()
        ev["launch_to_full_size_s"] = round(t0 - ev["launched"], 2)
        while time.time() - t0 < args.kill_at:
            time.sleep(0.2)
        wpid = [r for r in rows(run, victim) if r["event"] == "start"][-1]["pid"]
        os.kill(wpid, signal.SIGKILL)
        if args.kill == "agent":
            os.kill(agents[victim].pid, signal.SIGKILL)
            agents[victim].wait()
        ev["killed"] = time.time()
        if args.kill == "agent":
            while time.time() - t0 < args.back_at:
                time.sleep(0.2)
            ev["restarted"] = time.time()
            agents[victim] = agent(victim, args, run)
        for a in agents.values():
            a.wait(timeout=600)
    finally:
        for a in agents.values():
            if a.poll() is None:
                os.killpg(a.pid, signal.SIGKILL)
    print(json.dumps(summarize(run, args, ev), indent=1))


def summarize(run, args, ev):
    res = {"config": vars(args), "launch_to_full_size_s": ev["launch_to_full_size_s"]}
    for n in range(args.nodes - 1):
        rs = rows(run, n)
        steps = [r for r in rs if r["event"] == "step"]
        ts = [s["t"] for s in steps if s["t"] > ev["killed"] - 3]
        gaps = [b - a for a, b in itertools.pairwise(ts)]
        before = max(s["step"] for s in steps if s["t"] < ev["killed"])
        ready = [r for r in rs if r["event"] == "ready" and r["t"] > ev["killed"]]
        first_small = next((s for s in steps if s["t"] > ev["killed"]
                            and s["world"] == args.nodes - 1), None)
        res[f"node{n}"] = {
            "median_step_s": round(sorted(s["dt"] for s in steps)[len(steps) // 2], 3),
            "worker_restarts": sum(r["event"] == "start" for r in rs) - 1,
            "max_gap_after_kill_s": round(max(gaps), 2) if gaps else None,
            "gaps_over_2s": [round(g, 1) for g in gaps if g > 2],
            "step_at_kill": before,
            "resumed_from_step": ready[0]["resumed_step"] if ready else None,
            "kill_to_first_step_at_n_minus_1_s":
                round(first_small["t"] - ev["killed"], 2) if first_small else None,
            "worlds_after_kill": sorted({s["world"] for s in steps if s["t"] > ev["killed"]}),
            "final_step": steps[-1]["step"], "final_psum": steps[-1]["psum"],
        }
    if "restarted" in ev:
        rs = [r for r in rows(run, args.nodes - 1) if r["t"] > ev["restarted"]]
        first = next((r for r in rs if r["event"] == "step"), None)
        res["victim"] = {
            "restart_to_first_step_s": round(first["t"] - ev["restarted"], 2) if first else None,
            "final_step": rs[-1].get("step") if rs else None,
        }
    return res


if __name__ == "__main__":
    main()
