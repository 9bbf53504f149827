"""A run from the laptop onto nodes as they come: `ubuntu`, stock sshd, Debian's /etc/hosts, no
--remote-python.

The world of test_remote_onprem.py with the conveniences taken away: the login is the unprivileged
`ubuntu` of AWS's images (its own home on every node), sshd checks the modes of ~/.ssh (StrictModes
yes, its default), every node's /etc/hosts maps its own name to 127.0.1.1 (what Debian's installer
writes; gloo then listens on loopback unless told otherwise), and the laptop does not say where
Python is: the nodes' image has cpudist's Python as `python3.11` on the login's PATH
(/usr/local/bin, as `make altinstall` leaves it), which cpudist must find by itself.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.netns import missing_requirements
from tests.harness.world import World

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(missing_requirements() is not None,
                                 reason=str(missing_requirements()))]
CPUDIST = [sys.executable, "-m", "cpudist.cli"]
USER = "ubuntu"


def as_user(w: World, i: int, command: str) -> subprocess.CompletedProcess[str]:
    """`command` in a login shell of USER on host i (HOME and PATH as a login gets them)."""
    return w.hosts.run(i, ["runuser", "-l", USER, "-c", command], timeout=300)


@pytest.fixture(scope="module")
def stock(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Iterator[World]:
    """Two nodes as installed: an admin's key for `ubuntu` on each, `cpudist hosts ssh-setup` run by
    ubuntu on the head; the laptop with its own key (authorized for ubuntu) and its own data."""
    w = World(2, tmp_path_factory.mktemp("stock"), prefix=f"cps{os.getpid() % 10000}",
              users=(USER,), strict_modes=True, loopback_name=(0, 1))
    w.up()
    try:
        laptop_key = w.operator_path(".ssh/id_ed25519")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(laptop_key)],
                       check=True)
        # the site firewall admits the laptop's SSH
        w.on_prem(laptop_key.with_suffix(".pub").read_text())
        entry = pwd.getpwnam(USER)
        for i in range(w.hosts.n):
            # no root login on these images
            (w.hosts.node_dir(i) / "dot-ssh" / "authorized_keys").write_text("")
            w.hosts.authorize(i, USER, laptop_key.with_suffix(".pub").read_text())
        # The admin's key, which ubuntu on the head uses for ssh-setup, as a user would have it in
        # ~/.ssh.
        head_home = w.hosts.home(0, USER)
        admin = head_home / ".ssh" / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(admin)],
                       check=True)
        for i in range(w.hosts.n):
            w.hosts.authorize(i, USER, admin.with_suffix(".pub").read_text())
        hosts = "".join(f"{w.hosts.name(i)}\n" for i in range(2))
        (head_home / "hosts").write_text(hosts)
        for path in (admin, admin.with_suffix(".pub"), head_home / "hosts"):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        w.operator_path("hosts").write_text(hosts)
        setup = as_user(w, 0, "cpudist hosts ssh-setup --hostfile hosts")
        assert setup.returncode == 0, setup.stdout + setup.stderr
        shutil.copytree(shared_data / "glue" / "MRPC", w.operator_path("data/MRPC"))
        yield w
    finally:
        w.down()


def test_a_run_as_ubuntu_on_stock_nodes_finds_python_by_itself(stock: World) -> None:
    r = stock.operator_run([*CPUDIST, "run", "mrpc", "--np", "2", "--ppn", "1", "--hostfile",
                            "/srv/cpd-operator/hosts", "--head", stock.hosts.public_addr(0),
                            "--user", USER, "--identity", "/srv/cpd-operator/.ssh/id_ed25519",
                            "--model", "tiny", "--data-dir", "/srv/cpd-operator/data/MRPC",
                            "--max-steps", "3", "--max-eval-samples", "64", "--dist-timeout", "60",
                            "--output-dir", "/srv/cpd-operator/runs/stock"], timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    result = json.loads(stock.operator_path("runs/stock/result.json").read_text())
    assert sorted(result["nodes"]) == [stock.hosts.name(0), stock.hosts.name(1)]
    assert result["staging"]["remote_run_dir"].startswith(
        f"{pwd.getpwnam(USER).pw_dir}/.cpudist/runs/")
    # The ranks ran under the Python the lookup found on the login's PATH, not one the laptop named.
    command = stock.operator_path("runs/stock/command.txt").read_text()
    assert "/usr/local/bin/python3.11 -m cpudist.rank" in command, command
