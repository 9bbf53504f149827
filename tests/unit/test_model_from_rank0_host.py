"""torchrun across a hostfile with rank 0 off the head and no shared run folder: the model
(sha256-checked) and --report-to's folders come home from rank 0's host with its rank report
(run/outcome.fetch_from_rank0, run/fetch_model.from_host).

The launcher's --ssh here is a real program that gives each "host" its own copy of the run folder at
the same path (a private mount namespace with that host's folder bound over it, as root) and runs
the command there with /bin/sh: what cpudist sends over ssh runs unchanged, against another
filesystem, without an sshd."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from cpudist.errors import JobFailed
from cpudist.hostfile import Host
from cpudist.run.outcome import fetch_from_rank0

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="the stand-in ssh needs root and unshare(1) for its mount "
                                       "namespace")

SSH = """#!/bin/sh
# ssh HOST COMMAND: COMMAND in HOST's view of the run folder ({views}/HOST bound over {out})
host=$1; shift
mkdir -p "{views}/$host"
exec unshare -m sh -c 'mount --bind "$0" "$1" && exec sh -c "$2"' "{views}/$host" "{out}" "$*"
"""


def _cluster(tmp_path: Path) -> tuple[Path, Path, str]:
    out, views = tmp_path / "run", tmp_path / "views"
    out.mkdir()
    ssh = tmp_path / "ssh"
    ssh.write_text(SSH.format(views=views, out=out))
    ssh.chmod(0o755)
    rank0 = views / "node-b"  # rank 0 ran on the second host: its run folder
    (rank0 / "model").mkdir(parents=True)
    (rank0 / "model" / "model.safetensors").write_bytes(os.urandom(300_000))
    (rank0 / "model" / "config.json").write_text('{"id2label": {"0": "neg", "1": "pos"}}')
    (rank0 / "tensorboard").mkdir()
    (rank0 / "tensorboard" / "events.out.tfevents.1").write_bytes(b"\0events")
    # empty: MLflow needs it there
    (rank0 / "mlruns" / "1" / "abc" / "artifacts").mkdir(parents=True)
    (rank0 / "mlruns" / "1" / "abc" / "meta.yaml").write_text("run_id: abc\n")
    (rank0 / "rank_report.json").write_text('{"run_id": "r1"}\n')
    (rank0 / "steps.jsonl").write_text('{"step": 1}\n')
    (views / "node-c").mkdir(parents=True)  # the third host has nothing of it
    return out, rank0, str(ssh)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_rank0s_model_and_reports_come_home(tmp_path: Path) -> None:
    out, rank0, ssh = _cluster(tmp_path)
    (out / "model").mkdir()
    (out / "model" / "stale.bin").write_text("an earlier run's")  # replaced whole, not merged
    fetch_from_rank0(out, (Host("node-a"), Host("node-c"), Host("node-b")), ssh)
    assert (out / "rank_report.json").read_text() == '{"run_id": "r1"}\n' and (
        out / "steps.jsonl").is_file()
    assert sorted(p.name for p in (out / "model").iterdir()) == ["config.json", "model.safetensors"]
    assert _sha(out / "model" / "model.safetensors") == _sha(rank0 / "model" / "model.safetensors")
    assert (out / "tensorboard" / "events.out.tfevents.1").read_bytes() == b"\0events"
    mlflow_run = out / "mlruns" / "1" / "abc"
    assert (mlflow_run / "artifacts").is_dir() and (mlflow_run / "meta.yaml").is_file()
    assert sorted(p.name for p in out.iterdir()) == ["mlruns", "model", "rank_report.json",
                                                     "steps.jsonl", "tensorboard"]


def test_a_model_damaged_on_the_way_is_refused(tmp_path: Path) -> None:
    """The host's sha256 is of its own copy: bytes that differ after the copy fail the run in one
    line, and nothing half-copied is left in the run folder."""
    out, rank0, ssh = _cluster(tmp_path)
    # This host's sha256sum lies for one file, as a copy damaged on the wire would disagree with the
    # true sum
    fake_bin = rank0 / "bin"
    fake_bin.mkdir()
    (fake_bin / "sha256sum").write_text('#!/bin/sh\n/usr/bin/sha256sum "$@" | sed "s/^./0/"\n')
    (fake_bin / "sha256sum").chmod(0o755)
    ssh_path = Path(ssh)
    ssh_path.write_text(ssh_path.read_text().replace("exec unshare",
                                                     f'PATH="{out}/bin:$PATH" exec unshare'))
    with pytest.raises(JobFailed,
                       match=r"model/\S+ arrived from node-b damaged .*copy it with scp -r"):
        fetch_from_rank0(out, (Host("node-a"), Host("node-b")), ssh)
    assert not (out / "model").exists() and not list(out.glob(".from-rank0*"))
