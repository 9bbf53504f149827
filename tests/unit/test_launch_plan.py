from __future__ import annotations

import pytest

from cpudist.config import TrainConfig, from_argv
from cpudist.errors import BadInput
from cpudist.hostfile import Host, local_hosts
from cpudist.launch.env import EnvSpec, node_env, parse_env_pairs
from cpudist.launch.kinds import plan
from cpudist.launch.spec import RunSpec, check_layout
from tests.unit.specs import run_spec


def env_spec(cores: int, ppn: int, backend: str, **more: object) -> EnvSpec:
    """A node's rank environment inputs on host h0 (keywords: EnvSpec takes no positions)."""
    return EnvSpec(physical_cores=cores, ppn=ppn, backend=backend, master_addr="h0", master_port=1,
                   hub_offline=False, **more)  # type: ignore[arg-type]


def spec(np: int = 2, ppn: int = 2, launcher: str = "mpich", **kw: object) -> RunSpec:
    cfg = TrainConfig(task="mrpc", output_dir="/tmp/run", model="tiny", max_steps=5)
    base = {"train": cfg, "np": np, "ppn": ppn, "hosts": local_hosts(4), "launcher": launcher,
            "launcher_path": "/opt/mpi/bin/mpiexec.hydra", "python": "/usr/bin/python3",
            "master_addr": "127.0.0.1", "master_port": 29500, "physical_cores": 8}
    return run_spec(**{**base, **kw})


def test_threads_split_among_ranks_of_a_node() -> None:
    env = node_env(EnvSpec(physical_cores=8, ppn=2, backend="gloo", master_addr="h0", master_port=1,
                           hub_offline=True, overrides=(("OMP_NUM_THREADS", "3"), ("FOO", "bar"))))
    assert env["OMP_NUM_THREADS"] == "3" and env["FOO"] == "bar" and env["HF_HUB_OFFLINE"] == "1"
    env = node_env(env_spec(8, 2, "ccl"))
    assert (env["OMP_NUM_THREADS"] == "4" and "HF_HUB_OFFLINE" not in env
            and env["CCL_WORKER_COUNT"] == "1")
    assert node_env(env_spec(2, 4, "gloo"))["OMP_NUM_THREADS"] == "1"


def test_env_pairs() -> None:
    assert parse_env_pairs(("A=1", "B_C=x=y", "D=")) == (("A", "1"), ("B_C", "x=y"), ("D", ""))
    for bad in ("NOEQUALS", "=v", "A B=1"):
        with pytest.raises(ValueError):
            parse_env_pairs((bad,))


def test_hydra_command() -> None:
    launch = plan(spec())
    argv = list(launch.argv)
    assert argv[:5] == ["/opt/mpi/bin/mpiexec.hydra", "-np", "2", "-ppn", "2"]
    i = argv.index("OMP_NUM_THREADS")
    assert argv[i - 1:i + 2] == ["-genv", "OMP_NUM_THREADS", "4"]
    j = argv.index("-m")
    assert argv[j - 1:j + 2] == ["/usr/bin/python3", "-m", "cpudist.rank"]
    assert from_argv(argv[j + 2:]) == spec().train  # the trainer gets exactly our config


def test_torchrun_command() -> None:
    launch = plan(spec(launcher="torchrun"))
    assert "--nproc-per-node" in launch.argv and launch.rank_env["MASTER_PORT"] == "29500"


@pytest.mark.parametrize(("np", "ppn", "message"), [
    (3, 2, "not divisible"),
    (4, 2, "needs 2 nodes but 1 is available"),
    (8, 8, "larger than the 4 slots"),
    (0, 1, "at least 1"),
])
def test_bad_layouts(np: int, ppn: int, message: str) -> None:
    with pytest.raises(BadInput, match=message) as e:
        plan(spec(np=np, ppn=ppn))
    assert e.value.exit_code == 2


def test_oversubscribe_and_multi_host_layout() -> None:
    assert check_layout(8, 8, local_hosts(4), oversubscribe=True) == 1
    hosts = (Host("a", 2), Host("b", 2), Host("c", 2))
    assert check_layout(4, 2, hosts, oversubscribe=False) == 2
