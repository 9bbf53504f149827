"""The scaling plot: x is what varied, the ideal shows, repeats show their range, flagged points are
ringed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection, PathCollection

from cpudist.results.plot import FLAGGED, IDEAL, RANGE, write_plot
from cpudist.results.report import scaling_rows
from tests.unit.test_report_rows import at

PNG = b"\x89PNG\r\n\x1a\n"


def lines(ax: Axes) -> dict[str, tuple[list[float], list[float]]]:
    return {str(line.get_label()): (list(line.get_xdata()), list(line.get_ydata()))
            for line in ax.lines}


def ringed(ax: Axes) -> list[tuple[float, float]]:
    """The points circled in red (flagged)."""
    return [tuple(xy) for c in ax.collections if isinstance(c, PathCollection)
            and len(c.get_offsets())
            and np.allclose(c.get_edgecolor()[0][:3], (1, 0, 0)) for xy in c.get_offsets()]


def test_one_node_rank_scaling_has_ranks_on_x_and_the_ideal(tmp_path: Path) -> None:
    """The README's first workflow: 1 and 2 ranks on one machine were one point at '1 node' with no
    ideal."""
    runs = [at(0, sps=10.0), at(1, ppn=2, sps=19.0), at(2, ppn=4, sps=36.0), at(3, ppn=4, sps=34.0)]
    fig = write_plot(scaling_rows(runs), tmp_path / "one.png")
    assert (tmp_path / "one.png").read_bytes()[:8] == PNG
    speedup, efficiency = fig.axes
    drawn = lines(speedup)
    assert drawn[IDEAL] == ([1, 2, 4], [1.0, 2.0, 4.0])
    assert drawn["sync=ddp"][0] == [1, 2,
                                    4] and drawn["sync=ddp"][1] == pytest.approx([1.0, 1.9, 3.5])
    assert speedup.get_xlabel() == efficiency.get_xlabel() == "ranks on one node"
    assert fig.get_suptitle().startswith("Scaling against 1 rank: mrpc, minilm-l6")
    bars = [c for c in speedup.collections if isinstance(c, LineCollection) and c.get_segments()]
    # the repeats' range at 4
    assert [seg.tolist() for seg in bars[0].get_segments()] == [[[4, 3.4], [4, 3.6]]]
    assert RANGE in [t.get_text() for t in fig.legends[0].get_texts()]


def test_node_scaling_has_nodes_on_x_and_flags_ringed(tmp_path: Path) -> None:
    # 4 nodes: 130% efficiency
    runs = [at(0, sps=10.0), at(1, nodes=2, sps=19.0), at(2, nodes=4, sps=52.0)]
    rows = scaling_rows(runs)
    fig = write_plot(rows, tmp_path / "nodes.png")
    speedup, efficiency = fig.axes
    assert (lines(speedup)[IDEAL] == ([1, 2, 4], [1.0, 2.0, 4.0])
            and speedup.get_xlabel() == "nodes (1 rank each)")
    assert (ringed(speedup) == [(4, pytest.approx(5.2))]
            and ringed(efficiency) == [(4, pytest.approx(130.0))])
    assert FLAGGED in [t.get_text() for t in fig.legends[0].get_texts()] and rows[2].flagged


def test_ranks_on_x_when_nodes_would_stack_two_configurations(tmp_path: Path) -> None:
    runs = [at(0, sps=10.0), at(1, ppn=2, sps=19.0), at(2, nodes=2, ppn=2, sps=36.0)]
    speedup = write_plot(scaling_rows(runs), tmp_path / "mixed.png").axes[0]
    assert (lines(speedup)["sync=ddp"][0] == [1, 2, 4]
            and speedup.get_xlabel() == "ranks (all nodes together)")
    assert ringed(speedup) == []
