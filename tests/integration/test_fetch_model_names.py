"""A model fetched from the head (run/fetch_model.py) over a real sshd on a namespace host: a file
whose name sha256sum must escape (a backslash, a line break) is refused in one line that names it,
and a refused fetch leaves no model.tmp/ behind with the bytes it refused."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpudist.errors import JobFailed
from cpudist.run.fetch_model import fetch_model
from cpudist.ssh.client import KnownHosts, Remote, Target
from tests.harness.netns import NetnsCluster, missing_requirements

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(missing_requirements() is not None,
                                 reason=str(missing_requirements()))]


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsCluster]:
    c = NetnsCluster(1, tmp_path_factory.mktemp("fetch-names"), prefix=f"cfn{os.getpid() % 10000}",
                     # this process is the laptop: it reaches the head through the gateway
                     gateway="198.18.0.1")
    c.up()
    try:
        yield c
    finally:
        c.down()


class Garbled(Remote):
    """The head's link, delivering other bytes than the head summed for the last file it copies."""

    def fetch(self, remote_path: str, local_path: Path) -> bool:
        came = super().fetch(remote_path, local_path)
        if remote_path.endswith("model.safetensors"):
            local_path.write_bytes(os.urandom(local_path.stat().st_size))
        return came


def _model(folder: Path, odd: str | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(os.urandom(100_000))
    if odd is not None:
        (folder / odd).write_text("odd")
    return folder


@pytest.mark.parametrize("odd", ["tok\\enizer.json", "vocab\n.txt"],
                         ids=["backslash", "line-break"])
def test_a_file_name_sha256sum_escapes_is_refused_by_name(head: NetnsCluster, tmp_path: Path,
                                                          odd: str) -> None:
    on_head = _model(tmp_path / "head" / "model", odd)  # the namespace host shares this filesystem
    local = tmp_path / "laptop" / "model"
    with Remote(Target(head.addr(0), "root", 22, str(head.user_key)),
                KnownHosts(tmp_path / "kh")) as link, \
            pytest.raises(JobFailed) as refused:
        fetch_model(link, str(on_head), local, lambda line: None)
    assert repr(odd) in refused.value.message and str(
        on_head) in refused.value.message, refused.value.message
    assert not local.exists() and not local.with_name("model.tmp").exists()


def test_a_refused_fetch_leaves_no_temporary_folder(head: NetnsCluster, tmp_path: Path) -> None:
    on_head = _model(tmp_path / "head" / "model")
    local = tmp_path / "laptop" / "model"
    with Garbled(Target(head.addr(0), "root", 22, str(head.user_key)),
                 KnownHosts(tmp_path / "kh")) as link, \
            pytest.raises(JobFailed,
                          match=r"model/model\.safetensors arrived from the head damaged"):
        fetch_model(link, str(on_head), local, lambda line: None)
    assert not local.exists() and not local.with_name("model.tmp").exists()
    assert sorted(p.name for p in local.parent.iterdir()) == []
