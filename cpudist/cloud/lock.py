"""One `cluster up`, `down` or recovery of a name at a time on this machine: a second is refused in
one line.

Two `up` of one name at once would each import a key pair or adopt the other's, and leave a private
key that matches no node. The lock is an flock on a file beside the clusters' folders (not inside
one: a rollback removes that folder), released by the kernel when its holder exits, however it
exits.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

from cpudist import state
from cpudist.errors import BadInput


class ClusterBusy(BadInput):
    """Another cpudist is changing this cluster."""


@contextmanager
def cluster_lock(name: str) -> Iterator[None]:
    """Hold cluster `name`'s lock for the block; ClusterBusy at once if another process holds it."""
    folder = state.clusters_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f".{state.check_cluster_name(name)}.lock"
    with open(path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise ClusterBusy(f"cluster {name} is being changed by another cpudist ({holder})",
                              "Wait for it to finish, then re-run") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}")
        lock.flush()
        try:
            yield
        finally:
            lock.truncate(0)
