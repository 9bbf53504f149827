"""Staging: digests that change exactly with content, and a receive script that unpacks atomically."""

from __future__ import annotations

import subprocess
from pathlib import Path

from cpudist.config import TrainConfig
from cpudist.launch.slurm import SlurmOptions
from cpudist.run import stage
from cpudist.run.agent import parse_status, status_line
from cpudist.run.request import LaunchOptions, RunRequest


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
    model = _tree(tmp_path / "m", {"vocab.txt": "a\n", "tokenizer.json": "{}", "model.safetensors": "W" * 1000})
    tok = stage.item("tokenizer", model, stage.TOKENIZER_FILES)
    unpacked = tmp_path / "out"
    subprocess.run(["sh", "-c", stage.receive_script(str(unpacked))], input=stage.tar_bytes(tok), check=True)
    assert sorted(p.name for p in unpacked.iterdir()) == [stage.COMPLETE, "tokenizer.json", "vocab.txt"]
    (model / "model.safetensors").write_text("other weights")
    assert stage.item("tokenizer", model, stage.TOKENIZER_FILES).digest == tok.digest


def test_receive_unpacks_a_file_item_beside_its_marker(tmp_path: Path) -> None:
    f = _tree(tmp_path / "d", {"train.jsonl": '{"text": "a", "label": 1}\n'}) / "train.jsonl"
    it = stage.item("data", f)
    home = str(tmp_path / "home")
    subprocess.run(["sh", "-c", stage.receive_script(it.remote_dir(home))], input=stage.tar_bytes(it), check=True)
    assert Path(it.remote_path(home)).read_text() == f.read_text()
    assert (Path(it.remote_dir(home)) / stage.COMPLETE).is_file()
    assert not Path(it.remote_dir(home) + ".part").exists()


def test_a_broken_stream_leaves_no_complete_folder(tmp_path: Path) -> None:
    it = stage.item("data", _tree(tmp_path / "d", {"a.txt": "a" * 10000}))
    target = tmp_path / "home" / "x"
    p = subprocess.run(["sh", "-c", stage.receive_script(str(target))], input=stage.tar_bytes(it)[:200])
    assert p.returncode != 0 and not (target / stage.COMPLETE).exists()


def test_fan_out_script_names_every_host_and_folder() -> None:
    script = stage.fan_out_script(["/h/.cpudist/stage/abc"], ["10.0.0.2", "10.0.0.3"], "/h/.cpudist/cluster/ssh")
    assert script.count("/h/.cpudist/cluster/ssh 10.0.0.2 test -e") == 1
    assert script.count(") &") == 2 and script.rstrip().endswith("wait")
    assert "sent 10.0.0.3" in script and "fail 10.0.0.3" in script


def test_job_request_round_trip_and_status_lines() -> None:
    cfg = TrainConfig(task="mrpc", output_dir="/r", text_columns=("a", "b"), max_steps=3)
    launch = LaunchOptions(4, 1, "mpich", env=(("A", "1"),), timeout_s=60.0,
                           slurm=SlurmOptions("cpu", "10", None, True, ("--mem=0",)))
    req = RunRequest(cfg, launch, "/r/hostfile.in")
    assert RunRequest.from_json(req.to_json()) == req
    assert parse_status(status_line(status="ok", output_dir="/r")) == {"status": "ok", "output_dir": "/r"}
    assert parse_status("[host:0] ordinary rank output") is None
