"""A test world shaped like AWS: a VPC of namespace hosts, an internet, and a laptop that is not a
node.

    python -m tests.harness.world up --hosts 4      # prints addresses and paths as JSON
    python -m tests.harness.world operator -- ssh -V
    python -m tests.harness.world exec -- 0 iptables -S
    python -m tests.harness.world down

Networks (no routing between them; the root namespace's network is never touched):
  VPC       198.18.0.0/25   bridge in <prefix>-br; host i eth0 = 198.18.0.(4+i): where moto puts
                            the instances of a subnet 198.18.0.0/25 (it hands out .4 upwards).
  internet  198.18.0.128/25 bridge in <prefix>-pub; host i eth1 = 198.18.0.(132+i) (its public
                            address: private + 128); the operator eth0 = 198.18.0.200.
Host i (namespace <prefix>-n<i>): own hostname, /etc/hosts naming hosts by PRIVATE address (gloo
binds there), own ~/.ssh and ~/.cpudist (bind mounts), sshd on both addresses, no authorized key
until cloud-init installs the instance's key pair. Its INPUT chain is the security groups of the
live instance holding its private address (tests/harness/firewall.py); no instance, no inbound.
Operator (namespace <prefix>-op, the user's laptop): only the internet interface; its own mount
namespace where HOME=/srv/cpd-operator is a folder only it sees (hosts see the mount point
empty, and the physical folder under the state dir hidden), with ~/.ssh and ~/.cpudist of its
own. Python, the repository and /tmp are shared by everyone, as if installed everywhere.
The operator reaches the EC2 emulator at the same URL (127.0.0.1:PORT, forwarded in).
`attach(emulator)` wires: firewall after every mutating call, public addresses of instances =
their host's, a fresh machine (new host key, empty ~/.ssh, ~/.cpudist) when a new instance lands on
a host, and cloud-init installing the key pair.

Machines are powered like EC2's. A host whose instance stops or terminates is switched off: its
links go down first (its peers hear nothing, as when a node vanishes), then every process in its
network namespace is killed (ranks, sshd sessions, sshd itself). A host that gets an instance
boots it in phases (`Boot`): links down while EC2 says `pending`, then port 22 refuses, then
something on port 22 resets every connection before any banner, then sshd answers.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tests.harness.ec2 import Emulator
from tests.harness.firewall import host_rulesets, live_instances, ruleset
from tests.harness.netns import NetnsCluster, add_bridge, plug, sh
from tests.harness.power import Boot, Power

OPERATOR_ADDR = "198.18.0.200"
OPERATOR_HOME = Path("/srv/cpd-operator")
VPC_CIDR, SUBNET_CIDR = "198.18.0.0/24", "198.18.0.0/25"
CLONE_NEWNET = 0x40000000
T = TypeVar("T")


@dataclass(frozen=True)
class WorldHosts(NetnsCluster):
    """NetnsCluster with a second, public interface per host and no pre-authorized key."""

    base: int = 4
    prefixlen: int = 25
    preauthorize: bool = False
    public_base: int = 132

    def private_addr(self, i: int) -> str:
        return self.addr(i)

    def public_addr(self, i: int) -> str:
        return f"{self.net}.{self.public_base + i}"

    @property
    def public_ns(self) -> str:
        return f"{self.prefix}-pub"

    def _add_networks(self) -> None:
        super()._add_networks()
        add_bridge(self.public_ns)

    def _add_links(self, i: int) -> None:
        plug(self.name(i), "eth1", f"{self.public_addr(i)}/25", self.public_ns, f"p{i}")

    def listen_addrs(self, i: int) -> list[str]:
        return [self.private_addr(i), self.public_addr(i)]

    def _host_mounts(self, i: int) -> list[str]:
        # The laptop's files are not on the cluster: hide their physical folder from hosts.
        return [*super()._host_mounts(i),
                f"mount -t tmpfs -o size=1m,mode=700 none '{self.state}/operator-home'"]

    def down(self) -> None:
        super().down()
        sh("ip", "netns", "del", self.public_ns, check=False)


class World:
    """Hosts, the internet and the operator; `attach` an Emulator to make EC2 drive them."""

    ssh_cidr = f"{OPERATOR_ADDR}/32"
    operator_addr = OPERATOR_ADDR
    operator_home = OPERATOR_HOME

    def __init__(self, n_hosts: int, state_dir: Path, prefix: str = "cpw",
                 **host_options: Any) -> None:
        """`host_options`: NetnsCluster's (users, strict_modes, loopback_name)."""
        self.hosts = WorldHosts(n_hosts, Path(state_dir), prefix=prefix, **host_options)
        self.state = Path(state_dir)
        self.operator_ns = f"{prefix}-op"
        self.emulator: Emulator | None = None
        self.region = "us-east-1"
        self._applied: dict[int, str] = {}
        self._lock = threading.Lock()
        self._booted: dict[int, str] = {}  # host -> id of the instance whose disk it holds
        self.power = Power(self.hosts, self._lock, self._instance_state)
        self.boot = Boot()
        self._listeners: list[socket.socket] = []
        # a network ACL that drops traffic between hosts' private addresses
        self.partitioned = False

    # --- lifecycle -------------------------------------------------------------------------

    def up(self) -> World:
        """Both networks, the hosts (firewalled shut) and the operator; returns self."""
        self.operator_path(".ssh").mkdir(parents=True, mode=0o700, exist_ok=True)
        self.operator_path(".cpudist").mkdir(mode=0o700, exist_ok=True)
        self.operator_path().chmod(0o700)
        OPERATOR_HOME.mkdir(parents=True, exist_ok=True)
        self.hosts.up()
        try:
            self._start_operator()
            self.sync()
        except BaseException:
            self.down()
            raise
        return self

    def _start_operator(self) -> None:
        sh("ip", "netns", "add", self.operator_ns)
        sh("ip", "-n", self.operator_ns, "link", "set", "lo", "up")
        plug(self.operator_ns, "eth0", f"{OPERATOR_ADDR}/25", self.hosts.public_ns, "op")
        home, mine = Path.home(), self.operator_path()
        script = " && ".join([f"mount --bind '{mine}' '{OPERATOR_HOME}'",
                              # ssh reads the passwd home
                              f"mount --bind '{mine}/.ssh' '{home}/.ssh'",
                              f"mount --bind '{mine}/.cpudist' '{home}/.cpudist'",
                              "hostname laptop", "exec sleep infinity"])
        # `ip netns exec` and `unshare` both exec: the Popen's pid ends up being the sleep's.
        holder = subprocess.Popen(["ip", "netns", "exec", self.operator_ns, "unshare", "--uts",
                                   "--mount", "--propagation", "private", "sh", "-c", script],
                                  stdin=subprocess.DEVNULL, start_new_session=True)
        (self.state / "operator.pid").write_text(str(holder.pid))
        for _ in range(200):
            if _cmdline(holder.pid).startswith("sleep"):
                return
            if holder.poll() is not None:
                raise RuntimeError(f"operator namespace failed to start (exit {holder.returncode})")
            time.sleep(0.02)
        raise RuntimeError("operator namespace did not start")

    def down(self) -> None:
        """Stop what up() started (by PID), close forwards, delete the namespaces."""
        for listener in self._listeners:
            listener.close()
        self._listeners.clear()
        if self.emulator is not None and self.emulator.on_change == self._on_change:
            self.emulator.on_change = None
            self.emulator.on_key_installed = None
        self.power.close()
        pid = self.operator_pid()
        if pid and _cmdline(pid).startswith("sleep"):
            os.kill(pid, 15)
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:  # started by another process (the CLI): wait for it to go
                for _ in range(100):
                    if not _cmdline(pid):
                        break
                    time.sleep(0.05)
        (self.state / "operator.pid").unlink(missing_ok=True)
        self._kill_leftovers()
        sh("ip", "netns", "del", self.operator_ns, check=False)
        self.hosts.down()

    def _kill_leftovers(self) -> None:
        """SIGKILL what still runs in this world's namespaces besides the hosts' sshds (laptop runs,
        agents, launchers, ranks that a failed test left): every one of them was started through
        this world, and deleting a namespace does not stop its processes."""
        sshds = set()
        for i in range(self.hosts.n):
            with contextlib.suppress(OSError, ValueError):
                sshds.add(self.hosts.sshd_pid(i))
        spaces = [self.operator_ns, *(self.hosts.name(i) for i in range(self.hosts.n))]
        for ns in spaces:
            for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                if int(pid) not in sshds:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), 9)

    # --- EC2 -------------------------------------------------------------------------------

    def attach(self, emulator: Emulator, region: str = "us-east-1") -> None:
        """Let `emulator` (in this process) drive firewalls, public addresses and cloud-init."""
        self.emulator, self.region = emulator, region
        emulator.on_change = self._on_change
        emulator.on_key_installed = self._install_key
        emulator.on_boot = self._boot
        emulator.pending_s = self.boot.pending_s
        port = int(emulator.url.rsplit(":", 1)[1])
        self.forward(port)
        self.sync()

    def create_vpc(self, ec2: Any) -> tuple[str, str]:
        """A VPC and a public subnet whose instances land on the hosts; returns (vpc id, subnet
        id)."""
        vpc = ec2.create_vpc(CidrBlock=VPC_CIDR)["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=SUBNET_CIDR)["Subnet"]["SubnetId"]
        ec2.modify_subnet_attribute(SubnetId=subnet, MapPublicIpOnLaunch={"Value": True})
        return vpc, subnet

    def set_boot(self, boot: Boot) -> None:
        """Machines launched or started from now on boot with these phases."""
        self.boot = boot
        if self.emulator is not None:
            self.emulator.pending_s = boot.pending_s

    def wait_booted(self, i: int, timeout_s: float = 60) -> None:
        """Until host i's sshd answers for the instance EC2 now has there."""
        self.power.wait_up(i, self.power.on_for.get(i), timeout_s)

    def _instance_state(self, instance_id: str) -> str | None:
        if self.emulator is None:
            return None
        for reservation in self.emulator.backend(self.region).all_reservations():
            for inst in reservation.instances:
                if inst.id == instance_id:
                    return str(inst.state)
        return None

    def _on_change(self, region: str) -> None:
        if region == self.region:
            self.sync()

    def sync(self) -> None:
        """Make hosts match EC2: fresh machines, public addresses, iptables (only what changed)."""
        with self._lock:
            addrs = [self.hosts.private_addr(i) for i in range(self.hosts.n)]
            if self.emulator is None:
                rulesets = host_rulesets(_NoBackend(), addrs)
            else:
                backend = self.emulator.backend(self.region)
                _release_terminated_addresses(backend)
                self._boot_and_address(backend)
                rulesets = host_rulesets(backend, addrs)
            for i, text in enumerate(rulesets):
                if self.partitioned:
                    private = {f"-s {a} " for a in addrs}
                    text = "\n".join(line for line in text.split("\n")
                                     if not any(p in line for p in private))
                if self._applied.get(i) != text:
                    subprocess.run(["ip", "netns", "exec", self.hosts.name(i), "iptables-restore"],
                                   input=text, text=True, check=True, capture_output=True)
                    self._applied[i] = text

    def _boot_and_address(self, backend: Any) -> None:
        """Power hosts like their instances: off when it stopped or ended, booting when one
        (re)started."""
        index = {self.hosts.private_addr(i): i for i in range(self.hosts.n)}
        live = {index[inst.private_ip]: inst for inst in live_instances(backend)
                if inst.private_ip in index}
        for i in range(self.hosts.n):
            inst = live.get(i)
            if inst is None:
                if i in self.power.on_for:
                    self.power.off(i)  # stopped or terminated: the machine and all it ran are gone
                continue
            nic = inst.nics[0]
            if nic.public_ip and nic.public_ip != self.hosts.public_addr(i):
                nic.public_ip = self.hosts.public_addr(i)  # moto picked one of its own
            if self.power.on_for.get(i) == inst.id:
                continue
            self.power.off(i)  # what ran there before (an idle host's sshd, an earlier machine)
            fresh = self._booted.get(i) != inst.id
            if fresh:
                self._fresh_machine(i)
            self._booted[i] = inst.id
            self.power.on(i, inst.id, new_key=fresh, boot=self.boot)

    def _fresh_machine(self, i: int) -> None:
        """Host i becomes a new machine: nothing in ~/.ssh or ~/.cpudist (its new host key comes at
        boot)."""
        d = self.hosts.node_dir(i)
        (d / "dot-ssh" / "authorized_keys").write_text("")
        for sub in ("dot-ssh", "dot-cpudist"):
            for child in (d / sub).iterdir():
                if child.name != "authorized_keys":
                    shutil.rmtree(child) if child.is_dir() else child.unlink()

    def on_prem(self, public_key: str) -> None:
        """An on-prem cluster instead of EC2: an admin authorized `public_key` on every host, and
        the site firewall admits SSH from the laptop and everything between the hosts' private
        addresses."""
        accepts = [f"-A INPUT -s {OPERATOR_ADDR}/32 -p tcp -m tcp --dport 22 -j ACCEPT",
                   f"-A INPUT -s {SUBNET_CIDR} -j ACCEPT"]
        text = ruleset(accepts)
        for i in range(self.hosts.n):
            with (self.hosts.node_dir(i) / "dot-ssh" / "authorized_keys").open("a") as f:
                f.write(public_key.strip() + "\n")
            subprocess.run(["ip", "netns", "exec", self.hosts.name(i), "iptables-restore"],
                           input=text, text=True, check=True, capture_output=True)
            self._applied[i] = text

    def _boot(self, instance_id: str, address: str, user_data: str, region: str) -> None:
        """An image builder runs ami/bootstrap.sh: played here by waiting for the uploaded wheel,
        checking it, printing the bootstrap's last console line, and powering off (what the real
        script does)."""
        if "cpudist-bootstrap" not in user_data:
            return
        threading.Thread(target=self._bootstrap, args=(instance_id, address, region),
                         daemon=True).start()

    def _bootstrap(self, instance_id: str, address: str, region: str,
                   timeout_s: float = 120) -> None:
        assert self.emulator is not None
        i = next(i for i in range(self.hosts.n) if self.hosts.private_addr(i) == address)
        upload = self.hosts.node_dir(i) / "dot-cpudist" / "upload"
        deadline = time.monotonic() + timeout_s
        while not (upload / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        step = self.emulator.bootstrap_fails_at
        wheels = sorted(upload.glob("cpudist-*.whl"))
        if step is None and not (upload / "ready").exists():
            step = "upload"
        elif step is None and not (wheels and _has(wheels[0], "cpudist/_ami/bootstrap.sh")):
            step = "cpudist"
        result = "OK" if step is None else f"FAILED at step {step} (exit 1)"
        self.emulator.console[instance_id] = ("[  OK  ] Reached target Cloud-init.\n"
                                              f"cpudist-bootstrap: {result}\n")
        self.emulator.backend(region).stop_instances([instance_id])
        self._on_change(region)

    def _install_key(self, address: str, public_key: str) -> None:
        """cloud-init on the host owning `address`: authorize the instance's key pair."""
        for i in range(self.hosts.n):
            if self.hosts.private_addr(i) == address:
                with (self.hosts.node_dir(i) / "dot-ssh" / "authorized_keys").open("a") as f:
                    f.write(public_key + "\n")

    def forward(self, port: int, host: int | None = None) -> None:
        """The operator's (or host `host`'s) 127.0.0.1:port reaches this process's 127.0.0.1:port
        (the AWS API)."""
        listener = self.made_in(host, lambda: socket.create_server(("127.0.0.1", port)))
        self._listeners.append(listener)
        threading.Thread(target=_accept_loop, args=(listener, port), daemon=True).start()

    def made_in(self, host: int | None, make: Callable[[], T]) -> T:
        """`make()` called in the operator's (or host `host`'s) network namespace: the sockets it
        opens stay there (a server on a node's loopback, served by this process's threads)."""
        path = (f"/proc/{self.operator_pid()}/ns/net" if host is None
                else f"/var/run/netns/{self.hosts.name(host)}")
        made: list[T] = []
        failed: list[BaseException] = []

        def inside() -> None:
            # setns moves only this short-lived thread; a socket keeps the namespace it was born in
            fd = os.open(path, os.O_RDONLY)
            try:
                if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(f"setns into {path} failed")
                made.append(make())
            except BaseException as e:  # handed to the caller's thread
                failed.append(e)
            finally:
                os.close(fd)

        t = threading.Thread(target=inside)
        t.start()
        t.join()
        if failed:
            raise RuntimeError(f"could not make it in {path}") from failed[0]
        return made[0]

    # --- the operator ----------------------------------------------------------------------

    def operator_pid(self) -> int | None:
        f = self.state / "operator.pid"
        return int(f.read_text()) if f.exists() else None

    def operator_path(self, rel: str | Path = "") -> Path:
        """Where the test process writes what the operator sees as operator_home / rel."""
        return self.state / "operator-home" / rel

    def operator_argv(self, argv: list[str]) -> list[str]:
        # `env -C`, not nsenter's --wd: that one opens the folder before entering the mount
        # namespace, so the command's cwd was the host's folder under the home's bind mount
        # (relative paths landed there, absolute ones in the home: `runs/x` made by mkdir was not
        # /srv/cpd-operator/runs/x to tempfile).
        return ["nsenter", "--target", str(self.operator_pid()), "--net", "--mount", "--uts", "--",
                "env", "-C", str(OPERATOR_HOME), *argv]

    def operator_env(self, env: dict[str, str] | None = None) -> dict[str, str]:
        """This process's environment, HOME = the operator's, CPUDIST_HOME unset, then `env`."""
        base = {k: v for k, v in os.environ.items() if k != "CPUDIST_HOME"}
        return {**base, "HOME": str(OPERATOR_HOME), **(env or {})}

    def operator_run(self, argv: list[str], env: dict[str, str] | None = None,
                     timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Run `argv` on the laptop to the end, output captured."""
        return subprocess.run(self.operator_argv(argv), env=self.operator_env(env),
                              capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def operator_popen(self, argv: list[str], env: dict[str, str] | None = None,
                       **popen_kw: Any) -> subprocess.Popen[str]:
        """Start `argv` on the laptop (text mode unless popen_kw says otherwise)."""
        popen_kw.setdefault("text", True)
        return subprocess.Popen(self.operator_argv(argv), env=self.operator_env(env), **popen_kw)


def _has(wheel: Path, member: str) -> bool:
    import zipfile

    try:
        with zipfile.ZipFile(wheel) as z:
            return member in z.namelist()
    except zipfile.BadZipFile:
        return False


def _release_terminated_addresses(backend: Any) -> None:
    """Give terminated instances' private addresses back to their subnet, as AWS does.

    moto frees them only when the Instance object is garbage-collected (never, while it is listed),
    so without this a host is used once and `up` after `down` would need new hosts.
    """
    for res in backend.all_reservations():
        for inst in res.instances:
            if inst.state != "terminated" or not inst.subnet_id:
                continue
            subnet = backend.get_subnet(inst.subnet_id)
            for ip in list(inst._private_ips):
                if subnet._subnet_ips.get(ip) is inst:
                    subnet.del_subnet_ip(ip)


class _NoBackend:
    """An EC2 with no instances: every host firewalled shut."""

    def all_reservations(self) -> list[Any]:
        return []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _accept_loop(listener: socket.socket, port: int) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return  # closed by down()
        try:
            upstream = socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError:
            client.close()
            continue
        upstream.settimeout(None)
        threading.Thread(target=_pump, args=(client, upstream, False), daemon=True).start()
        threading.Thread(target=_pump, args=(upstream, client, True), daemon=True).start()


def _pump(src: socket.socket, dst: socket.socket, last: bool) -> None:
    """Copy src to dst until EOF; the server-to-client direction ends last and closes both."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    if last:
        src.close()
        dst.close()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["up", "down", "operator", "exec"])
    ap.add_argument("--hosts", type=int, default=int(os.environ.get("CPD_NODES", "4")))
    ap.add_argument("--state", type=Path,
                    default=Path(os.environ.get("CPD_STATE", "/tmp/cpd-world")))
    ap.add_argument("--prefix", default="cpw")
    a = ap.parse_args(argv[:cut])
    world = World(a.hosts, a.state, a.prefix)
    args = argv[cut + 1:]  # after --: the command (exec: the host index first)
    if a.command == "up":
        world.up()
        print(json.dumps({"hosts": [[world.hosts.name(i), world.hosts.private_addr(i),
                                     world.hosts.public_addr(i)]
                                    for i in range(a.hosts)],
                          "operator": OPERATOR_ADDR, "operator_home": str(world.operator_path())}))
    elif a.command == "down":
        world.down()
    elif a.command == "operator":
        os.execvpe("nsenter", world.operator_argv(args), world.operator_env())
    else:
        os.execvp("nsenter", world.hosts.exec_argv(int(args[0]), args[1:]))


if __name__ == "__main__":
    main()
