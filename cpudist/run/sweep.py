"""A series of runs over node counts (`cpudist sweep`): its input checks and where each run goes.

Pure: the command runs each count with `cpudist run`'s own code; this module only decides which
counts, in what order, into which folders, and refuses a series that cannot finish before any run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cpudist.errors import BadInput
from cpudist.hostfile import read_hostfile
from cpudist.launch.kinds import scheduled


def parse_counts(text: str) -> tuple[int, ...]:
    """'4,1,2' -> (1, 2, 4): the smallest count first, since it is every other run's baseline."""
    counts = []
    for item in text.split(","):
        item = item.strip()
        if not item.lstrip("-").isdigit():
            raise BadInput(f"--nodes {text}: '{item}' is not a whole number",
                           "Give node counts like 1,2,4")
        if int(item) < 1:
            raise BadInput(f"--nodes {text}: {item} is not a positive node count",
                           "Give node counts like 1,2,4")
        counts.append(int(item))
    repeated = sorted({n for n in counts if counts.count(n) > 1})
    if repeated:
        raise BadInput(f"--nodes {text} names {', '.join(map(str, repeated))} more than once",
                       "Give each node count once; run the sweep again to repeat it")
    return tuple(sorted(counts))


@dataclass(frozen=True)
class SeriesHosts:
    """SeriesHosts a sweep runs: what the user gave, and how many hosts that offers (None: not known
    here)."""

    hostfile: Path | None
    cluster: str | None
    launcher: str
    hosts: int | None


def series_hosts(hostfile: Path | None, cluster: str | None, launcher: str) -> SeriesHosts:
    """What the user's options offer to run on, and how many hosts that is."""
    hosts = None
    if cluster is not None:
        from cpudist.cloud.record import load_record

        record = load_record(cluster)
        if record is None:
            raise BadInput(f"no local record of cluster {cluster}",
                           "Run `cpudist cluster up` first, or pass --hostfile")
        hosts = len(record.nodes)
    elif hostfile is not None:
        hosts = len(read_hostfile(hostfile))
    return SeriesHosts(hostfile, cluster, launcher, hosts)


def check_series(counts: Sequence[int], ppn: int | str | None, where: SeriesHosts) -> None:
    """Refuse a series that cannot finish, before its first run."""
    source = f"cluster {where.cluster}" if where.cluster else f"hostfile {where.hostfile}"
    if ppn is None and (where.hostfile is not None or where.cluster is not None):
        raise BadInput("--hostfile/--cluster need --ppn (ranks per node)",
                       "e.g. --nodes 1,2,4 --ppn 1 for one rank on each node")
    if where.hosts is not None and max(counts) > where.hosts:
        raise BadInput(f"--nodes {max(counts)} is more than the {where.hosts} host(s) of {source}",
                       f"Give counts up to {where.hosts}, or add hosts")
    if where.hosts is None and not scheduled(where.launcher) and max(counts) > 1:
        raise BadInput(f"--nodes {max(counts)} needs more than this machine",
                       "Give --hostfile H (run from its head), --cluster NAME, or a scheduler's "
                       "--launcher")


def default_sweep_dir(task: str, model: str) -> Path:
    """runs/<task>-<model>-sweep-<time>: one folder per sweep, a run folder per count inside."""
    name = Path(model).name or model.replace("/", "-")
    return Path("runs") / f"{task}-{name}-sweep-{datetime.now().strftime('%Y%m%d-%H%M%S-%f')}"


def run_dirs(base: Path, counts: Sequence[int]) -> dict[int, Path]:
    """A distinct run folder per node count."""
    return {n: base / f"nodes{n}" for n in counts}
