"""`cpudist run` end to end on this machine: real launcher, real ranks, real gloo."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from cpudist.cli.main import cli
from cpudist.state import token_cache_dir
from tests.harness.machine import physical_cores
from tests.integration.helpers import CPUDIST, cmdline, cpudist, descendants, kill_tree, wait_for

pytestmark = pytest.mark.slow


def mrpc(shared_data: Path) -> list[str]:
    return ["mrpc", "--data-dir", str(shared_data / "glue" / "MRPC"), "--model", "tiny"]


def in_process(*args: str | Path) -> Result:
    """`cpudist ARGS` through Click in this process: for what is decided before any process starts
    (bad input, dry runs, reports); a subprocess would import the CLI again for each."""
    r = CliRunner().invoke(cli, [str(a) for a in args], terminal_width=200)
    # a Traceback otherwise
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exc_info
    return r


@pytest.mark.own_token_cache  # its first run must tokenize and write the cache, its second hit it
def test_two_ranks_then_one_then_report(shared_data: Path, tmp_path: Path) -> None:
    # 5 steps x 32: the rows used, less to tokenize
    rows = ["--max-train-samples", "160", "--max-eval-samples", "64"]
    r2 = cpudist("run", *mrpc(shared_data), *rows, "--np", "2", "--ppn", "2", "--max-steps", "5",
                 "--output-dir", tmp_path / "RUN2")
    assert r2.returncode == 0, r2.stderr
    result = json.loads((tmp_path / "RUN2" / "result.json").read_text())
    assert (result["world_size"] == 2 and result["steps"] == 5
            and result["train_samples"] == 5 * 16 * 2)
    assert set(result["metrics"]) == {"accuracy", "f1"} and 0 <= result["metrics"]["accuracy"] <= 1
    assert result["launcher"] == "mpich" and len(result["rank_hosts"]) == 2
    assert r2.stdout.startswith("done: mrpc tiny on 2 rank(s)") and "samples/s" in r2.stdout
    steps = [json.loads(line)
             for line in (tmp_path / "RUN2" / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]
    assert "[" in r2.stderr and ":0]" in r2.stderr  # rank output comes with host:rank prefixes
    # the default --lr-scaling auto: the lr grew with the global batch, and the run says so
    assert "2 ranks x batch 16 = global batch 32: lr 2e-05 x 2 = 4e-05 (--lr-scaling auto" \
        in r2.stderr
    # as given: one group with its 1-rank run
    assert result["lr"] == 4e-5 and result["lr_scaling"] == "auto"
    # Where the time before the first step went (issue 24): every phase, from the command's start
    startup = result["startup"]
    assert list(startup)[:2] == ["before_rank", "python_and_imports"]
    # The two ranks of this first run race to tokenize (160 rows: quick), so rank 0 may already find
    # rank 1's tokens: that the run tokenized and wrote the cache is what it owes; the 1-rank run
    # below must hit it.
    assert any(token_cache_dir().iterdir())
    assert {"process_group", "data", "tokenizer", "tokenize", "model", "first_step"} <= set(startup)
    assert 0 < startup["total_to_first_step"] < result["wall_time_s"] + startup["before_rank"] + 60

    r1 = cpudist("run", *mrpc(shared_data), *rows, "--np", "1", "--max-steps", "5", "--output-dir",
                 tmp_path / "RUN1")
    assert r1.returncode == 0, r1.stderr
    assert "global batch" not in r1.stderr  # one rank: nothing grew
    # the same rows and tokenizer: this machine's token cache answered
    assert (json.loads((tmp_path / "RUN1" / "result.json").read_text())["startup"]["tokens_cached"]
            is True)
    rep = in_process("report", "--format", "md")
    assert rep.exit_code == 0, rep.stderr
    # the second table has a row per run too
    speed = rep.stdout.split("Gradient sync and traffic")[0]
    assert "Gradient sync and traffic" in rep.stdout  # the 2-rank run timed its sync
    lines = [line for line in speed.splitlines() if line.startswith("| 1 |")]
    assert "speedup" in rep.stdout and len(lines) == 2
    assert lines[0].split("|")[10].strip() == "1.00x"  # the 1-rank run is the baseline
    table = in_process("report")
    assert table.exit_code == 0 and "speedup" in table.stdout


def losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "steps.jsonl").read_text().splitlines()]


@pytest.mark.timeout(900)  # 5 runs (4 of them 1 rank): past 600 s on a 2-core machine at load 40
def test_loss_equivalence_one_rank_vs_two(shared_data: Path, tmp_path: Path) -> None:
    """Same seed, no dropout, global batch 32: 1 rank x 32 and 2 ranks x 16 see the same losses,
    with either sampler.

    Grouped, 41 rows: every other step is the epoch's last batch of 9 rows, split 5 + 4 over two
    ranks: each row must still weigh 1/9 (a mean of the ranks' means would weigh them 1/10 and 1/8);
    steps 1, 3 and 5 are full batches. (Grouped batches of all of MRPC on 1, 2 and 4 ranks:
    test_sync.py, at 2^-16.) Random: 160 rows, 5 whole batches (its DistributedSampler pads a last
    partial batch to equal shares, so only whole ones can match). One negative control serves both
    samplers: the comparison is the same code.

    The grouped 2-rank run also recomputes its activations (--gradient-checkpointing, under DDP): a
    change of memory, not of math, so its losses and gradient norms are held to the same bounds (the
    unit test, tests/unit/test_gradient_checkpointing.py, checks gradients bit for bit with dropout
    on, one process).
    """
    common = [*mrpc(shared_data), "--max-steps", "5", "--dropout", "0", "--precision", "fp32",
              "--no-eval",
              # one global batch, so one lr
              "--lr", "1e-3", "--lr-scaling", "none", "--log-every", "1"]
    rows = {"random": "160", "grouped": "41"}
    runs = [(f"{sampler}-np{np_}", sampler, np_, 32 // np_, 7) for sampler in ("random", "grouped")
            for np_ in (1, 2)]
    for name, sampler, np_, batch, seed in (*runs, ("seed8", "grouped", 1, 32, 8)):
        recompute = ["--gradient-checkpointing"] if name == "grouped-np2" else []
        r = cpudist("run", *common, "--sampler", sampler, "--max-train-samples", rows[sampler],
                    "--np", str(np_), "--batch-size", str(batch), "--seed", str(seed),
                    "--output-dir", tmp_path / name, *recompute)
        assert r.returncode == 0, r.stderr
    recorded = json.loads((tmp_path / "grouped-np2" / "result.json").read_text())
    # tiny's 2 layers but the first-token last one (it keeps its own)
    assert recorded["checkpointed_layers"] == 1
    one_rank = json.loads((tmp_path / "grouped-np1" / "result.json").read_text())
    assert one_rank["checkpointed_layers"] == 0
    for sampler in ("random", "grouped"):
        one, two = losses(tmp_path / f"{sampler}-np1"), losses(tmp_path / f"{sampler}-np2")
        assert len(one) == len(two) == 5
        for a, b in zip(one, two, strict=True):
            assert abs(a - b) <= 1e-3 * abs(a), (sampler, one, two)
        norms = [[json.loads(line)["grad_norm"]
                  for line in (tmp_path / n / "steps.jsonl").read_text().splitlines()]
                 for n in (f"{sampler}-np1", f"{sampler}-np2")]
        for a, b in zip(*norms, strict=True):
            assert abs(a - b) <= 1e-4 * a, (sampler, norms)
    # The samplers order the rows differently (else one case would be the other's) ...
    assert losses(tmp_path / "random-np1") != losses(tmp_path / "grouped-np1")
    # ... and the comparison can fail: another seed (other data order and init) gives other losses.
    one, other = losses(tmp_path / "grouped-np1"), losses(tmp_path / "seed8")
    assert any(abs(a - c) > 1e-3 * abs(a) for a, c in zip(one, other, strict=True)), (one, other)


def test_torchrun_launcher_and_custom_data(shared_data: Path, tmp_path: Path) -> None:
    emotion = shared_data / "emotion"
    r = cpudist("run", "custom", "--train-file", emotion / "train.txt", "--validation-file",
                emotion / "val.txt", "--label-column", "label_name", "--model", "tiny", "--np", "2",
                "--launcher", "torchrun", "--max-steps", "3", "--max-train-samples", "200",
                "--max-eval-samples", "200", "--output-dir", tmp_path / "emo", "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["launcher"] == "torchrun" and result["world_size"] == 2
    assert set(result["metrics"]) == {"accuracy", "f1_macro"}


def test_synthetic_task(tmp_path: Path) -> None:
    r = cpudist("run", "synthetic", "--model", "tiny", "--np", "1", "--max-steps", "4",
                "--max-seq-len", "32",
                "--synthetic-samples", "256", "--output-dir", tmp_path / "syn", "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert (result["task"] == "synthetic" and result["train_tokens_per_s"] > 0
            and result["peak_rss_mb"] > 0)


def test_speed_levers_train_the_same_model(shared_data: Path, tmp_path: Path) -> None:
    """--compile (padded to multiples of 32) and --freeze-embeddings change speed, not what is
    learned.

    The compiled run's losses match eager ones; a frozen table stays bit-identical while the rest
    trains. --ppn auto picks a layout from this machine's cores and says so.
    """
    # Rows cut at 48 tokens: each of the 3 batches is 47 or 48 wide in eager, and --compile pads
    # every one to 64, so it compiles one shape (at 128 tokens: two) and its losses are compared
    # over 16 or 17 columns of padding.
    common = [*mrpc(shared_data), "--max-steps", "3", "--dropout", "0", "--precision", "fp32",
              "--no-eval",
              "--log-every", "1", "--checkpoint-every", "3", "--np", "1", "--max-train-samples",
              "96",  # tokenize less
              "--max-seq-len", "48"]
    for name, extra in (("eager", []), ("compiled", ["--compile"]),
                        ("frozen", ["--freeze-embeddings"])):
        # One graph to compile: Inductor's pool of compile workers would cost more to start than it
        # saves
        r = cpudist("run", *common, *extra, "--output-dir", tmp_path / name, timeout=600,
                    env={"TORCHINDUCTOR_COMPILE_THREADS": "1"})
        assert r.returncode == 0, r.stderr
    eager, compiled = losses(tmp_path / "eager"), losses(tmp_path / "compiled")
    for a, b in zip(eager, compiled, strict=True):
        assert abs(a - b) <= 1e-3 * abs(a), (eager, compiled)

    import torch

    def weights(name: str) -> dict[str, torch.Tensor]:
        state = torch.load(next((tmp_path / name / "checkpoints").glob("step-*")) / "state.pt")
        return state["model"]  # type: ignore[no-any-return]

    frozen, trained = weights("frozen"), weights("eager")
    table = "bert.embeddings.word_embeddings.weight"
    assert not torch.equal(frozen[table], trained[table])  # eager trained its table...
    from cpudist.train.models import build_model

    torch.manual_seed(42)
    fresh = build_model("tiny", 2, False, 0.0).state_dict()
    assert torch.equal(frozen[table], fresh[table])  # ...the frozen run kept its initial one
    assert not torch.equal(frozen["classifier.weight"], fresh["classifier.weight"])
    recorded = {name: json.loads((tmp_path / name / "result.json").read_text())
                for name in ("frozen", "eager")}
    assert (recorded["frozen"]["freeze_embeddings"] is True
            and recorded["eager"]["freeze_embeddings"] is False)
    # the table's bytes are not sent
    assert recorded["frozen"]["grad_bytes"] < recorded["eager"]["grad_bytes"]

    dry = in_process("run", *mrpc(shared_data), "--ppn", "auto", "--max-steps", "1", "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    cores = physical_cores()
    # the README's rule: one rank per 8 physical cores, at least one, sharing them
    ranks = max(1, cores // 8)
    assert f"--ppn auto: {ranks} rank(s) per node x {cores // ranks} thread(s)" in dry.stderr, \
        dry.stderr
    assert f" -np {ranks} " in dry.stdout


def test_dry_run_runs_nothing(shared_data: Path, tmp_path: Path) -> None:
    r = in_process("run", *mrpc(shared_data), "--np", "2", "--output-dir", tmp_path / "dry",
                   "--dry-run", "--env", "FOO=bar")
    assert r.exit_code == 0, r.stderr
    # --env values are treated as secrets: named where shown, never their value
    assert "export OMP_NUM_THREADS=" in r.stdout and "export FOO=***" in r.stdout
    assert "FOO=bar" not in r.stdout and " FOO bar" not in r.stdout
    assert "-m cpudist.rank --task=mrpc" in r.stdout
    assert not (tmp_path / "dry").exists()


BAD_INPUTS = [
    (["run", "squad"], "unknown task 'squad'"),
    (["run", "mrpc", "--data-dir", "/nonexistent", "--model", "tiny"], "data directory not found"),
    (["run", "custom", "--train-file", "/nonexistent.csv", "--validation-file", "/x.csv", "--model",
      "tiny"],
     "data file not found"),
    (["run", "mrpc", "--data-dir", "{data}/glue/MRPC", "--model", "tinyy"], "unknown model preset"),
    (["run", "mrpc", "--data-dir", "{data}/glue/MRPC", "--model", "tiny", "--np", "3", "--ppn",
      "2"],
     "not divisible"),
    (["run", "mrpc", "--data-dir", "{data}/glue/MRPC", "--model", "tiny", "--np", "64", "--ppn",
      "64"],
     "slots"),
    (["run", "mrpc", "--data-dir", "{data}/glue/MRPC", "--model", "tiny", "--np", "4", "--ppn",
      "1"],
     "needs 4 nodes"),
    (["run", "custom", "--train-file", "{data}/emotion/train.txt", "--validation-file",
      "{data}/emotion/val.txt", "--model", "tiny"], "label column 'label' not found"),
    (["run", "mrpc", "--data-dir", "{data}/glue/MRPC", "--model", "tiny", "--backend", "ccl"],
     "oneccl_bindings_for_pytorch"),
    (["run", "mrpc", "--data-dir", "{data}/glue/MRPC", "--model", "tiny", "--env", "NOPE"],
     "KEY=VALUE"),
    (["report", "/nonexistent/ledger.jsonl"], "no such ledger"),
    (["run", "mrpc", "--data-dir", "{data}/glue/MRPC", "--model", "tiny", "--ipex"],
     "intel_extension_for_pytorch"),
    (["run", "mrpc", "--data-dir", "{data}/glue/MRPC", "--model", "tiny", "--nodes", "2", "--ppn",
      "1", "--np", "3"],
     "disagrees with --nodes 2"),
    (["run", "mrpc", "--data-dir", "{data}/glue/MRPC", "--model", "tiny", "--ppn", "two"],
     "neither a positive"),
    (["run", "mrpc", "--model", "tiny", "--sync-every", "4"],
     "--sync-every applies to --sync local-sgd"),
    (["run", "mrpc", "--model", "tiny", "--sync", "allreduce", "--grad-compression", "bf16"],
     "--grad-compression applies to --sync ddp and local-sgd"),
    (["run", "mrpc", "--model", "tiny", "--sync", "local-sgd", "--grad-compression", "powersgd"],
     "local SGD averages in fp32 (none) or bf16"),
    (["run", "mrpc", "--model", "tiny", "--average-moments", "both"],
     "--average-moments applies to --sync local-sgd"),
    (["run", "mrpc", "--model", "tiny", "--sync", "local-sgd", "--average-moments", "first",
      "--second-moment-every", "2"], "the second moment is not averaged"),
    (["run", "mrpc", "--model", "tiny", "--grad-compression", "zstd"],
     "not one of auto, none, bf16, fp16, powersgd"),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2(shared_data: Path, args: list[str], message: str) -> None:
    """In-process: each is refused before any process starts (`cpudist` as a subprocess, exit code
    and one line included: test_bad_input.py and test_unreachable_hub_fails_at_once below)."""
    r = in_process(*[a.replace("{data}", str(shared_data)) for a in args])
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_malformed_tsv_row(tmp_path: Path) -> None:
    folder = tmp_path / "RTE"
    folder.mkdir()
    (folder / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n"
                                      "1\tbroken\n")
    (folder / "dev.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n")
    r = in_process("run", "rte", "--data-dir", folder, "--model", "tiny")
    assert r.exit_code == 2 and "malformed row at" in r.stderr and "train.tsv:3" in r.stderr


def test_unreachable_hub_fails_at_once(tmp_path: Path) -> None:
    start = time.monotonic()
    r = cpudist("run", "mrpc", "--model", "tiny", env={"HF_ENDPOINT": "http://127.0.0.1:9"})
    assert r.returncode == 2 and "Hub is unreachable" in r.stderr and "--data-dir" in r.stderr
    assert time.monotonic() - start < 30


def test_killed_rank_ends_the_job(shared_data: Path, tmp_path: Path) -> None:
    """A rank that dies takes the job down with exit 1, and no rank is left behind."""
    proc = subprocess.Popen([*CPUDIST, "run", *mrpc(shared_data), "--np", "2", "--epochs", "50",
                             # 500 steps, less to tokenize
                             "--max-train-samples", "320", "--max-eval-samples", "32",
                             "--output-dir", str(tmp_path / "kill")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        deadline = time.monotonic() + 300
        steps = tmp_path / "kill" / "steps.jsonl"
        while not steps.exists() or not steps.stat().st_size:
            assert time.monotonic() < deadline and proc.poll() is None, "training never started"
            time.sleep(0.5)
        ranks = [p for p in descendants(proc.pid) if "cpudist.rank" in cmdline(p)
                 and "mpiexec" not in cmdline(p)]
        assert len(ranks) == 2
        os.kill(ranks[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        kill_tree(proc)
    assert proc.returncode == 1, err
    assert "the job failed" in err
    assert not [p for p in ranks if Path(f"/proc/{p}").exists() and "cpudist.rank" in cmdline(p)]


def test_a_hung_rank_ends_the_job_after_dist_timeout(shared_data: Path, tmp_path: Path) -> None:
    """A rank that hangs (stopped: SIGTERM cannot end it, as one stuck in C code ignores it) ends
    the job too: its peer's collective times out after --dist-timeout and says so in one line, then
    cpudist stops what Hydra left waiting (before, the job stayed up as long as the hung rank did),
    and no rank is left behind."""
    proc = subprocess.Popen([*CPUDIST, "run", *mrpc(shared_data), "--np", "2", "--epochs", "50",
                             "--dist-timeout", "10",
                             "--max-train-samples", "320", "--max-eval-samples", "32",
                             "--output-dir", str(tmp_path / "hang")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    hung: int | None = None
    try:
        steps = tmp_path / "hang" / "steps.jsonl"
        wait_for(lambda: (steps.exists() and steps.stat().st_size) or proc.poll() is not None, 300,
                 "the first step")
        assert proc.poll() is None, "the run ended before its first step"
        ranks = [p for p in descendants(proc.pid) if "cpudist.rank" in cmdline(p)
                 and "mpiexec" not in cmdline(p)]
        assert len(ranks) == 2
        hung = ranks[1]
        os.kill(hung, signal.SIGSTOP)
        # 10 s of --dist-timeout, the launcher's grace (20 s), SIGTERM's (10 s): the rest is slack
        # for a busy machine
        _, err = proc.communicate(timeout=240)
    finally:
        kill_tree(proc)
        if hung is not None and Path(f"/proc/{hung}").exists() and "cpudist.rank" in cmdline(hung):
            # only where the run left it: that is the failure this test reports
            os.kill(hung, signal.SIGKILL)
            raise AssertionError(f"the hung rank {hung} outlived the job")
    assert proc.returncode == 1, err
    assert "lost a peer rank: no answer within --dist-timeout 10s" in err, err
    assert "Error: the job failed (launcher stopped 20 s after a rank lost its peer): " in err, err
    assert not [p for p in ranks if Path(f"/proc/{p}").exists() and "cpudist.rank" in cmdline(p)]


def test_ctrl_c_after_a_checkpoint_says_how_to_resume_and_exits_130(shared_data: Path,
                                                                    tmp_path: Path) -> None:
    """Ctrl-C stops every rank after a checkpoint: exit 130 (a shell's code for SIGINT, not a
    failure's 1), one line naming the step and the resume command, run.json says interrupted, and
    that command goes on from it."""
    out = tmp_path / "ctrlc"
    args = [*mrpc(shared_data), "--np", "2", "--max-steps", "60", "--checkpoint-every", "2",
            "--no-eval", "--max-train-samples", "640", "--output-dir", str(out)]
    proc = subprocess.Popen([*CPUDIST, "run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        deadline = time.monotonic() + 180
        while not list((out / "checkpoints").glob("step-*")):
            assert time.monotonic() < deadline and proc.poll() is None, "no checkpoint was written"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        kill_tree(proc)
    assert proc.returncode == 130, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith(
        "Error: interrupted: all ranks were stopped; the ranks stopped at step "), err[-3000:]
    assert f"--resume auto --output-dir {out}" in last and "Traceback" not in err
    assert json.loads((out / "run.json").read_text())["state"] == "interrupted"
    stopped_at = int(last.split("at step ")[1].split()[0])
    assert 0 < stopped_at < 60
    again = cpudist("run", *args, "--resume", "auto")
    assert again.returncode == 0, again.stderr[-3000:]
    # "resuming from"
    assert f"step-{stopped_at:06d} at step {stopped_at}" in again.stderr, again.stderr[-3000:]
    assert json.loads((out / "result.json").read_text())["steps"] == 60
    assert json.loads((out / "run.json").read_text())["state"] == "finished"
