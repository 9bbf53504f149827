"""--elastic's launch: each node's command and the head's Lighthouse as data, where it is refused,
and the executor that lets a node leave and starts it again, run on real local processes (`sh -c`
lines standing for the nodes' ssh sessions)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from cpudist.config import TrainConfig
from cpudist.elastic_flags import check_launch
from cpudist.errors import BadInput
from cpudist.hostfile import Host
from cpudist.launch import elastic
from cpudist.launch.kinds import plan
from cpudist.launch.spec import Launch
from cpudist.wire import events
from tests.unit.specs import run_spec

HOSTS = tuple(Host(f"n{i}") for i in range(3))
# runs until its stdin closes, as a tether does
UNTIL_STOPPED = ("sh", "-c", "cat >/dev/null")


def spec(**kw: Any) -> Any:
    train = TrainConfig(task="mrpc", output_dir="/r/run", model="tiny", elastic=True)
    base: dict[str, Any] = dict(train=train, np=3, ppn=1, hosts=HOSTS, launcher="torchrun",
                                launcher_path="/py/bin/python", python="/py/bin/python",
                                master_addr="10.0.0.1", master_port=29500, physical_cores=4,
                                hostfile="/r/run/hostfile", ssh="/s/ssh", cwd="/work")
    return run_spec(**{**base, **kw})


def variables(line: str) -> dict[str, str]:
    """The VAR=value words of a host's shell line (after `exec env`)."""
    words = shlex.split(line.split("exec env ", 1)[1])
    return dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))


def test_each_node_is_a_world_of_one_that_finds_the_lighthouse_on_the_head() -> None:
    launch = plan(spec())
    assert launch.lighthouse is not None and launch.lighthouse[0] == "n0"
    house = launch.lighthouse[1][2]
    assert "/py/bin/torchft_lighthouse --bind '[::]:29500' --min_replicas 1" in house
    assert [host for host, _ in launch.per_host] == ["n0", "n1", "n2"]
    head, second = launch.per_host[0][1], launch.per_host[1][1]
    assert head[:2] == ("sh", "-c") and second[:2] == ("/s/ssh", "n1")
    for i, (host, argv) in enumerate(launch.per_host):
        env = variables(argv[-1])
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("0", "1", "1")
        address = "10.0.0.1" if i == 0 else host  # the head's toward the nodes
        assert env["MASTER_ADDR"] == env["CPUDIST_ADVERTISE"] == address
        assert env["MASTER_PORT"] == str(29501 + i)
        assert env["TORCHFT_LIGHTHOUSE"] == "http://10.0.0.1:29500"
        assert env["CPUDIST_REPLICA_ID"] == f"node{i}" and env["CPUDIST_REPLICAS"] == "3"
        folder = "/r/run" if i == 0 else f"/r/run/nodes/node{i}"
        assert f"--output-dir={folder} " in argv[-1] and "--elastic=1" in argv[-1]
        assert "cpudist.launch.tether" in argv[-1] and "torch.distributed.run" not in argv[-1]
    shown = launch.shell()
    assert shown.startswith("# n0: the Lighthouse\n") and shown.count("\n# n") == 3


@pytest.mark.parametrize(("launcher", "ppn", "hostfile", "said"), [
    ("mpich", 1, True, "--elastic with --launcher mpich: mpirun ends every rank when one ends"),
    ("slurm", 1, True, "a Slurm step ends with its first lost node"),
    ("torchrun", 1, False, "--elastic needs the nodes: a hostfile"),
    ("torchrun", 2, True, "--elastic runs one rank per node (given --ppn 2)"),
])
def test_where_it_cannot_run_it_says_why_in_one_line(launcher: str, ppn: int, hostfile: bool,
                                                     said: str) -> None:
    with pytest.raises(BadInput) as e:
        check_launch(launcher, ppn, hostfile)
    assert said in e.value.message and "\n" not in e.value.message


def node_script(tmp_path: Path, name: str, first: str, then: str) -> tuple[str, ...]:
    """A node's command: `first` on its first start, `then` on every later one."""
    mark = tmp_path / f"{name}.started"
    return ("sh", "-c", f"if [ -e {mark} ]; then {then}; else touch {mark}; {first}; fi")


def run(launch: Launch, **kw: Any) -> tuple[Any, list[str], list[dict[str, Any]]]:
    lines: list[str] = []
    seen: list[dict[str, Any]] = []
    outcome = elastic.execute_elastic(launch, {"PATH": "/usr/bin:/bin"}, seen.append, lines.append,
                                      lambda s: lines.append(f"[cpudist] {s}"), **kw)
    return outcome, lines, seen


def test_a_node_that_leaves_is_started_again_and_the_run_ends_with_the_head(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """n1 fails at once, then finishes on its second start; the head (printing an event) trains
    until n1 is back; the Lighthouse (a sleep) is stopped once every node ended."""
    monkeypatch.setattr(elastic, "RETRY_S", 0.2)
    progress = shlex.quote(events.line(events.PROGRESS, step=1, total=1, loss=0.5,
                                       samples_per_s=1.0))
    back = tmp_path / "n1.back"
    head = ("sh", "-c", f"echo {progress}; while [ ! -e {back} ]; do sleep 0.1; done")
    n1 = node_script(tmp_path, "n1", "echo lost; exit 3",
                     f"echo {progress}; echo back; touch {back}")
    launch = Launch(head, {}, per_host=(("n0", head), ("n1", n1)),
                    lighthouse=("n0", UNTIL_STOPPED))
    outcome, lines, seen = run(launch, timeout_s=60)
    assert outcome.returncode == 0 and not outcome.timed_out, lines
    assert "[cpudist] n1 left the run (exit 3); the other nodes go on" in "\n".join(lines)
    assert "[cpudist] starting n1 again" in "\n".join(lines) and "[n1] back" in lines
    assert len(seen) == 1  # the head's event only: n1's is a copy of the same step


def test_every_node_lost_at_once_ends_the_run_and_the_lighthouse(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(elastic, "RETRY_S", 0.2)
    lost = ("sh", "-c", "exit 137")
    launch = Launch(lost, {}, per_host=(("n0", lost), ("n1", lost)),
                    lighthouse=("n0", UNTIL_STOPPED))
    outcome, lines, _ = run(launch, timeout_s=60)
    assert outcome.returncode == 137 and outcome.failed_host == "n0", lines
    assert any("every node left the run at once" in line for line in lines), lines


def test_the_lighthouse_ending_ends_the_run(tmp_path: Path) -> None:
    """The head's node lost takes its Lighthouse: no quorum is possible, so the run stops."""
    launch = Launch(UNTIL_STOPPED, {}, per_host=(("n0", UNTIL_STOPPED), ("n1", UNTIL_STOPPED)),
                    lighthouse=("n0", ("sh", "-c", "sleep 0.5; exit 1")))
    outcome, lines, _ = run(launch, timeout_s=60)
    assert outcome.returncode == 1 and outcome.failed_host == "n0's Lighthouse", lines
    assert any("the Lighthouse on the head ended" in line for line in lines), lines


def test_a_node_still_running_after_the_last_step_is_stopped_after_a_grace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node that joined too late to heal would find no peer left and train the whole run again
    alone: once the head has trained the last step, the others get FINISH_GRACE_S to end."""
    monkeypatch.setattr(elastic, "FINISH_GRACE_S", 0.3)
    done = ("sh", "-c", "exit 0")
    launch = Launch(done, {}, per_host=(("n0", done), ("n1", UNTIL_STOPPED)),
                    lighthouse=("n0", UNTIL_STOPPED))
    outcome, lines, _ = run(launch, timeout_s=60)
    assert outcome.returncode == 0 and not outcome.timed_out, lines
    assert "[cpudist] the last step is in: stopping n1, still running after it" in lines


def test_a_node_not_in_the_last_quorum_is_stopped_once_the_last_step_is_in(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node started again too late to join: the head's last quorum did not hold it (its NODES
    event names the members), so once the head has trained the last step it is stopped then, not
    after the grace meant for nodes still ending their last step."""
    monkeypatch.setattr(elastic, "FINISH_GRACE_S", 600.0)  # past the run's timeout: it would expire
    members = shlex.quote(events.line(events.NODES, step=3, nodes=1, planned=2, members=["node0"],
                                      left=["node1"], joined=[]))
    done = ("sh", "-c", f"echo {members}; exit 0")
    launch = Launch(done, {}, per_host=(("n0", done), ("n1", UNTIL_STOPPED)),
                    lighthouse=("n0", UNTIL_STOPPED))
    outcome, lines, seen = run(launch, timeout_s=60)
    assert outcome.returncode == 0 and not outcome.timed_out, lines
    assert ("[cpudist] the last step is in: stopping n1, which had not joined the last quorum"
            in lines), lines
    assert [e["members"] for e in seen] == [["node0"]]
