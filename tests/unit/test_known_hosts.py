"""known_hosts: one locked, atomic writer for pinning and forgetting, with OpenSSH's `[host]:port`
names, read back by OpenSSH's own ssh-keygen."""

from __future__ import annotations

import io
import multiprocessing
import multiprocessing.synchronize
import shutil
import subprocess
from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cpudist.ssh.known_hosts import KnownHosts, entry_name


def key(seed: int) -> paramiko.PKey:
    """A distinct host key per seed (ed25519 from `cryptography`, loaded by paramiko)."""
    private = Ed25519PrivateKey.from_private_bytes(bytes([seed % 256]) * 32)
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    return paramiko.Ed25519Key.from_private_key(io.StringIO(pem))


def found_by_openssh(path: Path, name: str) -> bool:
    """OpenSSH's own lookup (`ssh-keygen -F`), which is what the nodes' ssh and the launchers will
    do."""
    r = subprocess.run(["ssh-keygen", "-F", name, "-f", str(path)], capture_output=True, text=True)
    return r.returncode == 0 and "Host " in r.stdout


needs_ssh_keygen = pytest.mark.skipif(shutil.which("ssh-keygen") is None,
                                      reason="no ssh-keygen (openssh-client)")


def test_entry_names_are_openssh_s() -> None:
    assert entry_name("node1") == "node1" and entry_name("node1", 22) == "node1"
    assert entry_name("10.0.0.2", 2222) == "[10.0.0.2]:2222"


@needs_ssh_keygen
def test_pins_on_any_port_are_found_by_openssh_and_survive_a_reload(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    known = KnownHosts(path)
    known.pin(entry_name("node1"), key(1))
    known.pin(entry_name("10.0.0.2", 2222), key(2))
    assert found_by_openssh(path, "node1") and found_by_openssh(path, "[10.0.0.2]:2222")
    assert not found_by_openssh(path, "10.0.0.2")  # port 22 of that host was never pinned
    again = KnownHosts(path)
    assert again.keys.lookup("[10.0.0.2]:2222")["ssh-ed25519"] == key(2)
    known.pin("node1", key(3))  # a new key of the same type replaces the old one, once
    assert (path.read_text().count("node1 ") == 1
            and KnownHosts(path).keys.lookup("node1")["ssh-ed25519"] == key(3))


@needs_ssh_keygen
def test_forget_drops_every_port_of_a_host_and_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    other = f"node10 ssh-ed25519 {key(9).get_base64()}"
    hashed = f"{paramiko.HostKeys.hash_host('node1')} ssh-ed25519 {key(8).get_base64()}"
    path.write_text(f"# kept: a comment\n{other}\n{hashed}\n")
    known = KnownHosts(path)
    for name in ("node1", "[node1]:2222", "[node1]:2200", "[node2]:2222", "node2"):
        known.pin(name, key(len(name)))
    assert known.forget("node1", 2222)  # one port only
    assert not found_by_openssh(path, "[node1]:2222") and found_by_openssh(path, "[node1]:2200")
    assert known.forget("node1")  # every port, the hashed line too (as ssh-keygen -H leaves them)
    text = path.read_text()
    assert "node1" not in text.replace("node10", "") and hashed not in text, text
    assert "# kept: a comment" in text and other in text and found_by_openssh(path, "node10")
    assert found_by_openssh(path, "[node2]:2222") and found_by_openssh(path, "node2")
    assert not known.forget("node1")  # nothing left to forget: the file is not rewritten
    assert known.keys.lookup("[node1]:2200") is None  # the in-memory view follows the file


def test_lines_for_the_nodes_carry_the_port(tmp_path: Path) -> None:
    known = KnownHosts(tmp_path / "known_hosts")
    known.pin("[1.2.3.4]:2222", key(4))
    lines = known.lines_for({"1.2.3.4": ["10.0.0.4", "10.0.0.4", "node4"]}, 2222)
    assert lines == f"[10.0.0.4]:2222,[node4]:2222 ssh-ed25519 {key(4).get_base64()}\n"
    assert known.lines_for({"1.2.3.4": ["10.0.0.4"]}) == "\n"  # port 22 was never pinned


def _pin_many(path: Path, start: int, forget: str | None) -> None:
    known = KnownHosts(path)
    for i in range(start, start + 25):
        known.pin(f"host{i}", key(i))
        if forget:
            known.forget(forget)


def _read_while(path: Path, stop: multiprocessing.synchronize.Event) -> None:
    """Exit 1 if any read of the file misses the line no writer removes (a writer truncated it, then
    wrote)."""
    while not stop.is_set():
        if "anchor " not in path.read_text():
            raise SystemExit(1)


def test_writers_in_several_processes_lose_no_pin_and_readers_never_see_a_part(
    tmp_path: Path) -> None:
    """Each process holds its own KnownHosts (two cpudist commands at once); a read-modify-write
    without the lock beside the file loses the others' pins, and a file rewritten in place shows
    readers (ssh) a part of it."""
    path = tmp_path / "known_hosts"
    KnownHosts(path).pin("anchor", key(201))
    KnownHosts(path).pin("victim", key(200))
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    reader = ctx.Process(target=_read_while, args=(path, stop))
    reader.start()
    procs = [ctx.Process(target=_pin_many, args=(path, 25 * p, "victim" if p == 0 else None))
             for p in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    stop.set()
    reader.join(60)
    assert [p.exitcode for p in procs] == [0] * 4 and reader.exitcode == 0
    names = {ln.split()[0] for ln in path.read_text().splitlines()}
    expected = {"anchor", *(f"host{i}" for i in range(100))}
    assert names == expected, f"lost {sorted(expected - names)}, kept {sorted(names - expected)}"
    assert not list(tmp_path.glob(".known_hosts.*")), "a temporary file was left behind"
