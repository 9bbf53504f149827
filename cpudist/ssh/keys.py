"""The cluster's own SSH identity and the files that let every node reach every other (pure
text)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cpudist import state


@dataclass(frozen=True)
class KeyPair:
    """An ed25519 key in OpenSSH formats."""

    private: str
    public: str


def generate_key(comment: str = "cpudist-cluster") -> KeyPair:
    """A new ed25519 key pair (paramiko cannot generate ed25519; `cryptography` can)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    return KeyPair(private, f"{public} {comment}")


def load_or_create_key(folder: Path) -> KeyPair:
    """The cluster key kept in `folder` (mode 0600), made on first use: re-running changes
    nothing."""
    private, public = folder / "id_ed25519", folder / "id_ed25519.pub"
    if private.is_file() and public.is_file():
        return KeyPair(private.read_text(), public.read_text().strip())
    pair = generate_key()
    state.write_private(private, pair.private)
    state.write_atomic(public, pair.public + "\n")
    return pair


def ssh_config(folder: str, user: str) -> str:
    """ssh_config used between nodes: the cluster key, pinned host keys, never a prompt; an ssh to a
    node that vanished (powered off: no FIN, no RST) gives up after 3 unanswered keepalives 5 s
    apart, not TCP's ~15 min."""
    return f"""Host *
  User {user}
  IdentityFile {folder}/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile {folder}/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
  ConnectTimeout 10
  ServerAliveInterval 5
  ServerAliveCountMax 3
  LogLevel ERROR
"""


def ssh_wrapper(folder: str) -> str:
    """The `ssh` that launchers are told to use (Hydra's -launcher-exec, Open MPI's
    plm_ssh_agent)."""
    return f'#!/bin/sh\nexec ssh -F "{folder}/ssh_config" "$@"\n'
