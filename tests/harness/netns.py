"""A multi-host test cluster on one Linux machine (root): network namespaces with a real sshd each.

    python -m tests.harness.netns up --hosts 4      # prints the hostfile path
    python -m tests.harness.netns exec 0 -- hostname
    python -m tests.harness.netns shape "tbf rate 1gbit burst 256kb latency 10ms"
    python -m tests.harness.netns down

Host i is: namespace <prefix>-n<i> with eth0 = 198.18.0.(10+i)/24 on a bridge that lives in its
own namespace (the root namespace's network is never touched); its own hostname and /etc/hosts
(names resolve to eth0 addresses, so gloo never binds 127.0.0.1); its own ~/.ssh and ~/.cpudist
(bind mounts, so each host has its own keys like a real machine) while the rest of the file
system (Python, the repository, the data) is shared; an OpenSSH sshd with its own host key,
public-key login only. A "user key" is pre-authorized on every host, as a cloud or an admin
would do. Teardown stops only the sshd processes this harness started (by PID).

Options make hosts less convenient, as real ones are: `loopback_name` hosts get Debian's
`127.0.1.1 <hostname>` line in place of their own address (gloo then binds loopback unless told
otherwise); `users` adds unprivileged logins (e.g. AWS's `ubuntu`), each with its own home on every
host; `strict_modes` makes sshd check the ownership and modes of ~/.ssh, as stock sshd does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def add_bridge(ns: str) -> None:
    """A namespace holding one bridge, br0, that hosts' veths join."""
    sh("ip", "netns", "add", ns)
    sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "-n", ns, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", ns, "link", "set", "br0", "up")


def plug(ns: str, dev: str, cidr: str, bridge_ns: str, port: str) -> None:
    """A veth from namespace `ns` (device `dev`, address `cidr`) to the bridge in `bridge_ns`."""
    sh("ip", "link", "add", port, "netns", bridge_ns, "type", "veth", "peer", "name", dev, "netns",
       ns)
    sh("ip", "-n", bridge_ns, "link", "set", port, "master", "br0", "up")
    sh("ip", "-n", ns, "addr", "add", cidr, "dev", dev)
    sh("ip", "-n", ns, "link", "set", dev, "up")


def ensure_user(name: str) -> None:
    """An unprivileged login `name` on this machine (the hosts share /etc/passwd), with no home made
    here: every host mounts one of its own there."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        # Password `*`: none, but not locked (sshd without PAM refuses a locked account even its
        # keys).
        made = sh("useradd", "--no-create-home", "--home-dir", f"/home/{name}", "--shell",
                  "/bin/bash", "--password", "*", name, check=False)
        if made.returncode not in (0, 9):  # 9: made by a test running beside this one
            raise RuntimeError(f"useradd {name} failed: {made.stderr}") from None
        entry = pwd.getpwnam(name)
    Path(entry.pw_dir).mkdir(parents=True, exist_ok=True)  # the mount point of the hosts' homes


def missing_requirements() -> str | None:
    """Why this machine cannot host the cluster, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in (SSHD, "/usr/bin/ssh-keygen"):
        if not Path(tool).exists():
            return (f"{tool} not installed "
                    "(apt-get install openssh-server; tests/harness/setup.sh does it)")
    for tool in ("ip", "unshare", "nsenter", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (apt-get install iproute2 util-linux)"
    return None


@dataclass(frozen=True)
class NetnsCluster:
    """N namespace hosts; `state` holds keys, configs, the hostfile and sshd pid files."""

    n: int
    state: Path
    prefix: str = "cpd"
    net: str = "198.18.0"
    base: int = 10
    gateway: str | None = None  # e.g. "198.18.0.1": this (root) namespace joins the network there
    prefixlen: int = 24
    preauthorize: bool = True  # the user key is in every host's authorized_keys from the start
    # hosts whose /etc/hosts says `127.0.1.1 <own name>` (Debian)
    loopback_name: tuple[int, ...] = ()
    # unprivileged logins (made on this machine if missing), a home per host
    users: tuple[str, ...] = ()
    # sshd's StrictModes: refuse keys in group/world-writable ~/.ssh or homes
    strict_modes: bool = False

    def name(self, i: int) -> str:
        return f"{self.prefix}-n{i}"

    def addr(self, i: int) -> str:
        return f"{self.net}.{self.base + i}"

    @property
    def bridge_ns(self) -> str:
        return f"{self.prefix}-br"

    @property
    def hostfile(self) -> Path:
        return self.state / "hostfile"

    @property
    def user_key(self) -> Path:
        """The credential the user already has on every host (pre-authorized)."""
        return self.state / "user_ed25519"

    def node_dir(self, i: int) -> Path:
        return self.state / f"n{i}"

    def sshd_pid(self, i: int) -> int:
        return int((self.node_dir(i) / "sshd.pid").read_text().strip())

    def home(self, i: int, user: str) -> Path:
        """Where the test process writes what host i's `user` sees as their home (one of
        `users`)."""
        return self.node_dir(i) / f"home-{user}"

    def hosts_file(self, i: int) -> Path:
        """Host i's /etc/hosts."""
        return self.node_dir(i) / "hosts" if i in self.loopback_name else self.state / "hosts"

    # --- lifecycle -------------------------------------------------------------------------

    def up(self) -> NetnsCluster:
        """Create the namespaces, the bridge and one sshd per host; returns self."""
        if sh("ip", "netns", "list").stdout.count(self.bridge_ns):
            raise RuntimeError(f"{self.bridge_ns} exists: run down first")
        self.state.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        for mount_point in (Path.home() / ".ssh", Path.home() / ".cpudist"):
            mount_point.mkdir(mode=0o700, exist_ok=True)
        if not self.user_key.exists():
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "cpd-user", "-f",
               str(self.user_key))
        hosts = ["127.0.0.1 localhost"] + [f"{self.addr(i)} {self.name(i)}" for i in range(self.n)]
        # v4-mapped entries serve c10d's reverse lookups of peers (else it warns on every connect).
        hosts += [f"::ffff:{self.addr(i)} {self.name(i)}" for i in range(self.n)]
        (self.state / "hosts").write_text("\n".join(hosts) + "\n")
        for i in self.loopback_name:
            # What Debian's installer writes: the own name on 127.0.1.1, the others from DNS (here:
            # the list).
            theirs = [line for line in hosts[1:] if not line.endswith(f" {self.name(i)}")]
            self.node_dir(i).mkdir(parents=True, exist_ok=True)
            self.hosts_file(i).write_text("\n".join([hosts[0], f"127.0.1.1 {self.name(i)}",
                                                     *theirs]) + "\n")
        for user in self.users:
            ensure_user(user)
        self.hostfile.write_text("".join(f"{self.name(i)}\n" for i in range(self.n)))
        self._add_networks()
        for i in range(self.n):
            self._start_node(i)
        return self

    def _add_networks(self) -> None:
        add_bridge(self.bridge_ns)
        if self.gateway:
            # A bastion inside the "VPC": the test process itself reaches every host directly.
            sh("ip", "link", "add", f"{self.prefix}-gw", "type", "veth", "peer", "name", "vgw",
               "netns", self.bridge_ns)
            sh("ip", "-n", self.bridge_ns, "link", "set", "vgw", "master", "br0", "up")
            sh("ip", "addr", "add", f"{self.gateway}/{self.prefixlen}", "dev", f"{self.prefix}-gw")
            sh("ip", "link", "set", f"{self.prefix}-gw", "up")

    def _start_node(self, i: int) -> None:
        ns, d = self.name(i), self.node_dir(i)
        for sub in ("dot-ssh", "dot-cpudist"):
            (d / sub).mkdir(parents=True, mode=0o700, exist_ok=True)
        auth = d / "dot-ssh" / "authorized_keys"
        auth.write_text((self.user_key.with_suffix(".pub")).read_text() if self.preauthorize
                        else "")
        auth.chmod(0o600)
        for user in self.users:
            self._make_home(i, user)
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        plug(ns, "eth0", f"{self.addr(i)}/{self.prefixlen}", self.bridge_ns, f"v{i}")
        self._add_links(i)
        self._launch_sshd(i, new_key=True)

    def _add_links(self, i: int) -> None:
        """More interfaces for host i before its sshd starts (none here)."""

    def listen_addrs(self, i: int) -> list[str]:
        """Addresses host i's sshd listens on."""
        return [self.addr(i)]

    def _make_home(self, i: int, user: str) -> None:
        """`user`'s home on host i as `useradd -m` leaves it: theirs, 0755, nothing in it yet."""
        home = self.home(i, user)
        home.mkdir(parents=True, exist_ok=True)
        entry = pwd.getpwnam(user)
        os.chown(home, entry.pw_uid, entry.pw_gid)
        home.chmod(0o755)

    def authorize(self, i: int, user: str, public_key: str) -> None:
        """Add `public_key` to `user`'s ~/.ssh/authorized_keys on host i, as an admin or cloud-init
        would."""
        entry = pwd.getpwnam(user)
        ssh_dir = self.home(i, user) / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        auth = ssh_dir / "authorized_keys"
        with auth.open("a") as f:
            f.write(public_key.strip() + "\n")
        for path in (ssh_dir, auth):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        auth.chmod(0o600)

    def _host_mounts(self, i: int) -> list[str]:
        """Shell commands run in host i's new mount namespace before sshd starts."""
        home = Path.home()
        d = self.node_dir(i)
        mounts = [f"mount --bind '{self.hosts_file(i)}' /etc/hosts",
                  f"mount --bind '{d}/dot-ssh' '{home}/.ssh'",
                  f"mount --bind '{d}/dot-cpudist' '{home}/.cpudist'"]
        if self.users:
            mounts += [*self._python_for_users(i),
                       *(f"mount --bind '{self.home(i, u)}' '{pwd.getpwnam(u).pw_dir}'"
                         for u in self.users)]
        return mounts

    def _python_for_users(self, i: int) -> list[str]:
        """Mounts that install this Python as the host's `python3.11` for every login, as a node
        image would.

        It shows as /usr/local/bin/python3.11 (with its scripts beside it, as `make altinstall` and
        pip leave them), on the PATH sshd gives a login; folders on the way to it that only root may
        enter (pyenv's /root) get an overlay that lets others pass, writes going to a folder of this
        host.
        """
        real_bin = Path(sys.executable).resolve().parent
        extra = self.node_dir(i) / "usr-local-bin"
        extra.mkdir(exist_ok=True)
        for entry in real_bin.iterdir():
            link = extra / entry.name
            if not link.is_symlink():
                link.symlink_to(entry)
        mounts = []
        repo = Path(__file__).resolve().parents[2]  # an editable install imports cpudist from here
        on_the_way = {p for top in (real_bin, repo) for p in (top, *top.parents)}
        closed = sorted((p for p in on_the_way if p.is_dir() and not p.stat().st_mode & 0o001),
                        key=lambda p: len(p.parts))
        for n, folder in enumerate(closed):
            upper, work = self.node_dir(i) / f"pass-{n}", self.node_dir(i) / f"pass-{n}-work"
            for made in (upper, work):
                made.mkdir(exist_ok=True)
            upper.chmod(folder.stat().st_mode & 0o7777 | 0o011)
            mounts.append("mount -t overlay overlay -o "
                          f"'lowerdir={folder},upperdir={upper},workdir={work}' '{folder}'")
        Path("/usr/local/bin").mkdir(parents=True, exist_ok=True)
        return [*mounts,
                f"mount -t overlay overlay -o 'lowerdir={extra}:/usr/local/bin' /usr/local/bin"]

    def _launch_sshd(self, i: int, new_key: bool) -> None:
        ns, d = self.name(i), self.node_dir(i)
        key = d / "ssh_host_ed25519_key"
        if new_key:
            key.unlink(missing_ok=True)
            key.with_suffix(".pub").unlink(missing_ok=True)
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", ns, "-f", str(key))
        (d / "sshd.pid").unlink(missing_ok=True)
        # A real sshd listens on every address, so a Debian host reaches itself by name (127.0.1.1)
        # too.
        loopback = ["127.0.1.1"] if i in self.loopback_name else []
        listen = "".join(f"ListenAddress {a}\n" for a in [*self.listen_addrs(i), *loopback])
        (d / "sshd_config").write_text(f"""Port 22
{listen}HostKey {key}
PidFile {d}/sshd.pid
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
{"StrictModes yes" if self.strict_modes else "StrictModes no"}
UsePAM no
X11Forwarding no
PrintMotd no
Subsystem sftp internal-sftp
MaxStartups 100:30:200
MaxSessions 100
SetEnv OMP_WAIT_POLICY=PASSIVE
""")
        # SetEnv: the hosts share this machine's cores, which real nodes never do, so their OpenMP
        # threads wait asleep instead of spinning on a core another host's rank needs
        # (tests/conftest.py says what it cost).
        sh(SSHD, "-t", "-f", str(d / "sshd_config"))
        # New UTS + mount namespace: own hostname, /etc/hosts, ~/.ssh and ~/.cpudist, inherited by
        # everything this sshd starts.
        script = " && ".join([*self._host_mounts(i), f"hostname '{ns}'",
                              f"exec {SSHD} -f '{d}/sshd_config' -E '{d}/sshd.log'"])
        sh("ip", "netns", "exec", ns, "unshare", "--uts", "--mount", "--propagation", "private",
           "sh", "-c", script)
        for _ in range(100):
            if (d / "sshd.pid").exists() and (d / "sshd.pid").read_text().strip():
                return
            time.sleep(0.05)
        raise RuntimeError(f"sshd on {ns} did not start: {(d / 'sshd.log').read_text()}")

    def rekey(self, i: int) -> None:
        """Restart host i's sshd with a new host key (what a reinstalled machine looks like)."""
        self._stop_sshd(i)
        self._launch_sshd(i, new_key=True)

    def _stop_sshd(self, i: int) -> None:
        pid_file = self.node_dir(i) / "sshd.pid"
        if not pid_file.exists():
            return
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline")
        if cmdline.exists() and str(self.node_dir(i) / "sshd_config") in cmdline.read_text():
            os.kill(pid, 15)  # only our own sshd, identified by its config path
            for _ in range(100):
                try:
                    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                except OSError:
                    break
                if state == "Z":
                    break
                time.sleep(0.05)
        pid_file.unlink(missing_ok=True)

    def down(self) -> None:
        """Stop our sshds, then whatever still lives in our namespaces (as a terminated machine ends
        its processes), and delete the namespaces (the bridge takes the veths with it). Without the
        second step an ssh session whose client went away (tests/integration/test_ssh_link.py drops
        the link under a `sleep 600`) outlived its node by minutes, in a namespace no longer
        named."""
        for i in range(self.n):
            self._stop_sshd(i)
            for pid in self.pids(i):  # processes of our own namespace only, each by its PID
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            sh("ip", "netns", "del", self.name(i), check=False)
        # takes the veths (and the gateway's) along
        sh("ip", "netns", "del", self.bridge_ns, check=False)
        if self.gateway:
            sh("ip", "link", "del", f"{self.prefix}-gw", check=False)

    # --- use -------------------------------------------------------------------------------

    def exec_argv(self, i: int, argv: list[str]) -> list[str]:
        """argv that runs `argv` on host i (its network, hostname, /etc/hosts and home files)."""
        return ["nsenter", "--target", str(self.sshd_pid(i)), "--net", "--uts", "--mount", "--",
                *argv]

    def run(self, i: int, argv: list[str], timeout: float = 600,
            **kw: object) -> subprocess.CompletedProcess[str]:
        """Run a command on host i to the end."""
        return subprocess.run(self.exec_argv(i, argv), capture_output=True, text=True,
                              timeout=timeout, **kw)  # type: ignore[call-overload]

    def pids(self, i: int) -> list[int]:
        """Processes living in host i's network namespace."""
        out = sh("ip", "netns", "pids", self.name(i), check=False).stdout
        return [int(p) for p in out.split()]

    def shape(self, spec: str, only: int | None = None) -> None:
        """`tc` qdisc on both ends of each link (e.g. "tbf rate 1gbit burst 256kb latency 10ms")."""
        for i in range(self.n) if only is None else [only]:
            for ns, dev in ((self.name(i), "eth0"), (self.bridge_ns, f"v{i}")):
                if spec == "none":
                    sh("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)
                else:
                    sh("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *spec.split())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["up", "down", "exec", "shape", "status"])
    ap.add_argument("args", nargs=argparse.REMAINDER)
    ap.add_argument("--hosts", type=int, default=int(os.environ.get("CPD_NODES", "4")))
    ap.add_argument("--state", type=Path,
                    default=Path(os.environ.get("CPD_STATE", "/tmp/cpd-cluster")))
    a = ap.parse_args()
    cluster = NetnsCluster(a.hosts, a.state)
    if a.command == "up":
        cluster.up()
        print(json.dumps({"hostfile": str(cluster.hostfile), "user_key": str(cluster.user_key)}))
    elif a.command == "down":
        cluster.down()
    elif a.command == "exec":
        os.execvp("nsenter", cluster.exec_argv(int(a.args[0]), a.args[1:]))
    elif a.command == "shape":
        cluster.shape(" ".join(a.args))
    else:
        for i in range(a.hosts):
            print(cluster.name(i), cluster.addr(i), "pids:", cluster.pids(i))


if __name__ == "__main__":
    main()
