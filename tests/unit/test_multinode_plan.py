from __future__ import annotations

import paramiko
import pytest

from cpudist.config import TrainConfig
from cpudist.hostfile import Host
from cpudist.hosts.doctor import compare
from cpudist.hosts.probe import mem_available_gib
from cpudist.launch.env import EnvSpec, node_env
from cpudist.launch.kinds import plan
from cpudist.launch.runner import failed_host, rank_error
from cpudist.launch.spec import RunSpec
from cpudist.ssh.keys import generate_key, ssh_config, ssh_wrapper
from tests.unit.specs import run_spec

HOSTS = tuple(Host(f"n{i}") for i in range(4))


def env_spec(cores: int, ppn: int, backend: str, **more: object) -> EnvSpec:
    """A node's rank environment inputs on host h0 (keywords: EnvSpec takes no positions)."""
    return EnvSpec(physical_cores=cores, ppn=ppn, backend=backend, master_addr="h0", master_port=1,
                   hub_offline=False, **more)  # type: ignore[arg-type]


def spec(launcher: str, **kw: object) -> RunSpec:
    base: dict[str, object] = dict(
        train=TrainConfig(task="mrpc", output_dir="/r", model="tiny"), np=8, ppn=2, hosts=HOSTS,
        launcher=launcher, launcher_path="/mpi/bin/launcher", python="/py/bin/python",
        master_addr="n0",
        master_port=29500, physical_cores=16, hostfile="/r/hostfile",
        ssh="/home/u/.cpudist/cluster/ssh")
    base.update(kw)
    return run_spec(**base)


def genv(argv: tuple[str, ...]) -> dict[str, str]:
    return {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "-genv"}


def test_mpich_across_hosts() -> None:
    launch = plan(spec("mpich"))
    a = launch.argv
    assert a[:7] == ("/mpi/bin/launcher", "-launcher", "ssh", "-launcher-exec",
                     "/home/u/.cpudist/cluster/ssh", "-f", "/r/hostfile")
    assert a[7:11] == ("-np", "8", "-ppn", "2")
    assert genv(a)["OMP_NUM_THREADS"] == "8" and genv(a)["MASTER_ADDR"] == "n0"


def test_intel_mpi_across_hosts() -> None:
    a = plan(spec("impi")).argv
    assert a[1:7] == ("-bootstrap", "ssh", "-bootstrap-exec", "/home/u/.cpudist/cluster/ssh", "-f",
                      "/r/hostfile")
    assert genv(a)["I_MPI_PIN_DOMAIN"] == "omp"


@pytest.mark.parametrize("as_root", [True, False])
def test_open_mpi_across_hosts(as_root: bool) -> None:
    a = plan(spec("openmpi", as_root=as_root)).argv
    assert ("--allow-run-as-root" in a) == as_root
    i = a.index("--map-by")
    assert a[i + 1] == "ppr:2:node"
    assert a[a.index("--hostfile") + 1] == "/r/hostfile"
    assert a[a.index("plm_ssh_agent") + 1] == "/home/u/.cpudist/cluster/ssh"
    assert "-x" in a and "OMP_NUM_THREADS=8" in a


def test_torchrun_across_hosts_starts_one_agent_per_host() -> None:
    """The head's agent runs here, the others' over the cluster's ssh; all join the head's c10d
    rendezvous."""
    launch = plan(spec("torchrun", cwd="/work"))
    assert [host for host, _ in launch.per_host] == ["n0", "n1", "n2", "n3"]
    head, other = launch.per_host[0][1], launch.per_host[3][1]
    assert head[:2] == ("sh", "-c") and other[:2] == ("/home/u/.cpudist/cluster/ssh", "n3")
    line = other[2]
    assert line.startswith(
        "cd /work && exec env ") and "-m cpudist.launch.tether -- /py/bin/python" in line
    assert "--nnodes 4 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint n0:29500" in line
    assert "--local-addr n3" in line and "-m cpudist.rank --task=mrpc" in line
    # torchrun sets the rendezvous itself
    assert "OMP_NUM_THREADS=8" in line and "MASTER_ADDR" not in line


def test_env_for_cluster_features() -> None:
    env = node_env(EnvSpec(physical_cores=16, ppn=2, backend="ccl", master_addr="n0", master_port=1,
                           hub_offline=False, launcher="impi", iface="eth0",
                           allocator="/usr/lib/libtcmalloc.so.4", iomp="/py/lib/libiomp5.so"))
    assert env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert env["LD_PRELOAD"] == "/usr/lib/libtcmalloc.so.4:/py/lib/libiomp5.so"
    assert env["KMP_BLOCKTIME"] == "1" and "KMP_AFFINITY" in env
    assert env["CCL_WORKER_AFFINITY"] == "7,15" and env["CCL_ATL_TRANSPORT"] == "mpi"
    plain = node_env(env_spec(16, 2, "gloo"))
    assert not {"LD_PRELOAD", "KMP_AFFINITY", "CCL_WORKER_COUNT", "I_MPI_PIN_DOMAIN"} & set(plain)


@pytest.mark.parametrize(("lines", "host"), [
    (("x", "=   RANK 2 PID 77 RUNNING AT cpd-n2", "=   KILLED BY SIGNAL: 9"), "cpd-n2"),
    (("prterun noticed that process rank 1 with PID 5 on node n1 exited on signal 9.",), "n1"),
    (("[n3:3] error: data file not found",), "n3"),
    (("nothing useful",), None),
    # a rank killed silently: its peer's lost-peer line comes first, the launcher's blame names the
    # host it began on
    (("[n0:0] error: lost a peer rank: Connection closed by peer [198.18.0.11]:4711",
      "=   PID 77 RUNNING AT n1", "=   KILLED BY SIGNAL: 9"), "n1"),
    (("[n0:0] error: lost a peer rank: Connection closed by peer",
      "[n1:1] error: data file not found"), "n1"),
    (("[n0:0] error: lost a peer rank: Connection closed by peer",), "n0"),
    (("[n2] error: cannot start train.py",), "n2"),
])
def test_failed_host(lines: tuple[str, ...], host: str | None) -> None:
    assert failed_host(lines) == host


def test_the_error_line_quoted_is_the_failing_hosts_own_else_not_a_lost_peer() -> None:
    lost = "[n0:0] error: lost a peer rank: Connection closed by peer"
    own = "[n1:1] error: data file not found"
    assert rank_error((lost, "  " + own + "  "), "n1") == own
    assert rank_error((lost, own), None) == own
    # the killed rank said nothing: its peer's line
    assert rank_error((lost, "=   RUNNING AT n1"), "n1") == lost
    assert rank_error(("no errors",), "n1") is None


def test_generated_key_is_usable_by_openssh_and_paramiko(tmp_path: object) -> None:
    pair = generate_key()
    assert pair.private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert pair.public.startswith("ssh-ed25519 ")
    import io

    key = paramiko.Ed25519Key.from_private_key(io.StringIO(pair.private))
    assert pair.public.split()[1] == key.get_base64()
    cfg = ssh_config("/home/u/.cpudist/cluster", "u")
    assert ("StrictHostKeyChecking yes" in cfg
            and "IdentityFile /home/u/.cpudist/cluster/id_ed25519" in cfg)
    assert 'ssh -F "/home/u/.cpudist/cluster/ssh_config"' in ssh_wrapper("/home/u/.cpudist/cluster")


def facts(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {"python": "3.11.7", "cpudist": "0.1.0", "torch": "2.13.0",
                               "transformers": "5.2",
                               "cpu": {"flags": ["avx2", "avx512f"], "physical_cores": 32},
                               "launchers": {"mpiexec.hydra": "/x"}}
    base.update(kw)
    return base


def test_doctor_compare() -> None:
    head = facts()
    assert compare(head, facts(), "mpiexec.hydra") == ()
    problems = compare(head,
                       facts(torch="2.12.0",
                             cpu={"flags": ["avx2"], "physical_cores": 16, "model": "Other"},
                             launchers={}), "mpiexec.hydra")
    assert len(problems) == 5 and any("torch 2.12.0" in p for p in problems)


def test_mem_available() -> None:
    assert mem_available_gib("MemTotal: 100 kB\nMemAvailable:   2097152 kB\n") == 2.0


def test_doctor_compares_every_node_with_this_machine_too() -> None:
    here = facts(cpudist="0.2.0", mpi="mpich-5.0.2")
    node = facts(mpi="mpich-4.2.0")
    problems = compare(facts(), node, "mpiexec.hydra", here)
    assert "cpudist 0.1.0 != this machine's 0.2.0" in problems
    assert "mpi mpich-4.2.0 != this machine's mpich-5.0.2" in problems
    assert compare(facts(), facts(**{"mpi": "x"}), "mpiexec.hydra", facts(mpi="x")) == ()


def test_a_peer_silent_for_the_groups_timeout_is_a_lost_peer_said_as_such() -> None:
    from cpudist.rank import lost_peer, peer_line

    # what DDP's comm hook raised when the peer was stopped: gloo's timeout inside two callback
    # wrappers
    wrapped = RuntimeError("Got the following error when running the callback: RuntimeError: Got "
                           "the following "
                           "error when running the callback: RuntimeError: "
                           "[/__w/pytorch/pytorch/third_party/gloo/"
                           "gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 20000ms for "
                           "recv operation "
                           "to complete\n\nAt:\n  default_hooks.py(31): <lambda>")
    assert lost_peer(wrapped)
    assert peer_line(wrapped,
                     20) == ("no answer within --dist-timeout 20s (a rank that hangs, or a frozen "
                             "host or link): Timed out waiting 20000ms for recv operation to "
                             "complete")
    gone = RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                        "[10.0.0.2]:4411")
    assert lost_peer(gone) and peer_line(gone, 20) == str(gone)
    # a bug keeps its traceback
    assert not lost_peer(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
