"""Staging: digests that change exactly with content, and a receive script that unpacks
atomically."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cpudist.config import TrainConfig
from cpudist.errors import BadInput
from cpudist.hostfile import Host, Nodes
from cpudist.launch.batch import BatchOptions
from cpudist.run import stage, stage_scripts
from cpudist.run.agent import parse_status, status_line
from cpudist.run.request import LaunchOptions, RunRequest
from cpudist.waits import wait_until


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_digest_follows_names_and_bytes(tmp_path: Path) -> None:
    a = _tree(tmp_path / "a", {"train.tsv": "x\t1\n", "sub/dev.tsv": "y\t0\n"})
    b = _tree(tmp_path / "b", {"train.tsv": "x\t1\n", "sub/dev.tsv": "y\t0\n"})
    assert stage.digest_of(a) == stage.digest_of(b)  # where a folder lies does not matter
    (b / "sub" / "dev.tsv").write_text("y\t1\n")
    assert stage.digest_of(a) != stage.digest_of(b)
    (b / "sub" / "dev.tsv").rename(b / "dev.tsv")
    c = _tree(tmp_path / "c", {"train.tsv": "x\t1\n", "sub/dev.tsv": "y\t1\n"})
    assert stage.digest_of(b) != stage.digest_of(c)


def test_only_takes_the_named_files(tmp_path: Path) -> None:
    model = _tree(tmp_path / "m",
                  {"vocab.txt": "a\n", "tokenizer.json": "{}", "model.safetensors": "W" * 1000})
    tok = stage.item("tokenizer", model, stage.TOKENIZER_FILES)
    unpacked = Path(tok.remote_dir(str(tmp_path)))
    subprocess.run(["sh", "-c", stage_scripts.receive_script(str(unpacked))],
                   input=stage.tar_bytes(tok), check=True)
    assert sorted(p.name for p in unpacked.iterdir()) == [
        stage_scripts.COMPLETE, stage_scripts.MANIFEST, "tokenizer.json", "vocab.txt"]
    (model / "model.safetensors").write_text("other weights")
    assert stage.item("tokenizer", model, stage.TOKENIZER_FILES).digest == tok.digest


def test_receive_unpacks_a_file_item_beside_its_marker(tmp_path: Path) -> None:
    f = _tree(tmp_path / "d", {"train.jsonl": '{"text": "a", "label": 1}\n'}) / "train.jsonl"
    it = stage.item("data", f)
    home = str(tmp_path / "home")
    subprocess.run(["sh", "-c", stage_scripts.receive_script(it.remote_dir(home))],
                   input=stage.tar_bytes(it), check=True)
    assert Path(it.remote_path(home)).read_text() == f.read_text()
    assert (Path(it.remote_dir(home)) / stage_scripts.COMPLETE).is_file()
    assert not Path(it.remote_dir(home) + ".part").exists()


def test_a_broken_stream_leaves_no_complete_folder(tmp_path: Path) -> None:
    it = stage.item("data", _tree(tmp_path / "d", {"a.txt": "a" * 10000}))
    target = Path(it.remote_dir(str(tmp_path / "home")))
    p = subprocess.run(["sh", "-c", stage_scripts.receive_script(str(target))],
                       input=stage.tar_bytes(it)[:200])
    assert p.returncode != 0 and not (target / stage_scripts.COMPLETE).exists()


def test_fan_out_script_names_every_host_and_folder() -> None:
    script = stage_scripts.fan_out_script(["/h/.cpudist/stage/abc"], ["10.0.0.2", "10.0.0.3"],
                                  "/h/.cpudist/cluster/ssh")
    assert script.count("/h/.cpudist/cluster/ssh 10.0.0.2 ") == 2  # the check, then the copy
    assert script.count(") &") == 2 and script.rstrip().endswith("wait")
    assert "sent 10.0.0.3" in script and "fail 10.0.0.3" in script


def test_job_request_round_trip_and_status_lines() -> None:
    cfg = TrainConfig(task="mrpc", output_dir="/r", text_columns=("a", "b"), max_steps=3)
    launch = LaunchOptions(np=4, ppn=1, launcher="mpich", env=(("A", "1"),), timeout_s=60.0,
                           batch=BatchOptions(partition="cpu", time="10", account=None,
                                              exclusive=True, sbatch_args=("--mem=0",)))
    req = RunRequest(train=cfg, launch=launch, nodes=Nodes((Host("n0"), Host("n1", 4)), "hosts"))
    assert RunRequest.from_json(req.to_json()) == req
    assert parse_status(status_line(status="ok", output_dir="/r")) == {
        "status": "ok", "output_dir": "/r"}
    assert parse_status("[host:0] ordinary rank output") is None


def _receive(script: str, data: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["sh", "-c", script], input=data, capture_output=True)


def test_links_arrive_as_the_bytes_they_point_to(tmp_path: Path) -> None:
    """A Hugging Face cache snapshot (files linking to ../../blobs/...), a link inside the folder
    and an absolute one: every node gets regular files with the linked bytes, never a link (dangling
    there, or reading the node's own file at that path)."""
    _tree(tmp_path / "cache" / "blobs", {"b1": "weights", "b2": "{\"vocab\": 1}"})
    outside = _tree(tmp_path / "elsewhere", {"notes.txt": "laptop's own notes"}) / "notes.txt"
    snap = tmp_path / "cache" / "snapshots" / "abc"
    (snap / "sub").mkdir(parents=True)
    (snap / "model.safetensors").symlink_to("../../blobs/b1")
    (snap / "sub" / "tokenizer.json").symlink_to("../../../blobs/b2")
    (snap / "same.json").symlink_to("sub/tokenizer.json")
    (snap / "notes.txt").symlink_to(outside)
    (snap / "config.json").write_text("{}")
    it = stage.item("model", snap)
    unpacked = Path(it.remote_dir(str(tmp_path / "home")))
    r = _receive(stage_scripts.receive_script(str(unpacked)), stage.tar_bytes(it))
    assert r.returncode == 0, r.stderr
    got = {p.relative_to(unpacked).as_posix(): p for p in unpacked.rglob("*")
           if p.name not in (stage_scripts.COMPLETE, stage_scripts.MANIFEST)}
    assert sorted(got) == ["config.json", "model.safetensors", "notes.txt", "same.json", "sub",
                           "sub/tokenizer.json"]
    assert not [p for p in got.values() if p.is_symlink()]
    assert (got["model.safetensors"].read_text() == "weights"
            and got["same.json"].read_text() == '{"vocab": 1}')
    assert got["notes.txt"].read_text() == "laptop's own notes"
    # What arrived is the snapshot's content: a copy of it with its links followed has the same
    # digest.
    copy = _tree(tmp_path / "copy", {n: p.read_text() for n, p in got.items() if p.is_file()})
    assert stage.digest_of(copy) == it.digest
    # a tokenizer's named files: links too
    tok = stage.item("tokenizer", snap, stage.TOKENIZER_FILES)
    assert b"weights" not in stage.tar_bytes(tok)


def test_a_link_that_cannot_be_staged_is_one_line_naming_it(tmp_path: Path) -> None:
    folder = _tree(tmp_path / "d", {"train.tsv": "x\t1\n"})
    (folder / "dev.tsv").symlink_to(tmp_path / "gone.tsv")
    with pytest.raises(BadInput,
                       match=r"dev.tsv links to .*gone.tsv, which does not exist.*cp -rL"):
        stage.item("data", folder)
    (folder / "dev.tsv").unlink()
    (folder / "more").symlink_to(_tree(tmp_path / "other", {"a.tsv": "y\t0\n"}))
    with pytest.raises(BadInput,
                       match=r"more links to the folder .*other: staging does not follow.*cp -rL"):
        stage.item("data", folder)


def test_two_runs_staging_one_item_at_once_both_succeed(tmp_path: Path) -> None:
    """The second run's stager starts while the first is halfway through its stream: each unpacks
    its own copy, both end 0, and the folder is complete with the item's bytes (one shared .part
    folder failed one of them)."""
    src = tmp_path / "d"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(3 << 20))
    (src / "small.txt").write_text("x")
    it = stage.item("data", src)
    data = stage.tar_bytes(it)
    target = Path(it.remote_dir(str(tmp_path / "home")))
    script = stage_scripts.receive_script(str(target))
    first = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    assert first.stdin is not None
    first.stdin.write(data[:len(data) // 2])
    first.stdin.flush()
    wait_until(lambda: True
               if any(p.is_file() for p in target.parent.glob(target.name + ".part*/*")) else None,
               "the first unpack to begin", 30, 0.02)
    second = _receive(script, data)
    first.stdin.write(data[len(data) // 2:])
    first.stdin.close()
    assert first.wait(60) == 0 and second.returncode == 0, (
        first.stderr.read() if first.stderr else b"", second)
    assert (target / stage_scripts.COMPLETE).is_file() and (target / "big.bin").read_bytes() == (
        src / "big.bin").read_bytes()
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]  # no copy left behind


def _staged(d: str) -> bool:
    return subprocess.run(["sh", "-c", stage_scripts.check_script(d)]).returncode == 0


def test_arrival_is_checked_against_the_digest(tmp_path: Path) -> None:
    """The receiving side refuses bytes that do not match the folder's digest (damaged on the way,
    or a laptop file changed between its digest and its sending): nothing is marked complete, the
    error names the folder."""
    src = _tree(tmp_path / "d", {"train.tsv": "x\t1\n" * 1000, "dev.tsv": "y\t0\n"})
    it = stage.item("data", src)
    home = str(tmp_path / "home")
    # same size, other bytes, after the digest was taken
    (src / "train.tsv").write_text("z\t0\n" * 1000)
    r = _receive(stage_scripts.receive_script(it.remote_dir(home)), stage.tar_bytes(it))
    assert r.returncode == 3 and b"does not match its digest" in r.stderr, r
    assert not Path(it.remote_dir(home)).exists()
    assert not list(Path(home, ".cpudist", "stage").iterdir())
    good = stage.item("data", src)
    assert _receive(stage_scripts.receive_script(good.remote_dir(home)),
                    stage.tar_bytes(good)).returncode == 0
    assert _staged(good.remote_dir(home))


@pytest.mark.parametrize("damage",
                         ["truncate", "edit-keeping-size-and-mtime", "remove", "remove-manifest"])
def test_reuse_detects_an_altered_staging_and_staging_again_repairs_it(tmp_path: Path,
                                                                       damage: str) -> None:
    """A `.complete` marker alone is not trusted: a staged file truncated, edited in place (its size
    and mtime put back) or removed makes the folder missing (missing_script), and a new receive
    replaces it with the item."""
    src = _tree(tmp_path / "d", {"train.tsv": "x\t1\n" * 1000, "sub/dev.tsv": "y\t0\n"})
    it = stage.item("data", src)
    d = it.remote_dir(str(tmp_path / "home"))
    assert _receive(stage_scripts.receive_script(d), stage.tar_bytes(it)).returncode == 0
    assert subprocess.run(["sh", "-c", stage_scripts.missing_script([d])], capture_output=True,
                          text=True).stdout == ""
    f = Path(d) / "train.tsv"
    st = f.stat()
    if damage == "truncate":
        os.truncate(f, 10)
    elif damage == "remove":
        f.unlink()
    elif damage == "remove-manifest":
        (Path(d) / stage_scripts.MANIFEST).unlink()
    else:
        f.write_text("X" + f.read_text()[1:])
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert not _staged(d)
    assert subprocess.run(["sh", "-c", stage_scripts.missing_script([d])], capture_output=True,
                          text=True).stdout == d + "\n"
    r = _receive(stage_scripts.receive_script(d), stage.tar_bytes(it))
    assert r.returncode == 0, r.stderr
    assert _staged(d) and f.read_text() == (src / "train.tsv").read_text()
    assert sorted(p.name for p in Path(d).parent.iterdir()) == [Path(d).name]


def test_the_archive_streams_in_chunks(tmp_path: Path) -> None:
    """tar_chunks never holds a file whole: a 6 MiB file comes in pieces of about a CHUNK, and they
    unpack."""
    src = tmp_path / "d"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(6 << 20))
    it = stage.item("data", src)
    chunks = list(stage.tar_chunks(it))
    assert len(chunks) >= 6 and max(len(c) for c in chunks) <= 2 * stage.CHUNK
    assert _receive(stage_scripts.receive_script(it.remote_dir(str(tmp_path))),
                    b"".join(chunks)).returncode == 0
    assert Path(it.remote_dir(str(tmp_path)),
                "big.bin").read_bytes() == (src / "big.bin").read_bytes()


def test_a_moved_model_keeps_the_absolute_path_it_was_staged_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model named relative to where `run` was typed: model_given is that folder's absolute path
    (an adapter names its base there, and loads where the model comes home); a model_given from an
    earlier staging stays."""
    _tree(tmp_path / "my-bert", {"config.json": "{}"})
    monkeypatch.chdir(tmp_path)
    staged = [("model", stage.item("model", Path("my-bert"))),
              ("data_dir", stage.item("data", tmp_path))]
    moved = stage.moved_fields("", staged, "/home/u")
    assert moved["model_given"] == str(tmp_path.resolve() / "my-bert")
    assert moved["model"].startswith("/home/u/") and moved["data_dir"].startswith("/home/u/")
    # the config's stays
    assert "model_given" not in stage.moved_fields("/laptop/my-bert", staged, "/home/u")
    assert "model_given" not in stage.moved_fields("", staged[1:], "/home/u")
