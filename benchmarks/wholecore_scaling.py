"""LoRA against full fine-tuning on hosts of whole cores: one many-core machine split by core (issue
25, item 3).

    python benchmarks/wholecore_scaling.py --cores-per-host 4 --host-counts 1,2,4 --repeats 3
    python benchmarks/wholecore_scaling.py --model tiny --cores-per-host 1 --host-counts 1,2 \
        --steps 8 --check

Why: the miniature cluster (lora_scaling.py) splits a 2-core machine into four half-core hosts by
CFS quota, two per core, and its 2-host LoRA runs read 2.15x one host, beyond linear and
unexplained. Where a machine has the cores, each host here gets whole physical cores of its own
instead (every hardware thread of them, by CPU affinity; no quota), so no two hosts share a core's
time or its caches below the last level.

Hosts: one network namespace each, a veth link to a bridge in its own namespace, `tc tbf` on both
ends of every link (tests/harness/capped.tbf_spec, as the miniature cluster). The link is calibrated
as lora_scaling.py does for bert-base: one host's fp32 bert-base samples/s on the blog's rows (batch
32, 128 real tokens, `synthetic`) makes the link 25 Gbit/s x S / 23.6, the blog's compute/network
ratio; for the same host on MRPC's real rows that is the c6i.16xlarge-running-cpudist ratio of issue
24. Ranks start directly as the trainer `cpudist run` launches (`python -m cpudist.rank` with the
launcher's rank variables, one rank per host, GLOO_SOCKET_IFNAME the host's link), so the machine
needs iproute2 but no sshd or MPI. The hosts a run does not use spin on their own cores (ballast, as
lora_scaling.py; `--ballast twin`: the same training alone on each), so every host count runs on an
equally busy machine. What stays shared, as on any one machine: the memory bus and the last-level
cache.

Work and arms are lora_scaling.py's: MRPC's real rows, `--sampler random` (DistributedSampler's
order, each rank's rows padded to its own longest; `--sampler grouped`, `cpudist run`'s default,
shares each length-sorted global batch out so the ranks get rows of about equal length), batch 32
per host, no evaluation, the CPU's default precision; `full` (ddp) and `lora`
(LORA_FLAGS["default"], every Linear). Host counts and arms alternate inside each repeat;
`--budget-s` stops starting runs once the next would not fit, and the result says which cells ran.
The summary is lora_scaling.summarize's (`lora_speedup_4_hosts`, `bytes_ratio_full_over_lora`,
`accuracy_delta_points` from accuracy_scaling.py's ledger of this CPU kind).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lora_scaling import (
    BATCH,
    KEEP,
    LORA_FLAGS,
    accuracy_delta,
    markdown,
    median,
    steady_tokens,
    summarize,
)
from miniature import BLOG_LINK_GBPS, BLOG_SAMPLES_PER_S, ROOT
from scaling import code_version

from cpudist.config import TrainConfig, to_argv
from cpudist.cpu import read_cpu
from tests.harness.capped import tbf_spec
from tests.harness.netns import add_bridge, plug, sh

MRPC = ROOT.parent / "shared" / "data" / "glue" / "MRPC"
PREFIX = "wc"  # namespaces: wc-b (the bridge), wc-h0, wc-h1, ...
# each host's link is its eth0, the bridge's end v0, v1, ... (as netns.py)
BRIDGE, IFACE = f"{PREFIX}-b", "eth0"
SUBNET = "198.18.0.{}"  # hosts at .201, .202, ...
CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWUTS = 0x40000000, 0x00020000, 0x04000000
MS_RDONLY, MS_REC, MS_SLAVE, MNT_DETACH = 0x1, 0x4000, 0x80000, 2
PR_SET_PDEATHSIG = 1
# What `cpudist run --dry-run` gave every rank here, where no tcmalloc is installed (with it,
# `--allocator auto` also sets LD_PRELOAD: cpudist/launch/env.py); the rank variables are added per
# rank.
RANK_ENV = {"OMP_NUM_THREADS": "1", "CPUDIST_THREADS": "auto", "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


def physical_cores() -> list[list[int]]:
    """The logical CPUs of each physical core this process may use, in core order."""
    allowed = os.sched_getaffinity(0)
    cores: dict[tuple[int, int], list[int]] = {}
    for cpu in sorted(allowed):
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            key = (int((topo / "physical_package_id").read_text()),
                   int((topo / "core_id").read_text()))
        except (OSError, ValueError):
            key = (0, cpu)  # no topology: each logical CPU its own core
        cores.setdefault(key, []).append(cpu)
    return [cores[k] for k in sorted(cores)]


def host_cpus(cores_per_host: int, hosts: int) -> list[list[int]]:
    cores = physical_cores()
    if cores_per_host * hosts > len(cores):
        raise SystemExit(f"{hosts} hosts of {cores_per_host} core(s) need {cores_per_host * hosts} "
                         f"physical cores; this process may use {len(cores)}")
    return [sorted(c for core in cores[i * cores_per_host:(i + 1) * cores_per_host] for c in core)
            for i in range(hosts)]


class Hosts:
    """Namespace hosts on a bridge, each pinned to its own cores; `down()` removes every namespace
    it made."""

    def __init__(self, cpus: list[list[int]]) -> None:
        self.cpus = cpus
        self.n = len(cpus)
        self.made: list[str] = []
        self.tbf = "none"

    def name(self, i: int) -> str:
        return f"{PREFIX}-h{i}"

    def addr(self, i: int) -> str:
        return SUBNET.format(201 + i)

    def up(self) -> Hosts:
        """The bridge and the hosts, wired as tests/harness/netns.py wires its own (its helpers: one
        room)."""
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True,
                                text=True).stdout.split()
        # a run killed outright
        for ns in (ns for ns in listed if ns == BRIDGE or ns.startswith(f"{PREFIX}-h")):
            sh("ip", "netns", "del", ns, check=False)
        self.made.append(BRIDGE)
        add_bridge(BRIDGE)
        for i in range(self.n):
            self.made.append(self.name(i))
            sh("ip", "netns", "add", self.name(i))
            sh("ip", "-n", self.name(i), "link", "set", "lo", "up")
            plug(self.name(i), IFACE, f"{self.addr(i)}/24", BRIDGE, f"v{i}")
        return self

    def shape(self, gbps: float | None) -> None:
        """tbf at `gbps` on both ends of every host's link (None: unshaped)."""
        self.tbf = tbf_spec(gbps) if gbps else "none"
        for i in range(self.n):
            for ns, dev in ((self.name(i), IFACE), (BRIDGE, f"v{i}")):
                if gbps:
                    sh("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *self.tbf.split())
                else:
                    sh("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)

    def down(self) -> None:
        for ns in reversed(self.made):
            sh("ip", "netns", "del", ns, check=False)
        self.made.clear()

    def start(self, i: int, argv: list[str], env: dict[str, str],
              log: Path) -> subprocess.Popen[bytes]:
        """`argv` in host i's namespace, on its cores only."""
        netns, cpus, host = f"/var/run/netns/{self.name(i)}", set(self.cpus[i]), self.name(
            i).encode()

        # in the child, before exec: what `ip netns exec` does, then the affinity
        def enter() -> None:
            libc = ctypes.CDLL(None, use_errno=True)

            def check(rc: int, what: str) -> None:
                # the parent sees only "Exception occurred in preexec_fn": say it in the log
                if rc != 0:
                    err = ctypes.get_errno()
                    os.write(2, f"wholecore_scaling: {what}: {os.strerror(err)}\n".encode())
                    raise OSError(err, what)

            fd = os.open(netns, os.O_RDONLY)
            check(libc.setns(fd, CLONE_NEWNET), f"setns {netns}")
            os.close(fd)
            # sysfs shows the namespace it was mounted in: a private /sys of this one, so that the
            # rank's interface counters (cpudist/train/netcount.py) read its own link
            check(libc.unshare(CLONE_NEWNS), "unshare")
            check(libc.mount(None, b"/", None, MS_REC | MS_SLAVE, None), "mount --make-rslave /")
            # as iproute2 does: a failed unmount is no error, and a read-only /sys (containers)
            # stays read-only
            flags = MS_RDONLY if os.statvfs("/sys").f_flag & os.ST_RDONLY else 0
            libc.umount2(b"/sys", MNT_DETACH)
            check(libc.mount(b"sysfs", b"/sys", b"sysfs", flags, None), "mount sysfs")
            # its own host name: cpudist tells nodes by name
            check(libc.unshare(CLONE_NEWUTS), "unshare uts")
            check(libc.sethostname(host, len(host)), "sethostname")
            os.sched_setaffinity(0, cpus)
            # dies with this script, however it ends
            check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL), "prctl")

        with log.open("wb") as f:
            return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=f,
                                    stderr=subprocess.STDOUT, preexec_fn=enter)

    def describe(self) -> dict[str, Any]:
        return {"hosts": self.n, "cpus": self.cpus, "tbf": self.tbf,
                "addresses": [self.addr(i) for i in range(self.n)]}


def rank_env(hosts: Hosts, rank: int, world: int, head: int, port: int) -> dict[str, str]:
    """What a launcher gives a rank of a one-rank-per-host job whose rank 0 is on host `head`."""
    return {**os.environ, **RANK_ENV, "RANK": str(rank), "WORLD_SIZE": str(world),
            "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": hosts.addr(head),
            "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": IFACE}


@contextlib.contextmanager
def ballast(hosts: Hosts, used: int, work: Path,
            twin: TrainConfig | None) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Keep the hosts from `used` on busy: a spin loop on each of their logical CPUs, or (`twin`) a
    one-host run of the same training on each, so that a host count's ranks share the machine's
    common parts (memory bus, last-level cache, a VM's cores that may be one physical core's
    threads) with the same work at every count."""
    if twin is None:
        procs = [hosts.start(i, ["sh", "-c", "while :; do :; done"], {"PATH": os.environ["PATH"]},
                             work / "spin.log")
                 for i in range(used, hosts.n) for _ in hosts.cpus[i]]
    else:
        procs = [hosts.start(i, [sys.executable, "-m", "cpudist.rank",
                                 *to_argv(dataclasses.replace(
                                     twin, output_dir=str(work / f"twin-{i}")))],
                             rank_env(hosts, 0, 1, i, free_port()), work / f"twin-{i}.log")
                 for i in range(used, hosts.n)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=30)
        for i in range(used, hosts.n):
            shutil.rmtree(work / f"twin-{i}", ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def train(hosts: Hosts, used: int, cfg: TrainConfig, work: Path, timeout: float,
          twin: bool = False) -> dict[str, Any]:
    """One rank on each of the first `used` hosts; rank 0's result.json (the fields lora_scaling
    keeps). `twin`: the other hosts run the same training alone meanwhile (ballast), for 100x the
    steps so that it outlasts this."""
    out = Path(cfg.output_dir)
    argv = [sys.executable, "-m", "cpudist.rank", *to_argv(cfg)]
    port = free_port()
    procs = []
    busy = dataclasses.replace(cfg, max_steps=100 * (cfg.max_steps or 10)) if twin else None
    with ballast(hosts, used, work, busy) as others:
        try:
            for r in range(used):
                procs.append(hosts.start(r, argv, rank_env(hosts, r, used, 0, port),
                                         work / f"{out.name}-rank{r}.log"))
            deadline = time.time() + timeout
            codes = []
            for p in procs:
                try:
                    codes.append(p.wait(timeout=max(1.0, deadline - time.time())))
                except subprocess.TimeoutExpired:
                    codes.append(-9)  # the finally below stops them all
                    break
        finally:  # done, timed out, an error or Ctrl-C: no rank is left behind
            for p in procs:
                p.kill()
                p.wait(timeout=30)
        died = [i for i, p in enumerate(others) if p.poll() is not None]
    if died:  # the 1-host baseline would have run beside an idle host
        return {"error": f"ballast process(es) {died} ended during the run", "hosts": used}
    if any(codes) or not (out / "result.json").is_file():
        tail = (work / f"{out.name}-rank0.log").read_text(errors="replace")[-1500:]
        return {"error": f"exit codes {codes}: {tail}", "hosts": used}
    r = json.loads((out / "result.json").read_text())
    return {**{k: r.get(k) for k in KEEP}, **steady_tokens(out / "steps.jsonl"), "hosts": used,
            "cpu": r["cpu"], "versions": r["versions"], "command": " ".join(argv)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bert-base",
                    help="a random-init preset [default: bert-base]")
    ap.add_argument("--cores-per-host", default="auto",
                    help="physical cores per host [default: auto, the machine's split over the "
                         "most hosts]")
    ap.add_argument("--host-counts", default="1,2,4")
    ap.add_argument("--arms", default="lora,full", help="of lora, full [default: both]")
    ap.add_argument("--sampler", default="random", choices=["random", "grouped"],
                    help="of the timed runs [default: random, as lora_scaling.py; grouped: "
                         "`cpudist run`'s default, "
                    "compare its real tokens/s: each host count trains other rows]")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12,
                    help="per run, the first 3 left out of the steady rate")
    ap.add_argument("--calibration-steps", type=int, default=8)
    ap.add_argument("--link-gbps", type=float,
                    help="skip the calibration run and shape links to this")
    ap.add_argument("--data-dir", type=Path, default=MRPC)
    ap.add_argument("--budget-s", type=float, default=3600,
                    help="start no run that would end after this")
    ap.add_argument("--run-timeout-s", type=float, default=600)
    ap.add_argument("--ballast", choices=["spin", "twin"], default="spin",
                    help="what keeps the unused hosts busy: a spin loop per CPU [default], or the "
                         "same training run "
                    "alone on each (twin)")
    ap.add_argument("--check", action="store_true",
                    help="a try of the machinery: print, write no result file")
    ap.add_argument("--results-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    a = ap.parse_args()
    if a.model != "bert-base" and not a.link_gbps:
        ap.error("the calibration is bert-base's (the blog's model): give --link-gbps for another "
                 "model")
    # unwinds through the finally blocks: hosts torn down
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.time()
    counts = [int(n) for n in a.host_counts.split(",")]
    a.cores_per_host = (max(1, len(physical_cores()) // max(counts)) if a.cores_per_host == "auto"
                        else int(a.cores_per_host))
    hosts = Hosts(host_cpus(a.cores_per_host, max(counts)))
    kind = read_cpu().kind
    command = "python benchmarks/wholecore_scaling.py " + " ".join(sys.argv[1:])
    arms = {arm: {"lora": LORA_FLAGS["default"], "full": ()}[arm] for arm in a.arms.split(",")}
    cells: dict[str, list[dict[str, Any]]] = {}
    took: dict[str, float] = {}
    skipped: list[str] = []
    partial = a.results_dir / f"wholecore-scaling-{a.model}-{kind}.partial.json"
    work = Path(tempfile.mkdtemp(prefix="wholecore-"))
    base = {"task": "mrpc", "data_dir": str(a.data_dir), "model": a.model, "batch_size": BATCH,
            "sampler": a.sampler, "do_eval": False, "save_model": "none"}
    try:
        hosts.up()
        if a.link_gbps:
            cal: dict[str, Any] = {"link_gbps": a.link_gbps, "from": "--link-gbps"}
        else:  # the blog's work on one host, the link unused
            blog = TrainConfig(**{**base, "task": "synthetic", "data_dir": None,
                                  "precision": "fp32",
                                  "max_seq_len": 128, "synthetic_samples": BATCH
                                  * a.calibration_steps,
                                  "max_steps": a.calibration_steps,
                                  "output_dir": str(work / "calibration")})
            r = train(hosts, 1, blog, work, a.run_timeout_s)
            if "error" in r:
                raise SystemExit(f"calibration failed: {r['error']}")
            sps = float(r["steady_samples_per_s"])
            cal = {"bert_base_blog_samples_per_s": sps, "link_gbps": BLOG_LINK_GBPS
                   * sps / BLOG_SAMPLES_PER_S,
                   "threads": r["threads_per_rank"], "steps": a.calibration_steps,
                   "from": "measured"}
        hosts.shape(cal["link_gbps"])
        cal["tbf"] = hosts.tbf
        print(f"# calibration: {json.dumps(cal)}", file=sys.stderr, flush=True)
        for repeat in range(a.repeats):
            for n in counts:
                for arm, flags in arms.items():
                    cell = f"{arm}@{n}"
                    # a cell not run yet is guessed at the longest run so far
                    guess = took.get(cell, max(took.values(), default=0.0))
                    if time.time() + guess - started > a.budget_s:
                        skipped.append(f"{cell} repeat {repeat}")
                        continue
                    lora = {"peft": "lora",
                            "lora_r": int(flags[flags.index("--lora-r") + 1])} if flags else {}
                    cfg = TrainConfig(**{**base, **lora, "max_steps": a.steps,
                                         "output_dir": str(work / f"{arm}-{n}-{repeat}")})
                    t0 = time.time()
                    r = train(hosts, n, cfg, work, a.run_timeout_s, twin=a.ballast == "twin")
                    took[cell] = time.time() - t0
                    cells.setdefault(cell, []).append({**r, "repeat": repeat,
                                                 "seconds": round(took[cell], 1)})
                    # what has run survives whatever ends this script (lent time, an error)
                    if not a.check:
                        a.results_dir.mkdir(parents=True, exist_ok=True)
                        partial.write_text(json.dumps({"command": command, "calibration": cal,
                                                       "cells": cells}) + "\n")
                    print(f"# {arm} x{n} repeat {repeat}: {r.get('steady_samples_per_s')} "
                          "samples/s, "
                          f"{r.get('measured_tx_bytes_per_step')} B/step, {took[cell]:.0f} s "
                          f"{r.get('error', '')[-300:]}", file=sys.stderr, flush=True)
    finally:
        hosts.down()
        shutil.rmtree(work, ignore_errors=True)
    first = next((r for rs in cells.values() for r in rs if "cpu" in r), None)
    if first is None:
        raise SystemExit("every run failed: see the errors above")
    # None when no 1-host full run succeeded
    one = median(cells.get("full@1", []), "steady_samples_per_s")
    if "bert_base_blog_samples_per_s" in cal:  # lora_scaling's calibration fields, for its table
        cal.update(model=a.model, bert_base_task_samples_per_s=one, model_task_samples_per_s=one,
                   model_blog_samples_per_s=cal["bert_base_blog_samples_per_s"],
                   bert_base_blog_from="measured",
                   c6i_task_samples_per_s=(BLOG_SAMPLES_PER_S
                                           * one / cal["bert_base_blog_samples_per_s"]
                                           if one else None))
    cpus = ", ".join(f"host {i}: cpus {','.join(map(str, c))}" for i, c in enumerate(hosts.cpus))
    ballast = "the same training alone" if a.ballast == "twin" else "a spin loop a CPU"
    res = {"command": command, "cpu": first["cpu"], "cpu_kind": kind, "versions": first["versions"],
           "precision": first.get("precision"), "code": code_version(),
           "layout": f"{a.cores_per_host}core",
           "cluster_text": f"{hosts.n} namespace hosts of {a.cores_per_host} whole physical "
                           "core(s) each by CPU "
                           f"affinity ({cpus}); links `{hosts.tbf}` on both ends; ranks started "
                           "directly, 1 per host; "
                           "unused hosts: "
                           f"{ballast}",
           "wall_s": round(time.time() - started), "skipped": skipped,
           "settings": {"model": a.model, "repeats": a.repeats, "steps": a.steps, "batch": BATCH,
                        "host_counts": counts, "sampler": a.sampler,
                        "cores_per_host": a.cores_per_host, "ballast": a.ballast,
                        "arms": {k: list(v) for k, v in arms.items()}, "lora": "default"},
           "calibrations": {a.model: cal}, "cells": {a.model: cells},
           "summary": {a.model: summarize(cells, accuracy_delta(kind, "default"))}}
    text = markdown(res, where=f"hosts of {a.cores_per_host} whole core(s)")
    if skipped:
        text += f"\nNot run (--budget-s {a.budget_s:g}): {', '.join(skipped)}.\n"
    if not a.check:
        a.results_dir.mkdir(parents=True, exist_ok=True)
        suffix = (("-grouped" if a.sampler == "grouped" else "")
                  + ("-twin" if a.ballast == "twin" else ""))
        out = a.results_dir / f"wholecore-scaling-{a.model}-{kind}{suffix}"
        out.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
        out.with_suffix(".md").write_text(text + "\n")
        partial.unlink(missing_ok=True)
    print(text, flush=True)


if __name__ == "__main__":
    main()
