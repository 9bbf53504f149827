"""The report's sync and traffic columns, and the scaling plot drawn from the same rows."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from cpudist.errors import BadInput
from cpudist.results.plot import IDEAL, write_plot
from cpudist.results.render import render_csv, render_json, render_markdown
from cpudist.results.report import FLAG_NOTE, human_bytes, scaling_rows
from cpudist.results.schema import RunResult
from tests.unit.test_results import result

GRAD = 90_800_000  # MiniLM-L6's fp32 gradient


def synced(nodes: int, sps: float, sync: str = "ddp", measured_off: float | None = 0.02,
           **kw: object) -> RunResult:
    """A run on `nodes` nodes (one rank each) as the trainer records it once it times its sync."""
    expected = 2 * (nodes - 1) / nodes * GRAD * nodes if nodes > 1 else 0.0
    base: dict[str, object] = dict(
        nodes=tuple(f"node{i}" for i in range(nodes)), ppn=1, sync=sync, grad_bytes=GRAD,
        expected_tx_bytes_per_step=expected,
        measured_tx_bytes_per_step=None if nodes == 1 or measured_off is None else expected
        * (1 + measured_off),
        comm_time_s=3.0 * nodes, exposed_comm_s=2.0 * nodes, bus_bandwidth_gbps=0.91 if nodes > 1
        else None,
        run_id=f"{sync}-{nodes}")
    base.update(kw)
    return result(nodes, sps, **base)


def test_traffic_cells_in_human_units_with_share_and_bandwidth() -> None:
    rows = scaling_rows([synced(1, 31.0), synced(2, 52.0)])
    one, two = (r.traffic_cells() for r in rows)
    assert one == ["1", "1", "ddp", "-", "-", f"{2.0 / rows[0].train_time_s:.0%}", "-"]
    assert two[2:4] == ["ddp", "181.6 MB"] and two[4] == "185.2 MB (+2%)"
    assert two[5] == f"{4.0 / rows[1].train_time_s:.0%}" and two[6] == "0.91"
    assert not rows[1].traffic_flagged
    assert human_bytes(1_300_000_000) == "1.3 GB" and human_bytes(512) == "512 bytes"


@pytest.mark.parametrize(("off", "flagged"),
                         [(0.17, True), (-0.12, True), (0.09, False), (-0.05, False)])
def test_mismatch_over_ten_percent_is_flagged(off: float, flagged: bool) -> None:
    row = scaling_rows([synced(1, 31.0), synced(4, 88.0, measured_off=off)])[1]
    assert row.traffic_flagged is flagged
    assert row.traffic_cells()[4].endswith(" !") is flagged
    md = render_markdown(scaling_rows([synced(1, 31.0), synced(4, 88.0, measured_off=off)]))
    assert (FLAG_NOTE in md) is flagged


def test_no_flag_when_bytes_are_unknown() -> None:
    rows = scaling_rows([synced(1, 31.0), synced(2, 52.0, measured_off=None)])
    assert [r.traffic_error for r in rows] == [None, None]
    assert not any(r.traffic_flagged for r in rows)
    assert rows[1].traffic_cells()[3:5] == ["181.6 MB", "-"]
    assert FLAG_NOTE not in render_markdown(rows)


def test_runs_without_sync_timing_get_no_traffic_table() -> None:
    md = render_markdown(scaling_rows([result(1, 100.0), result(2, 190.0)]))
    assert "| speedup |" in md and "sync and traffic" not in md
    rows = scaling_rows([result(1, 100.0)])
    assert rows[0].comm_share is None and rows[0].traffic_cells()[3:] == ["-", "-", "-", "-"]


def test_strategies_are_separate_groups_each_with_its_traffic_table() -> None:
    rows = scaling_rows([synced(1, 31.0), synced(2, 52.0), synced(1, 30.5, "ddp+bf16"),
                         synced(2, 56.0, "ddp+bf16")])
    assert len({r.group for r in rows}) == 2 and {r.sync for r in rows} == {"ddp", "ddp+bf16"}
    md = render_markdown(rows)
    assert md.count("Gradient sync and traffic:") == 2 and "sync=ddp+bf16" in md


def test_frozen_embeddings_are_their_own_group() -> None:
    """A run that trains without the embedding table moves fewer bytes: it is not a point of the
    full model's curve."""
    rows = scaling_rows([synced(1, 31.0), synced(4, 88.0), synced(4, 97.0, freeze_embeddings=True)])
    frozen = [r for r in rows if "frozen-embeddings" in r.group]
    # no 1-node run of its own: its own base
    assert len(frozen) == 1 and frozen[0].speedup == pytest.approx(1.0)
    assert [r.speedup for r in rows if r not in frozen] == pytest.approx([1.0, 88.0 / 31.0])


def test_csv_and_json_carry_the_traffic_columns() -> None:
    rows = scaling_rows([synced(1, 31.0), synced(4, 88.0, measured_off=0.17)])
    table = list(csv.DictReader(io.StringIO(render_csv(rows))))
    assert (table[1]["sync"] == "ddp"
            and float(table[1]["expected_tx_bytes_per_step"]) == 544_800_000)
    assert table[1]["traffic_flagged"] == "True" and table[0]["traffic_flagged"] == "False"
    assert float(table[1]["comm_share"]) == pytest.approx(rows[1].comm_share or 0)
    assert table[1]["bus_bandwidth_gbps"] == "0.91"
    data = json.loads(render_json(rows))
    assert data[1]["traffic_error"] == pytest.approx(0.17) and data[1]["traffic_flagged"] is True
    assert data[1]["expected_tx_bytes_per_step"] == pytest.approx(544_800_000)
    assert data[0]["measured_tx_bytes_per_step"] is None and data[0]["traffic_flagged"] is False


SERIES = {"ddp": (31.0, 52.0, 88.0), "ddp+bf16": (30.5, 56.0, 104.0),
          "local-sgd:8": (31.2, 61.0, 120.0)}


def test_plot_has_a_line_per_group_and_the_ideal(tmp_path: Path) -> None:
    runs = [synced(n, sps, sync) for sync, series in SERIES.items() for n,
            sps in zip((1, 2, 4), series, strict=True)]
    path = tmp_path / "scaling.png"
    fig = write_plot(scaling_rows(runs), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    speedup, efficiency = fig.axes
    lines = {line.get_label(): line for line in speedup.lines}
    assert set(lines) == {IDEAL, "sync=ddp", "sync=ddp+bf16", "sync=local-sgd:8"}
    assert list(lines[IDEAL].get_xdata()) == [1, 2, 4]
    assert list(lines[IDEAL].get_ydata()) == [1, 2, 4]
    assert list(lines["sync=ddp"].get_ydata()) == pytest.approx([1.0, 52 / 31, 88 / 31])
    assert len(efficiency.lines) == 4 and [100.0] * 3 in [list(line.get_ydata())
                                                          for line in efficiency.lines]
    assert "mrpc" in fig.get_suptitle() and "tiny" in fig.get_suptitle()
    assert speedup.get_xlabel() == "nodes (1 rank each)" and "speedup" in speedup.get_ylabel()
    assert "efficiency" in efficiency.get_ylabel()


def test_plot_takes_the_median_of_repeated_runs_and_refuses_a_bad_path(tmp_path: Path) -> None:
    runs = [synced(1, 30.0), synced(1, 32.0), synced(1, 31.0), synced(2, 62.0), synced(2, 58.0)]
    fig = write_plot(scaling_rows(runs), tmp_path / "s.png")
    ddp = next(line for line in fig.axes[0].lines if line.get_label() == "sync=ddp")
    assert list(ddp.get_ydata()) == pytest.approx([1.0, 60 / 31])
    with pytest.raises(BadInput, match="cannot write the plot"):
        write_plot(scaling_rows(runs), tmp_path / "missing" / "s.png")
