"""A run's identity keeps work (issue 22, part 4): a reused --output-dir or S3 prefix, and a resume
from an older step with --keep-checkpoints 1, lose no checkpoint of the run at hand, and no run
resumes another's.

Each was reproduced on b21d3f9: the second run's checkpoints were deleted right after each write
(rotation and S3 prune kept the highest step numbers, the first run's) and --resume auto went on
with the first run's.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from cpudist.train import checkpoint_meta as ckpt
from tests.harness.s3 import FAKE_CREDENTIALS, S3Server
from tests.integration.helpers import cpudist
from tests.integration.test_resume import common, sigterm_ranks_at, steps

pytestmark = pytest.mark.slow
# A laptop's runs into folders of the same name (a head folder each, a failed one fetching no
# result) are checked on test_remote_onprem.py's site, with one of the runs it makes there anyway.


def small(shared_data: Path) -> list[str]:
    """test_resume's settings with fewer rows: what is checked here is which run the checkpoints
    belong to."""
    return [*common(shared_data), "--max-train-samples", "64", "--max-eval-samples", "32"]


def run_json(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "run.json").read_text())
    return data


def owners(folder: Path) -> dict[str, str | None]:
    return {p.name: ckpt.owner(p) for p in ckpt.complete_checkpoints(folder)}


def test_a_reused_output_dir_refuses_a_fresh_run_and_resume_auto_goes_on_with_its_run(
    shared_data: Path,
     tmp_path: Path) -> None:
    out = tmp_path / "reuse"
    args = [*small(shared_data), "--np", "2", "--max-steps", "20", "--output-dir", str(out),
            "--checkpoint-every", "2"]
    stopped = sigterm_ranks_at(args, out, 3, tmp_path)
    assert stopped.returncode == 75, stopped.stderr
    first = run_json(out)
    assert (first["state"] == "preempted" and first["ended_at"]
            and "stopped at step" in first["message"])
    kept = owners(out / "checkpoints")
    assert kept and set(kept.values()) == {first["id"]}, kept

    # The second run: same folder, other lr, no --resume. It must not start (and so delete
    # nothing).
    second = cpudist("run", *args, "--lr", "5e-3")
    assert second.returncode == 2, second.stderr
    line = second.stderr.strip().splitlines()[-1]
    assert f"holds run {first['id']} ({first['state']})" in line, second.stderr
    assert "--resume auto" in line and "--overwrite-output-dir" in line
    told = cpudist("run", *args, "--lr", "5e-3", "--overwrite-output-dir")  # checkpoints: kept
    assert told.returncode == 2, told.stderr
    assert f"holds checkpoints of another run ({first['id']}" in told.stderr
    assert owners(out / "checkpoints") == kept and run_json(out) == first

    resumed = cpudist("run", *args, "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr
    step = max(ckpt.step_of(n) or 0 for n in kept)
    assert f"resuming from {out}/checkpoints/step-{step:06d}" in resumed.stderr
    result = json.loads((out / "result.json").read_text())
    assert (result["run_id"] == first["id"] and result["resumed_from_step"] == step
            and result["parts"] == 2)
    done = run_json(out)
    assert done["id"] == first["id"] and done["state"] == "finished" and done["parts"] == 2
    assert done["started_at"] == first["started_at"] and done["metrics"] == result["metrics"]
    assert set(owners(out / "checkpoints").values()) == {first["id"]}


@pytest.fixture
def s3_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto's S3 over HTTP, with a bucket `ckpt`; the ranks find it through the environment they
    inherit."""
    with S3Server() as server:
        for key, value in {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL_S3": server.url,
                           "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
                           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}.items():
            monkeypatch.setenv(key, value)
        boto3.client("s3", endpoint_url=server.url).create_bucket(Bucket="ckpt")
        yield server.url


def test_a_reused_s3_prefix_keeps_the_new_runs_uploads_and_resumes_it(shared_data: Path,
                                                                      tmp_path: Path,
                                                                      s3_env: str) -> None:
    prefix = "s3://ckpt/runs/mrpc"  # the README's per-task prefix, shared by every run of the task
    base = [*small(shared_data), "--max-steps", "20", "--checkpoint-every", "5", "--checkpoint-s3",
            prefix, "--no-eval"]
    first = cpudist("run", *base, "--np", "1", "--output-dir", tmp_path / "a")
    assert first.returncode == 0, first.stderr
    first_id = run_json(tmp_path / "a")["id"]

    out = tmp_path / "b"
    stopped = sigterm_ranks_at([*base, "--np", "2", "--output-dir", str(out), "--lr", "5e-3"], out,
                               3, tmp_path)
    assert stopped.returncode == 75, stopped.stderr
    step = json.loads((out / "preempted.json").read_text())["step"]
    second_id = run_json(out)["id"]
    s3 = boto3.client("s3", endpoint_url=s3_env)
    listed = {o["Key"]
              for o in s3.list_objects_v2(Bucket="ckpt", Prefix="runs/mrpc/").get("Contents", [])}
    # pruned at once on HEAD
    assert f"runs/mrpc/{second_id}/step-{step:06d}/COMPLETE" in listed, sorted(listed)
    assert {f"runs/mrpc/{first_id}/step-{s:06d}/COMPLETE" for s in (15, 20)} <= listed

    # the head node went, and its disk with it: run.json too, so the S3 copy says which run
    shutil.rmtree(out)
    resumed = cpudist("run", *base, "--np", "2", "--output-dir", out, "--lr", "5e-3", "--resume",
                      "auto")
    assert resumed.returncode == 0, resumed.stderr
    assert f"fetched step-{step:06d} from {prefix}" in resumed.stderr
    result = json.loads((out / "result.json").read_text())
    assert result["run_id"] == second_id and result["resumed_from_step"] == step
    assert [s["step"] for s in steps(out)] == list(range(step + 1, 21))
    assert run_json(out)["id"] == second_id
    after = {o["Key"]
             for o in s3.list_objects_v2(Bucket="ckpt",
                                         Prefix=f"runs/mrpc/{first_id}/").get("Contents", [])}
    # the first run's copy untouched
    assert after == {k for k in listed if k.startswith(f"runs/mrpc/{first_id}/")}


def test_a_resume_from_an_older_step_with_keep_1_leaves_a_usable_checkpoint(shared_data: Path,
                                                                            tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [*small(shared_data), "--np", "1", "--max-steps", "20", "--output-dir", str(out),
            "--no-eval"]
    first = cpudist("run", *args, "--checkpoint-every", "5", "--keep-checkpoints", "4")
    assert first.returncode == 0, first.stderr
    run_id = run_json(out)["id"]
    assert list(owners(out / "checkpoints")) == [f"step-{s:06d}" for s in (20, 15, 10, 5)]

    again = cpudist("run", *args, "--checkpoint-every", "8", "--keep-checkpoints", "1",
                    "--resume", out / "checkpoints" / "step-000005")
    assert again.returncode == 0, again.stderr
    # on HEAD: only the old timeline's step-20
    assert owners(out / "checkpoints") == {"step-000016": run_id}
    newest = out / "checkpoints" / "step-000016"
    assert ckpt.damage(newest) is None and ckpt.read_meta(newest).parts == 2
    [aside] = (out / "checkpoints").glob("abandoned-*")
    assert sorted(p.name for p in aside.iterdir()) == ["step-000010", "step-000015", "step-000020"]
    assert f"moved to {aside}" in again.stderr
    assert json.loads((out / "result.json").read_text())["run_id"] == run_id


def test_run_json_says_failed_with_the_reason(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    failed = cpudist("run", *small(shared_data), "--np", "1", "--max-steps", "100000",
                     "--output-dir", out, "--timeout", "3", "--no-eval")
    assert failed.returncode == 1, failed.stderr
    state = run_json(out)
    assert (state["state"] == "failed" and "ran past --timeout 3s" in state["message"]
            and state["ended_at"])
    assert not (out / "result.json").exists()
    assert os.path.basename(state["run_dir"]) == "run"


def files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_a_used_folder_is_refused_and_a_later_run_replaces_it_only_when_told(
        shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "reuse"
    args = [*small(shared_data), "--np", "1", "--max-steps", "4", "--output-dir", str(out)]
    first = cpudist("run", *args)
    assert first.returncode == 0, first.stderr
    a, kept = run_json(out), files(out)
    again = cpudist("run", *args, "--lr", "5e-3")
    assert again.returncode == 2, again.stderr
    [line] = again.stderr.strip().splitlines()
    assert line == (f"Error: --output-dir {out} is not empty: it holds run {a['id']} (finished). "
                    "Give this run another --output-dir, or pass --overwrite-output-dir to write "
                    "it there")
    assert files(out) == kept

    (out / "notes.txt").write_text("the user's")
    told = cpudist("run", *args, "--lr", "5e-3", "--overwrite_output_dir")  # HF's spelling
    assert told.returncode == 0, told.stderr
    b = run_json(out)
    assert b["id"] != a["id"] and b["parts"] == 1 and b["started_at"] >= a["ended_at"]
    assert json.loads((out / "result.json").read_text())["run_id"] == b["id"]
    assert (out / "notes.txt").read_text() == "the user's"
    assert f"{a['id']}" not in (out / "cpudist.log").read_text()
    old = cpudist("logs", a["id"])  # its ledger line points here: it says what became of the folder
    assert old.returncode == 2 and f"folder {out} holds run {b['id']} now" in old.stderr, old.stderr
    assert f"`cpudist logs {b['id']}` shows the run there now" in old.stderr
    new = cpudist("logs", b["id"])
    assert new.returncode == 0 and "model saved" in new.stdout, new.stderr


@pytest.fixture(scope="module")
def used(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run's folder (no checkpoints: nothing else stops a run there) to copy."""
    out = tmp_path_factory.mktemp("used") / "run"
    done = cpudist("run", *small(shared_data), "--np", "1", "--max-steps", "2", "--output-dir", out)
    assert done.returncode == 0, done.stderr
    return out


ROUTES = {"here": ["run"], "hostfile": ["run", "--hostfile", "{hostfile}", "--ppn", "1"],
          "laptop": ["run", "--hostfile", "{hostfile}", "--head", "198.18.0.254", "--ppn", "1"],
          "slurm": ["run", "--launcher", "slurm"],
          "slurm-detach": ["run", "--launcher", "slurm", "--detach"], "launch": ["launch"]}


@pytest.mark.parametrize("route", ROUTES)
def test_every_route_refuses_a_used_folder_before_it_starts(used: Path, shared_data: Path,
                                                            tmp_path: Path, route: str) -> None:
    out = tmp_path / "run"
    shutil.copytree(used, out)
    kept = files(out)
    (tmp_path / "hosts").write_text("localhost\n")
    words = [w.replace("{hostfile}", str(tmp_path / "hosts")) for w in ROUTES[route]]
    rest = ["--", sys.executable, "-c", "pass"] if route == "launch" else small(shared_data)
    r = cpudist(*words, "--output-dir", out, *rest, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    held = run_json(out)["id"]
    assert f"--output-dir {out} is not empty: it holds run {held} (finished)" in r.stderr
    assert files(out) == kept


def test_overwrite_beside_the_users_hostfile_is_refused_and_writes_nothing(shared_data: Path,
                                                                         tmp_path: Path) -> None:
    """--output-dir . in the folder of the user's ./hostfile: the run writes its own hostfile."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# my cluster: this machine for now\nlocalhost\n")
    r = cpudist("run", *small(shared_data), "--np", "1", "--ppn", "1", "--max-steps", "2",
                "--hostfile", hostfile, "--output-dir", tmp_path, "--overwrite-output-dir")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"--output-dir {tmp_path} holds hostfile, which this run would write over" in r.stderr
    assert hostfile.read_text() == "# my cluster: this machine for now\nlocalhost\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hostfile"]


def test_a_resume_refuses_a_run_id_that_is_a_path_in_the_checkpoints_meta(shared_data: Path,
                                                                          tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = cpudist("run", *small(shared_data), "--np", "1", "--max-steps", "4",
                   "--checkpoint-every", "2", "--output-dir", out)
    assert done.returncode == 0, done.stderr
    for meta in out.glob("checkpoints/step-*/meta.json"):
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "run_id": "x/../../../escape"}))
    r = cpudist("run", *small(shared_data), "--np", "1", "--max-steps", "6", "--resume", "auto",
                "--output-dir", out)
    assert r.returncode == 2, r.stdout + r.stderr
    [line] = r.stderr.strip().splitlines()
    assert "step-000004/meta.json names run id 'x/../../../escape', which is not a run id" in line
    assert not (tmp_path / "escape").exists() and not list(out.glob("checkpoints/step-000006"))
