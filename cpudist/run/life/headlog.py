"""`cpudist logs --head`: the rank output of a run on a head over SSH (where cluster:NAME or
head:HOST), read from the head's own run folder, for when the laptop's cpudist.log is not enough
(its link dropped, another shell).

    cluster:NAME   the head, user, key and pinned host keys from the cluster's record
                   (run/where.cluster_target)
    head:HOST      HOST, with --user/--identity as `cpudist run` took them (run.json does not keep
                   them)
    here, hostfile:..., slurm: the ranks' output is in the run folder already;
                   there is no head to ask

A detached run's local cpudist.log is written from the head's agent log by each follower in turn
(`run --detach` until the ranks are up, then each `logs -f`): the mark (`read_mark`/`write_mark`)
says how many bytes of that log are in it already, so the next follower reads on from there instead
of writing the first lines again.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Callable
from pathlib import Path

from cpudist import state
from cpudist.errors import BadInput
from cpudist.run.life.identity import RunInfo, read_run
from cpudist.ssh.client import Remote, Target
from cpudist.ssh.known_hosts import KnownHosts
from cpudist.waits import wait_until
from cpudist.wire import names

# in the local run folder: {"log": the head's agent log, "offset": bytes read}
HEAD_LOG_MARK = "agent-log.offset"


def read_mark(path: Path, log: str) -> int:
    """Bytes of the head's `log` already written here (0: none, or a mark of another log: another
    run's)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return 0
    if (not isinstance(data, dict) or data.get("log") != log
            or not isinstance(data.get("offset"), int)):
        return 0
    return max(0, data["offset"])


def write_mark(path: Path, log: str, offset: int) -> None:
    """Record that the first `offset` bytes of the head's `log` are written here."""
    state.write_atomic(path, json.dumps({"log": log, "offset": offset}) + "\n")


def head_target(info: RunInfo, user: str | None, identity: str | None) -> tuple[Target, Path]:
    """How to reach the head of a run on a cluster or a head over SSH, and where its host keys are
    pinned."""
    kind, _, name = info.where.partition(":")
    if kind == "cluster":
        from cpudist.cloud.record import load_record

        record = load_record(name)
        if record is None:
            raise BadInput(f"run {info.id} ran on cluster {name}, which has no local record now",
                           "Its cpudist.log here is what this machine saw: `cpudist logs` without "
                           "--head")
        return Target(record.address(0), record.user, record.ssh_port,
                      record.private_key), Path(record.known_hosts)
    if kind == "head":
        folder = state.local_cluster_dir()
        key = identity or (str(folder / "id_ed25519") if (folder / "id_ed25519").is_file()
                           else None)
        return Target(name, user, 22, key), folder / "known_hosts"
    raise BadInput(f"run {info.id} ran {info.where}, not on a head over SSH: its ranks' output is "
                   f"in {info.run_dir}",
                   "`cpudist logs` without --head shows it")


def head_run_dir(info: RunInfo) -> str:
    """The run's folder on the head: result.json names it once the run ended, else the rule
    run/remote.py follows (<home>/.cpudist/runs/<local folder name>-<run id>, relative to the
    login's home here)."""
    try:
        result = json.loads((Path(info.run_dir) / names.RESULT).read_text())
        staged = result["staging"]["remote_run_dir"]
        return str(staged)
    except (OSError, ValueError, KeyError, TypeError):
        return f"{state.RUNS_DIR}/{Path(info.run_dir).name}-{info.id}"


def show_head(info: RunInfo, user: str | None, identity: str | None, emit: Callable[[str], None],
              follow: bool = False, interval_s: float = 2.0) -> str:
    """Emit the head's ranks.log of the run; with `follow`, go on while this machine's run.json says
    running."""
    target, known = head_target(info, user, identity)
    path = f"{head_run_dir(info)}/{names.RANKS_LOG}"
    offset = 0
    with Remote(target, KnownHosts(known)) as head:

        def more() -> None:
            nonlocal offset
            code, out, err = head.run(f"tail -c +{offset + 1} {shlex.quote(path)}")
            if code != 0:
                raise BadInput(f"cannot read {path} on {target.host}: "
                               f"{err.strip() or f'exit code {code}'}",
                               "The run may not have reached its ranks yet, or its folder there is "
                               "gone")
            data = out.encode()
            end = data.rfind(b"\n") + 1
            if end:
                emit(data[:end].decode(errors="replace"))
                offset += end

        def ended() -> str | None:
            now = read_run(Path(info.run_dir))
            more()
            state_now = now.state if now is not None else ""
            return None if follow and state_now == "running" else state_now

        return wait_until(ended, f"the end of run {info.id}", math.inf, interval_s)
