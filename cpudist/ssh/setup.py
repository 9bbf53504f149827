"""`cpudist hosts ssh-setup`: one cluster key, installed so every node reaches every other."""

from __future__ import annotations

import getpass
import shlex
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from cpudist import state
from cpudist.hostfile import Host
from cpudist.ssh.client import Remote, Target
from cpudist.ssh.keys import load_or_create_key, ssh_config, ssh_wrapper
from cpudist.ssh.known_hosts import KnownHosts
from cpudist.state import CLUSTER_DIR

T = TypeVar("T")


@dataclass(frozen=True)
class NodeSetup:
    """What ssh-setup did on one node."""

    host: str
    home: str
    reaches: tuple[str, ...]  # nodes it could then ssh to with the cluster key
    fails: tuple[str, ...]


def parallel(hosts: Sequence[Host], work: Callable[[Host], T]) -> list[T]:
    """Run `work` for every host at once; all errors are reported together, naming each host."""
    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        futures = [pool.submit(work, h) for h in hosts]
    errors = [e for e in (f.exception() for f in futures) if e is not None]
    if len(errors) == 1:
        raise errors[0]
    if errors:  # the first error's kind (and exit code), every host's message
        raise type(errors[0])("; ".join(str(e) for e in errors))
    return [f.result() for f in futures]


def _put(remote: Remote, rel: str, data: str, mode: str) -> None:
    path = f"~/{rel}"
    remote.check(f"umask 077 && mkdir -p $(dirname {path}) && cat > {path}.tmp && chmod {mode} "
                 f"{path}.tmp && mv {path}.tmp {path}", stdin=data.encode())


def _install(remote: Remote, key_private: str, key_public: str, known_hosts: str, user: str) -> str:
    home = remote.check("printf %s \"$HOME\"").strip()
    _put(remote, f"{CLUSTER_DIR}/id_ed25519", key_private, "600")
    _put(remote, f"{CLUSTER_DIR}/id_ed25519.pub", key_public + "\n", "644")
    _put(remote, f"{CLUSTER_DIR}/known_hosts", known_hosts, "644")
    _put(remote, f"{CLUSTER_DIR}/ssh_config", ssh_config(f"{home}/{CLUSTER_DIR}", user), "644")
    _put(remote, f"{CLUSTER_DIR}/ssh", ssh_wrapper(f"{home}/{CLUSTER_DIR}"), "755")
    quoted = shlex.quote(key_public)
    remote.check("umask 077 && mkdir -p ~/.ssh && touch ~/.ssh/authorized_keys && (grep -qxF "
                 f"{quoted} ~/.ssh/authorized_keys || echo {quoted} >> ~/.ssh/authorized_keys)")
    return home


def _address(name: str) -> str:
    try:
        return socket.gethostbyname(name)
    except OSError:
        return name


def ssh_setup(hosts: Sequence[Host], user: str | None, identity: str | None, port: int = 22,
              known_hosts: Path | None = None, inside: Sequence[str] | None = None,
              key_folder: Path | None = None) -> list[NodeSetup]:
    """Connect with the user's credential, pin host keys, install the cluster key everywhere,
    verify.

    `hosts` are reached from here (a cloud node's public address); `inside` names the same nodes as
    they reach each other (private addresses), the names the nodes' known_hosts and the check use
    [default: the same names]. Without `key_folder` this is an on-prem set-up: its key and the
    launchers' ssh wrapper live in `state.local_cluster_dir()`, as on every node in
    ~/.cpudist/cluster.
    """
    folder = key_folder or state.local_cluster_dir()
    known = KnownHosts(known_hosts or folder / "known_hosts")
    key = load_or_create_key(folder)
    login = user or getpass.getuser()
    names = list(inside) if inside is not None else [h.name for h in hosts]

    def connect(h: Host) -> Remote:
        return Remote(Target(h.name, user, port, identity), known)

    remotes = dict(zip([h.name for h in hosts], parallel(hosts, connect), strict=True))
    try:
        aliases = {h.name: [n, _address(n)] for h, n in zip(hosts, names, strict=True)}
        node_known = known.lines_for(aliases, port)
        homes = parallel(hosts,
                         lambda h: _install(remotes[h.name], key.private, key.public, node_known,
                                            login))
        if key_folder is None:  # launchers on this machine use the same wrapper as on the nodes
            state.write_atomic(folder / "ssh_config", ssh_config(str(folder), login))
            state.write_atomic(folder / "ssh", ssh_wrapper(str(folder)), 0o755)
        quoted = " ".join(shlex.quote(n) for n in names)
        probe = (f"for h in {quoted}; do if ~/{CLUSTER_DIR}/ssh -p {port} -o ConnectTimeout=5 "
                 "\"$h\" true "
                 "</dev/null >/dev/null 2>&1; then echo \"ok $h\"; "
                 "else echo \"fail $h\"; fi; done")
        outputs = parallel(hosts, lambda h: remotes[h.name].check(probe))
    finally:
        for r in remotes.values():
            r.close()
    result = []
    for h, home, out in zip(hosts, homes, outputs, strict=True):
        pairs = [line.split(" ", 1) for line in out.splitlines() if " " in line]
        result.append(NodeSetup(h.name, home, tuple(n for s, n in pairs if s == "ok"),
                                tuple(n for s, n in pairs if s == "fail")))
    return result


def setup_plan(hosts: Sequence[Host], user: str | None, identity: str | None, port: int = 22,
               key_folder: Path | None = None) -> list[str]:
    """What `ssh_setup` would do, as lines: nothing is connected to or written."""
    folder = key_folder or state.local_cluster_dir()
    key = folder / "id_ed25519"
    login = user or getpass.getuser()
    lines = [f"# key: {key} "
             f"({'exists, reused' if key.is_file() else 'would be made (ed25519, mode 0600)'})",
             f"# host keys pinned on first contact in {folder / 'known_hosts'}",
             f"# connect as {login} on port {port} with {identity or 'ssh-agent and ~/.ssh keys'} "
             "to:"]
    lines += [f"{h.name}" for h in hosts]
    lines += ["# on each: "
              f"~/{CLUSTER_DIR}/{{id_ed25519,id_ed25519.pub,known_hosts,ssh_config,ssh}}, the "
              "key's public "
              "half appended to ~/.ssh/authorized_keys, then every node tries ssh to every other",
              f"# here: {folder / 'ssh_config'} and {folder / 'ssh'} (the launchers' ssh)"]
    return lines

