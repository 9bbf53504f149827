"""The nodes are read once: run/where turns --hostfile into a Nodes value, the request carries it
(across SSH as JSON too), and staging and the launch spec read the request, never the file again."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpudist.config import TrainConfig
from cpudist.errors import BadInput
from cpudist.hostfile import Host, Nodes
from cpudist.run.payloads import spec_of
from cpudist.run.request import LaunchOptions, RunRequest
from cpudist.run.stage_here import staging_plan
from cpudist.run.where import Route, where_for


def test_the_hostfile_is_read_once_and_the_request_carries_its_nodes(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n127.0.0.2:2  # the second node\n")
    where = where_for(Route(hostfile=hostfile), nodes=2, ppn_given=True, launcher="torchrun")
    assert where.kind == "hostfile"
    assert where.nodes == Nodes((Host("localhost", 2), Host("127.0.0.2", 2)), str(hostfile))
    cfg = TrainConfig(task="synthetic", output_dir=str(tmp_path / "run"), model="tiny")
    request = RunRequest(train=cfg, launch=LaunchOptions(np=2, ppn=1, launcher="torchrun"),
                         nodes=where.nodes)
    # nothing after where_for may read it: a changed or removed file cannot split the run's view
    hostfile.unlink()
    assert RunRequest.from_json(request.to_json()) == request
    # synthetic rows: nothing to stage, and no file read to find that out
    assert staging_plan(request) == []
    spec = spec_of(request, dry_run=True)
    assert [h.name for h in spec.hosts] == ["localhost", "127.0.0.2"]


def test_a_missing_hostfile_is_refused_where_it_is_read(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="hostfile not found"):
        where_for(Route(hostfile=tmp_path / "nope"), nodes=2, ppn_given=True, launcher="torchrun")


def test_the_launch_names_where_its_nodes_came_from(tmp_path: Path) -> None:
    """The head's own check reads the nodes' source, not a file: a first host that is not this
    machine."""
    nodes = Nodes((Host("198.18.0.250"), Host("localhost")), "hosts.txt")
    cfg = TrainConfig(task="synthetic", output_dir=str(tmp_path / "run"), model="tiny")
    request = RunRequest(train=cfg, launch=LaunchOptions(np=2, ppn=1, launcher="torchrun"),
                         nodes=nodes)
    with pytest.raises(BadInput, match=r"the first host of hosts\.txt"):
        spec_of(request, dry_run=True)
