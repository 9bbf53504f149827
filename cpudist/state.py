"""cpudist's state, in one place: every local path (all under the home folder, `CPUDIST_HOME`) and
the names cpudist uses on the nodes.

Two different things share the name ~/.cpudist: the home folder of the machine cpudist runs on (the
laptop, or the head when a run starts there), which `CPUDIST_HOME` moves, and the folders a node
keeps under its login's home (the cluster key from ssh-setup, staged data, a remote run's folder),
whose names below are relative to that node's home and never follow a local setting.

Files are written whole or not at all (a temporary file in the same folder, then a rename), keys
with mode 0600 from the first byte. Nothing here touches anything outside the home folder.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cpudist.errors import BadInput

CLUSTER_NAME = re.compile(r"^[a-z0-9-]{1,40}$")
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # new_run_id's, older ones; never a path

# On a node, relative to its login's home ("~/" in a shell there):
NODE_DIR = Path(".cpudist")
# the cluster key, known_hosts, ssh_config and the launchers' ssh (ssh-setup)
CLUSTER_DIR = NODE_DIR / "cluster"
# data, model and code staged for a run, one folder per content digest
STAGE_DIR = NODE_DIR / "stage"
RUNS_DIR = NODE_DIR / "runs"  # on the head: the folder of a run started from another machine
# on an image builder: this cpudist's wheel (ami/bootstrap.sh waits for it)
UPLOAD_DIR = NODE_DIR / "upload"
# on each node of a run: its --secret/--env-file values, 0600, while it runs
SECRETS_DIR = NODE_DIR / "secrets"


def node_home() -> str:
    """This machine's login home as a node ("~" there, not CPUDIST_HOME): where the node-side
    folders above live (a run started on the head stages into it)."""
    return str(Path.home())


def home() -> Path:
    """`CPUDIST_HOME`, else ~/.cpudist: everything cpudist keeps on this machine lives under it."""
    return Path(os.environ.get("CPUDIST_HOME", "~/.cpudist")).expanduser()


def ledger_path() -> Path:
    """The results ledger every run appends to (`cpudist run --ledger` names another)."""
    return home() / "results.jsonl"


def bench_dir() -> Path:
    """Saved `cpudist hosts bench` results."""
    return home() / "bench"


def wheels_dir() -> Path:
    """Wheels of this cpudist, built for a head or an image that needs this version."""
    return home() / "wheels"


def inductor_dir() -> Path:
    """torch.compile's kernel cache (TORCHINDUCTOR_CACHE_DIR), kept across runs."""
    return home() / "inductor"


# Every rank's environment: the Unix time the `cpudist` command started its run
# (cpudist/train/startup.py).
STARTED_AT_ENV = "CPUDIST_COMMAND_STARTED_AT"


def token_cache_dir() -> Path:
    """Tokenized splits a rank keeps for the next run with the same rows and tokenizer
    (train/token_cache.py)."""
    return home() / "cache" / "tokens"


def clusters_dir() -> Path:
    """One folder per cluster from `cpudist cluster up`."""
    return home() / "clusters"


def images_dir() -> Path:
    """One folder per image being built."""
    return home() / "images"


def local_cluster_dir() -> Path:
    """This machine's on-prem cluster folder (the key, pinned host keys, the launchers' ssh):
    `home()/cluster`.

    Before CPUDIST_HOME was honoured here it was always ~/.cpudist/cluster, which is also where
    ssh-setup installs the key on every node, this machine included when it is one: when only that
    folder holds a key, it is used.
    """
    mine, as_node = home() / "cluster", Path.home() / CLUSTER_DIR
    if not (mine / "id_ed25519").is_file() and (as_node / "id_ed25519").is_file():
        return as_node
    return mine


def check_cluster_name(name: str) -> str:
    """A cluster name is also a folder and a tag value: lower-case letters, digits and '-', at most
    40."""
    if not CLUSTER_NAME.match(name or ""):
        raise BadInput(f"cluster name {name!r} is not allowed",
                       "Use 1 to 40 lower-case letters, digits and '-', e.g. --name team-a")
    return name


def is_run_id(text: str) -> bool:
    """Whether `text` may be a run id. It names folders (a remote run's on its head, its part
    of a --checkpoint-s3 location): letters, digits, '.', '_', '-', at most 64, the first a
    letter or digit."""
    return bool(RUN_ID.match(text))


def check_run_id(text: str, source: str) -> str:
    """`text`, a run id read from `source` (a file, a listing), or BadInput when it is none."""
    if not is_run_id(text):
        raise BadInput(f"{source} names run id {text!r}, which is not a run id cpudist makes",
                       "Resume from a checkpoint or run folder that cpudist wrote, or start a "
                       "fresh run without --resume")
    return text


def cluster_dir(name: str) -> Path:
    """~/.cpudist/clusters/NAME (never anything outside it: the name is checked)."""
    return clusters_dir() / check_cluster_name(name)


def image_dir(name: str) -> Path:
    """~/.cpudist/images/NAME: the builder's key and pinned host key while an image is baked."""
    return images_dir() / check_cluster_name(name)


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write `text` to `path` so that readers see the old file or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_private(path: Path, text: str) -> None:
    """A secret (a private key): mode 0600 from creation, written atomically."""
    write_atomic(path, text, 0o600)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock beside `path` (`path.lock`), for read-modify-write of shared files."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def remove_dir(folder: Path) -> None:
    """Remove a folder of cpudist's own (never one outside the home folder)."""
    if home().resolve() not in folder.resolve().parents:
        raise ValueError(f"{folder} is not inside {home()}")
    shutil.rmtree(folder, ignore_errors=True)


def remove_cluster_dir(name: str) -> None:
    """Forget a cluster locally: its record, hostfile, key and pinned host keys."""
    remove_dir(cluster_dir(name))
