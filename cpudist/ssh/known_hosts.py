"""Pinned host keys (trust on first use) in an OpenSSH known_hosts file.

One writer for every change (pin a new host, forget one): under a lock beside the file (threads and
processes, so parallel connections and two cpudist commands never lose each other's pins), the file
re-read, changed and replaced whole (readers, ssh among them, see the old file or the new one).
Names follow OpenSSH: `host` on port 22, `[host]:port` on any other.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import paramiko

from cpudist import state


def entry_name(host: str, port: int = 22) -> str:
    """The name OpenSSH (and paramiko) look a host up by: `host` on port 22, `[host]:port` on
    others."""
    return host if port == 22 else f"[{host}]:{port}"


def _entry(line: str) -> tuple[list[str], str]:
    """(host names, key type) of a known_hosts line; no names for comments, blank lines and
    markers."""
    fields = line.split()
    # @cert-authority and @revoked: not pins of ours
    if len(fields) < 2 or fields[0].startswith(("#", "@")):
        return [], ""
    return fields[0].split(","), fields[1]


def _is(name: str, host: str, port: int | None) -> bool:
    """Whether a known_hosts name stands for `host` on `port` (on any port when None; a hashed name:
    port 22)."""
    if name.startswith("|1|"):
        return paramiko.HostKeys.hash_host(entry_name(host, port or 22), name) == name
    if port is None:
        return name == host or re.fullmatch(rf"\[{re.escape(host)}\]:\d+", name) is not None
    return name == entry_name(host, port)


class KnownHosts:
    """A known_hosts file: keys seen before are enforced, new hosts are pinned (trust on first
    use)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.keys = paramiko.HostKeys()
        if path.is_file():
            self.keys.load(str(path))
        self._lock = threading.Lock()

    def _rewrite(self, edit: Callable[[list[str]], list[str]]) -> bool:
        """The one writer: `edit` gets the file's lines as they are now; True if it changed them."""
        with self._lock, state.locked(self.path):
            before = self.path.read_text().splitlines() if self.path.is_file() else []
            after = edit(before)
            if after != before:
                state.write_atomic(self.path, "".join(f"{line}\n" for line in after))
            self.keys = paramiko.HostKeys()
            if self.path.is_file():
                self.keys.load(str(self.path))  # what every writer pinned so far, this one included
        return after != before

    def pin(self, name: str, key: paramiko.PKey) -> None:
        """Remember a new host's key under `name` (an `entry_name`), replacing a key of that type if
        one was there."""
        line = f"{name} {key.get_name()} {key.get_base64()}"

        def add(lines: list[str]) -> list[str]:
            kept = [ln for ln in lines if _entry(ln) != ([name], key.get_name())]
            return [*kept, line]

        self._rewrite(add)

    def forget(self, host: str, port: int | None = None) -> bool:
        """Drop the pinned keys of `host` (on `port`; on every port when None); True if there were
        any."""
        return self._rewrite(lambda lines: [ln for ln in lines
                                            if not any(_is(n, host, port) for n in _entry(ln)[0])])

    def lines_for(self, names: Mapping[str, Iterable[str]], port: int = 22) -> str:
        """known_hosts text for the nodes themselves: each pinned host's keys (pinned as
        `entry_name(host, port)`) under the names the nodes use for it, on the same port."""
        out = []
        for pinned, aliases in names.items():
            entry = self.keys.lookup(entry_name(pinned, port))
            hostnames = ",".join(dict.fromkeys(entry_name(a, port) for a in aliases))
            for kind, key in (entry or {}).items():
                out.append(f"{hostnames} {kind} {key.get_base64()}")
        return "\n".join(out) + "\n"
