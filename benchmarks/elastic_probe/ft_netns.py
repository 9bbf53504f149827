"""torchft across 3 namespace hosts: the Lighthouse on host 0, one replica per host; host 2's link
is dropped silently (`ip link set dev eth0 down` in its namespace, no RST to anyone) and raised
later.

    cd /work/main && /tmp/ftvenv/bin/python /tmp/probe46/ft_netns.py --down-at 8 --up-at 30 \
        --out ns1

Uses its own namespaces (prefix probe46, state /tmp/probe46/cluster) and tears them down at the end.
"""

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, "/work/main")
from tests.harness.netns import NetnsCluster

HERE = Path(__file__).resolve().parent
OUT = Path(os.environ.get("PROBE_OUT", "/tmp/probe46"))  # logs and runs go here, not in the repo
sys.path.insert(0, str(HERE))
from ft_probe import all_at_full_size, summarize  # noqa: E402

PY = sys.executable


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--down-at", type=float, default=8.0)
    ap.add_argument("--up-at", type=float, default=30.0)
    ap.add_argument("--heartbeat-timeout-ms", type=int, default=1000)
    ap.add_argument("--pg-timeout-s", type=float, default=10.0)
    ap.add_argument("--out", default="ns1")
    args = ap.parse_args()
    out = OUT / args.out
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("*"):
        f.unlink()
    cl = NetnsCluster(3, OUT / "cluster", prefix="probe46")
    cl.up()
    procs = []
    ev = {"launched": time.time()}
    try:
        lh_addr = f"http://{cl.addr(0)}:29510"
        procs.append(subprocess.Popen(cl.exec_argv(0, [
            str(Path(PY).parent / "torchft_lighthouse"), "--min_replicas", "1",
            "--bind", "[::]:29510", "--quorum_tick_ms", "100", "--join_timeout_ms", "60000",
            "--heartbeat_timeout_ms", str(args.heartbeat_timeout_ms)]),
            stdout=open(out / "lighthouse.log", "w"), stderr=subprocess.STDOUT))  # noqa: SIM115
        time.sleep(1)
        for i in range(3):
            env = dict(os.environ, TORCHFT_LIGHTHOUSE=lh_addr, BIND_HOST=cl.addr(i),
                       ADVERTISE_HOST=cl.addr(i), PG_TIMEOUT_S=str(args.pg_timeout_s))
            procs.append(subprocess.Popen(
                cl.exec_argv(i, [PY, str(HERE / "ft_train.py"), str(i), str(args.steps),
                                 str(out / f"rep{i}.jsonl")]),
                env=env, stdout=open(out / f"rep{i}.err", "w"),  # noqa: SIM115
                stderr=subprocess.STDOUT))
        while not all_at_full_size(out, 3):
            time.sleep(0.2)
        t0 = ev["t0"] = time.time()
        ev["launch_to_full_size_s"] = round(t0 - ev["launched"], 2)
        while time.time() - t0 < args.down_at:
            time.sleep(0.2)
        subprocess.run(["ip", "-n", cl.name(2), "link", "set", "dev", "eth0", "down"], check=True)
        ev["killed"] = time.time()
        while time.time() - t0 < args.up_at:
            time.sleep(0.2)
        subprocess.run(["ip", "-n", cl.name(2), "link", "set", "dev", "eth0", "up"], check=True)
        ev["restarted"] = time.time()
        for p in procs[1:]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=300)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
        cl.down()
    ns = argparse.Namespace(replicas=3, victim=2, **vars(args))
    res = summarize(out, ns, ev)
    res["victim_exit_codes"] = [p.returncode for p in procs]
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
