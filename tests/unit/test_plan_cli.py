"""`cpudist plan` and `cpudist hosts bench` at the command line (nothing is launched), and the bench
file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from cpudist.cli.main import cli
from cpudist.errors import BadInput
from cpudist.hosts.bench import BenchResult, human, parse_sizes, points, read_bench, save
from cpudist.launch.kinds import plan as plan_launch
from cpudist.results.ledger import append
from tests.unit.test_launch_plan import spec
from tests.unit.test_planner import run


def cpudist(*args: str | Path) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


def bench_result(busbw_gbps: float, hostfile: str = "hosts",
                 when: str = "2026-01-02T03:04:05") -> BenchResult:
    """A 2-node probe whose largest size ran at `busbw_gbps` (2 ranks: bus = algorithm
    bandwidth)."""
    sizes = [1_000_000, 64_000_000]
    return BenchResult(hostfile=hostfile, rank_hosts=("n0", "n1"), world_size=2, ppn=1,
                       launcher="mpich", iters=10, warmup=2, created_at=when,
                       points=points(sizes, [0.01, sizes[1] * 8 / (busbw_gbps * 1e9)], 2),
                       cpu={"kind": "amx-bf16"})


def test_sizes_and_their_names() -> None:
    assert parse_sizes("64MB, 1MB,512KiB,4096") == (4096, 524288, 1_000_000, 64_000_000)
    assert parse_sizes("1.5KB") == (1500,)
    assert [human(n) for n in (64_000_000, 524288, 1000, 6)] == ["64MB", "512KiB", "1KB", "6B"]
    for bad in ("1XB", "MB", "2", "1MB,,8MB"):
        with pytest.raises(BadInput, match="--sizes"):
            parse_sizes(bad)


def test_bus_bandwidth_follows_nccl_tests() -> None:
    p = points([100_000_000], [1.0], world=4)[0]
    assert p.algbw_gbps == pytest.approx(0.8) and p.busbw_gbps == pytest.approx(0.8 * 2 * 3 / 4)


def test_bench_file_round_trip_under_cpudist_home(tmp_path: Path) -> None:
    result = bench_result(0.95)
    path = save(result)
    assert path == Path(os.environ["CPUDIST_HOME"]) / "bench" / "hosts-20260102-030405.json"
    again = read_bench(path)
    assert (again == result and again.link_gbps == pytest.approx(0.95)
            and again.nodes == ("n0", "n1"))
    (tmp_path / "x.json").write_text('{"not": "a bench"}')
    with pytest.raises(BadInput, match="is not a `cpudist hosts bench` result"):
        read_bench(tmp_path / "x.json")


def test_the_launch_runs_another_program_when_given_one() -> None:
    argv = list(plan_launch(spec(program=("cpudist.hosts.bench_rank", "--sizes", "4096"))).argv)
    assert argv[-5:] == ["/usr/bin/python3", "-m", "cpudist.hosts.bench_rank", "--sizes", "4096"]


def test_bench_dry_run_prints_the_launch_and_bad_input_is_one_line(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost\n127.0.0.2\n")
    dry = cpudist("hosts", "bench", "--hostfile", hostfile, "--sizes", "1MB,8MB", "--iters", "3",
                  "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "-np 2 -ppn 1" in dry.output
    # the head names itself by a loopback name: the address toward the next node, as for a training
    # run on the same hostfile (the probe's spec comes from the same resolve: run/payloads.py)
    assert "MASTER_ADDR=127.0.0.1" in dry.output and "MASTER_ADDR=localhost" not in dry.output
    run = cpudist("run", "synthetic", "--model", "tiny", "--hostfile", hostfile, "--np", "2",
                  "--ppn", "1", "--dry-run")
    assert run.exit_code == 0 and "MASTER_ADDR=127.0.0.1" in run.output, run.output
    assert "-m cpudist.hosts.bench_rank --sizes 1000000,8000000 --iters 3" in dry.output
    (tmp_path / "one").write_text("localhost\n")
    one = cpudist("hosts", "bench", "--hostfile", tmp_path / "one")
    assert one.exit_code == 2 and "nothing to all-reduce with" in one.output and len(
        one.output.splitlines()) == 1
    bad = cpudist("hosts", "bench", "--hostfile", hostfile, "--sizes", "lots")
    assert bad.exit_code == 2 and len(bad.output.splitlines()) == 1


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """A 1-node run (t_c 2 s, 100 MB of gradients, $3/node-hour) and a 2-node DDP run of the same
    job."""
    folder = tmp_path / "runs"
    for name, r in (("one", run(1, usd_per_hour=3.0)), ("two", run(2, step_s=2.9, comm_time_s=80.0,
                                                                   exposed_comm_s=60.0))):
        (folder / name).mkdir(parents=True)
        (folder / name / "result.json").write_text(json.dumps(r.to_dict()))
    return folder


def test_plan_table_recommendation_and_validation(runs: Path) -> None:
    out = cpudist("plan", runs, "--nodes", "2,4", "--link-gbps", "1", "--latency-ms", "0")
    assert out.exit_code == 0, out.output
    assert ("base: r1x1 (the only 1-node run in the sources)" in out.output
            and "t_c = 2.000 s/step" in out.output)
    assert "f = 0.25" in out.output and "median of measured multi-node DDP runs r2x1" in out.output
    assert "price: $3.0000 per node-hour (the run's nodes)" in out.output
    assert "recommend: " in out.output and "measured vs predicted speedup" in out.output
    assert "1 of 1 measured points within 15%" in out.output  # 2 + 0.8 predicted vs 2.9 measured
    # c from r2x1, fitted with the overlap of the other DDP runs (none: f = 0): (2.9 - 2.8) s
    # / 100 MB
    assert ("sync CPU: c = 1.00 s per GB on the busiest link (median of measured multi-node runs "
            "r2x1;") in out.output
    data = json.loads(cpudist("plan", runs, "--nodes", "4", "--link-gbps", "1", "--latency-ms", "0",
                              "--overlap", "0.5", "--sync-cpu-s-per-gb", "0", "--json").output)
    ddp4 = next(p for p in data["predictions"] if p["nodes"] == 4 and p["sync"] == "ddp")
    assert ddp4["step_s"] == pytest.approx(2.6) and ddp4["speedup"] == pytest.approx(8 / 2.6)
    assert ddp4["cost_usd"] == pytest.approx(4 * 3.0 * 25 * 2.6 / 3600)
    assert data["validation"][0]["predicted_step_s"] == pytest.approx(2.4)


def test_plan_takes_the_newest_bench_and_work_options(runs: Path) -> None:
    save(bench_result(0.5, when="2026-01-01T00:00:00"))
    newest = save(bench_result(2.0, when="2026-01-02T00:00:00"))
    os.utime(newest, (2e9, 2e9))
    out = cpudist("plan", runs / "one", "--nodes", "2", "--steps", "10", "--price", "1")
    assert out.exit_code == 0, out.output
    assert f"link: 2.000 Gbit/s per node (bus bandwidth at 64MB on n0, n1, {newest})" in out.output
    assert ("work: 10 steps of the measured run (320 samples)" in out.output
            and "(--price)" in out.output)
    assert ("sync CPU: c = 0.00 s per GB on the busiest link "
            "(no measured multi-node run") in out.output
    assert ("note: without measured multi-node runs in the sources "
            "the model leaves out") in out.output


@pytest.mark.parametrize(("args", "message"), [
    (["--nodes", "2,x"], "--nodes '2,x' is not a list"),
    (["--link-gbps", "1", "--bench", "b.json"], "--link-gbps and --bench both"),
    (["--bench", "missing.json"], "no bench result at missing.json"),
    (["--link-gbps", "1", "--epochs", "2"], "ran a number of steps"),
    (["--link-gbps", "1", "--run-id", "nope"], "no run nope in the sources"),
    ([], "no link rate"),
])
def test_plan_bad_input_is_one_line_exit_2(runs: Path, args: list[str], message: str) -> None:
    out = cpudist("plan", runs, *args)
    assert out.exit_code == 2 and message in out.output and len(
        out.output.splitlines()) == 1, out.output


def test_validate_only(runs: Path) -> None:
    out = cpudist("plan", "--validate", runs, "--link-gbps", "1", "--json")
    rows = json.loads(out.output)
    assert [r["run_id"] for r in rows] == ["r2x1"] and not rows[0]["flagged"]
    none = cpudist("plan", "--validate", runs / "one", "--link-gbps", "1")
    assert none.exit_code == 2 and "no multi-node run" in none.output


def test_plan_names_its_baseline_and_takes_baseline_run(tmp_path: Path) -> None:
    """The issue's case: a newer 2-rank gather-scatter run on 1 node was taken silently as the
    base."""
    ledger = tmp_path / "ledger.jsonl"
    for r in (run(1, run_id="20261126-090000-aaaaaa", started_at="2026-11-26T09:00:00"),
              run(1, ppn=2, sync="gather-scatter", step_s=3.0, run_id="20261126-100000-bbbbbb",
                  started_at="2026-11-26T10:00:00")):
        append(ledger, r)
    default = cpudist("plan", ledger, "--nodes", "2", "--link-gbps", "1")
    assert default.exit_code == 0, default.output
    assert ("base: 20261126-090000-aaaaaa (of 2 1-node runs of mrpc minilm-l6 bf16 in the sources, "
            "the one with the fewest ranks (1 rank)): mrpc minilm-l6 bf16, "
            "1 rank(s) on 1 node, ") in default.output
    for option in ("--baseline", "--run-id"):
        named = cpudist("plan", ledger, "--nodes", "2", "--link-gbps", "1", option, "20261126-10",
                        "--json")
        assert named.exit_code == 0, named.output
        assert json.loads(named.output)["baseline"]["why"] == "named by --baseline"
    text = cpudist("plan", ledger, "--nodes", "2", "--link-gbps", "1", "--baseline", "20261126-10")
    assert ("base: 20261126-100000-bbbbbb (named by --baseline): mrpc minilm-l6 bf16, 2 rank(s) on "
            "1 node "
            "(sync=gather-scatter: its exchange on the node counts as compute), ") in text.output
    assert "t_c = 3.000 s/step" in text.output
