"""cpudist's local state, in one place: the home folder, cluster folders, key and record files.

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


def home() -> Path:
    """`CPUDIST_HOME`, else ~/.cpudist."""
    return Path(os.environ.get("CPUDIST_HOME", "~/.cpudist")).expanduser()


def check_cluster_name(name: str) -> str:
    """A cluster name is also a folder and a tag value: lower-case letters, digits and '-', at most 40."""
    if not CLUSTER_NAME.match(name or ""):
        raise BadInput(f"cluster name {name!r} is not allowed",
                       "Use 1 to 40 lower-case letters, digits and '-', e.g. --name team-a")
    return name


def cluster_dir(name: str) -> Path:
    """~/.cpudist/clusters/NAME (never anything outside it: the name is checked)."""
    return home() / "clusters" / check_cluster_name(name)


def image_dir(name: str) -> Path:
    """~/.cpudist/images/NAME: the builder's key and pinned host key while an image is baked."""
    return home() / "images" / check_cluster_name(name)


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
