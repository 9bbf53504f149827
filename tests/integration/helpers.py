"""Running the real `cpudist` command the way a user does."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from tests.harness.netns import NetnsCluster

if TYPE_CHECKING:
    from tests.harness.world import World

T = TypeVar("T")
CPUDIST = [sys.executable, "-m", "cpudist.cli"]
PROGRESS = re.compile(r"\] step \d+/\d+ ")  # a progress line, `[cpudist] step 12/300  loss ...`
# What a run starts on the hosts (the CLI, the ranks, the MPI launchers' daemons)
LAUNCHED = ("cpudist", "hydra", "mpiexec", "mpirun", "prterun", "prted", "orted")


def cpudist(*args: str | Path, timeout: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `cpudist ARGS` to the end and capture its output. Past `timeout`, the command and every
    process below it are killed before TimeoutExpired is raised: subprocess.run kills only the
    command, and its launcher's ranks trained on, orphaned, under the rest of the suite (seen: a
    timed-out test_learning's two ranks)."""
    with subprocess.Popen([*CPUDIST, *map(str, args)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in [*descendants(proc.pid), proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def in_process(*args: str | Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`cpudist ARGS` in this process (Click's CliRunner) with exactly the environment `env` (every
    other variable unset while it runs) and no terminal on stdin: its exit code, stdout and stderr
    as `cpudist` would give them, without a Python start and the imports of click, boto3, rich and
    paramiko per call (most of a failing or cluster command's CPU time). For what happens before any
    process starts; `cpudist` where signals, the real entry point or a second process are the point.

    An exception that escaped the command (a subprocess would print a Traceback) fails the test
    here."""
    from click.testing import CliRunner

    from cpudist.cli.main import cli

    overrides: dict[str, str | None] = {**dict.fromkeys(os.environ), **env}
    words = [str(a) for a in args]
    r = CliRunner().invoke(cli, words, env=overrides, prog_name="cpudist")
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise AssertionError(
            f"cpudist {' '.join(words)} raised {r.exception!r}\n{r.stderr}") from r.exception
    return subprocess.CompletedProcess(["cpudist", *words], r.exit_code, r.stdout, r.stderr)


def descendants(pid: int) -> list[int]:
    """PIDs of every live process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def leftovers(hosts: NetnsCluster, names: tuple[str, ...] = (), skip: tuple[int, ...] = ()
              ) -> list[str]:
    """Processes alive on the hosts (but those in `skip`) besides their sshd; with `names`, only
    those whose command line holds one of them. A powered-off host has no sshd and no process."""
    found = []
    for i in range(hosts.n):
        if i in skip:
            continue
        pid_file = hosts.node_dir(i) / "sshd.pid"
        sshd = int(pid_file.read_text().strip() or 0) if pid_file.exists() else 0
        found += [f"{hosts.name(i)}: {line[:100]}" for pid in hosts.pids(i)
                  if pid != sshd and (line := cmdline(pid))
                  and (not names or any(n in line for n in names))]
    return found


def wait_no_leftovers(hosts: NetnsCluster, within_s: float = 30, names: tuple[str, ...] = (),
                      skip: tuple[int, ...] = ()) -> list[str]:
    """What `leftovers` still finds after up to `within_s` (a run's processes end shortly after the
    run does): [] once none is left."""
    deadline = time.monotonic() + within_s
    while (left := leftovers(hosts, names, skip)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def read_until(proc: subprocess.Popen[str], marker: str | None, timeout: float = 180) -> list[str]:
    """The lines of a running command's output up to the first that holds `marker` (None: up to its
    end).

    A thread reads, so the wait has a deadline: past `timeout` seconds, or at the end of the output
    without the marker, the command is killed and the test fails with what it printed. Once the
    marker is seen nothing reads on, so `communicate` may take the rest.
    """
    stdout = proc.stdout
    assert stdout is not None, "read_until needs stdout=subprocess.PIPE"
    seen: list[str] = []
    found = threading.Event()
    done = threading.Event()

    def read() -> None:
        try:
            for line in stdout:
                seen.append(line)
                if marker is not None and marker in line:
                    found.set()
                    return
        finally:
            done.set()

    threading.Thread(target=read, name=f"read_until {marker!r}", daemon=True).start()
    ended = done.wait(timeout)
    if ended and (marker is None or found.is_set()):
        return seen
    kill_tree(proc)  # ... which also ends the reader thread, at the end of the output
    wanted = "the end of its output" if marker is None else f"a line with {marker!r}"
    why = (f"its output ended (exit code {proc.returncode}) without {wanted}" if ended
           else f"waited {timeout:g} s for {wanted}, then killed it")
    lines = seen[:]
    # a long run's progress lines would hide what happened: its other lines first, then the tail
    said = [line for line in lines if not PROGRESS.search(line)]
    pytest.fail(f"{why}; what it printed, progress lines left out:\n{''.join(said)[-6000:]}\n"
                f"... and its last lines:\n{''.join(lines[-15:])[-3000:]}")


def kill_tree(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL `proc` and every process below it (a launcher's ranks outlive a launcher killed
    alone)."""
    if proc.poll() is not None:
        return
    for pid in descendants(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)


def output_of(proc: subprocess.Popen[str]) -> str:
    """Exit code and output of `proc`, killed first with all below it if it still runs (for a
    failure's message)."""
    kill_tree(proc)
    out, err = proc.communicate(timeout=30)
    return (f"exit code {proc.returncode}\nstdout: {(out or '')[-4000:]}\n"
            f"stderr: {(err or '')[-4000:]}")


def wait_for(predicate: Callable[[], T | None], timeout: float, what: str,
             detail: Callable[[], object] | None = None, interval: float = 0.05) -> T:
    """Poll `predicate` until it returns a true value, and return that value.

    Past `timeout` seconds the test fails: waited for `what`, with `detail()` (the state that says
    why).
    """
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout:g} s for {what}" + (f": {detail()}" if detail else ""))
        time.sleep(interval)
    return value


def launch_beside_torchrun(tmp_path: Path, script: str, metric_file: str
                           ) -> tuple[subprocess.CompletedProcess[str], str, Path, Path]:
    """`script` as train.py, run twice on 2 ranks of this machine at once: by `cpudist launch` (its
    ledger in `tmp_path`) and by hand with torchrun. (cpudist's result, torchrun's output, our
    folder, torchrun's folder.)"""
    from cpudist.launch.tools import free_port

    ours, hand = tmp_path / "ours", tmp_path / "by-hand"
    for folder in (ours, hand):
        folder.mkdir()
        (folder / "train.py").write_text(script)
    by_hand = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                                "2",
                                "--master-port", str(free_port()), "train.py"], cwd=hand, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    r = cpudist("launch", "--np", "2", "--output-dir", ours / "run", "--ledger",
                tmp_path / "ledger.jsonl",
                "--workdir", ours, "--metric-file", metric_file, "train.py", timeout=300)
    hand_out, _ = by_hand.communicate(timeout=300)
    assert by_hand.returncode == 0, hand_out
    assert r.returncode == 0, r.stderr
    return r, hand_out, ours, hand


@contextlib.contextmanager
def keyed_hosts(n: int, folder: Path, prefix: str) -> Iterator[NetnsCluster]:
    """`n` namespace hosts (netns names from `prefix`) whose head holds the cluster key, as `cpudist
    hosts ssh-setup` run there once leaves them; taken down after."""
    c = NetnsCluster(n, folder, prefix=f"{prefix}{os.getpid() % 10000}")
    c.up()
    try:
        r = c.run(0, [*CPUDIST, "hosts", "ssh-setup", "--hostfile", str(c.hostfile), "--identity",
                      str(c.user_key)], timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        yield c
    finally:
        c.down()


@contextlib.contextmanager
def on_prem_site(n: int, folder: Path, prefix: str, data: Path | None = None) -> Iterator[World]:
    """`n` on-prem hosts as their admin set them up (the admin's key authorized on every host, the
    site firewall admitting the laptop's SSH, `cpudist hosts ssh-setup` run on the head with the
    admin's key; the site's hostfile in the world's state folder) and the laptop with a key of its
    own, the hostfile as ~/hosts (names the laptop cannot resolve) and `data` in ~/data; taken down
    after."""
    from tests.harness.world import World

    w = World(n, folder, prefix=f"{prefix}{os.getpid() % 10000}")
    w.up()
    try:
        admin, laptop_key = w.state / "admin_ed25519", w.operator_path(".ssh/id_ed25519")
        for key in (admin, laptop_key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                           check=True)
            w.on_prem(key.with_suffix(".pub").read_text())
        hosts = "".join(f"{w.hosts.name(i)}\n" for i in range(n))
        (w.state / "site-hostfile").write_text(hosts)
        w.operator_path("hosts").write_text(hosts)
        setup = w.hosts.run(0, [*CPUDIST, "hosts", "ssh-setup", "--hostfile",
                                str(w.state / "site-hostfile"), "--identity", str(admin)])
        assert setup.returncode == 0, setup.stdout + setup.stderr
        if data is not None:
            shutil.copytree(data, w.operator_path(f"data/{data.name}"))
        yield w
    finally:
        w.down()
