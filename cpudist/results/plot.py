"""The scaling picture: speedup and efficiency against nodes, one line per group of the report."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from cpudist.errors import BadInput
from cpudist.results.report import ScalingRow, groups_of

IDEAL = "ideal (linear scaling)"
HEADLINE_PARTS = 2  # group_parts opens with the task and the model: the title's first line


def legend_and_title(rows: Sequence[ScalingRow]) -> tuple[dict[str, str], str, str]:
    """A label per group (what differs between groups, its sync at least) and a title of what they share."""
    parts = {r.group: r.group_parts for r in rows}
    width = max(len(p) for p in parts.values())
    varying = {i for i in range(width) if len({p[i] if i < len(p) else "" for p in parts.values()}) > 1}
    labels = {}
    for group, p in parts.items():
        shown = [i for i, x in enumerate(p) if i in varying or x.startswith("sync=")]
        labels[group] = " ".join(p[i] for i in shown) or group
    first = next(iter(parts.values()))
    common = [(i, x) for i, x in enumerate(first) if i not in varying and not x.startswith("sync=")]
    headline = ", ".join(x for i, x in common if i < HEADLINE_PARTS)
    details = " · ".join(x for i, x in common if i >= HEADLINE_PARTS)
    return labels, headline, details


def _medians(rows: Sequence[ScalingRow]) -> tuple[list[int], list[float], list[float]]:
    """Node counts and the median speedup and efficiency (%) at each (repeated runs share a point)."""
    nodes = sorted({r.nodes for r in rows})
    speedup = [statistics.median(r.speedup for r in rows if r.nodes == n) for n in nodes]
    eff = [100 * statistics.median(r.efficiency for r in rows if r.nodes == n) for n in nodes]
    return nodes, speedup, eff


def scaling_figure(rows: Sequence[ScalingRow]) -> Figure:
    """Two panels (speedup, efficiency) against nodes: one line per group and the ideal one."""
    fig = Figure(figsize=(11, 4.8), layout="constrained")
    FigureCanvasAgg(fig)  # Agg draws it: no display, no pyplot state
    ax_s, ax_e = fig.subplots(1, 2)
    labels, headline, details = legend_and_title(rows)
    all_nodes = sorted({r.nodes for r in rows})
    base = min(r.base_nodes for r in rows)
    ax_s.plot(all_nodes, [n / base for n in all_nodes], "--", color="gray", label=IDEAL)
    ax_e.plot(all_nodes, [100.0] * len(all_nodes), "--", color="gray")
    for group in groups_of(rows):
        mine = [r for r in rows if r.group == group]
        nodes, speedup, eff = _medians(mine)
        line, = ax_s.plot(nodes, speedup, "o-", label=labels[group])
        color = line.get_color()
        ax_e.plot(nodes, eff, "o-", color=color)
        if len(mine) > len(nodes):  # repeated runs: the line goes through medians, every run is a dot
            ax_s.scatter([r.nodes for r in mine], [r.speedup for r in mine], s=12, alpha=0.4, color=color)
            ax_e.scatter([r.nodes for r in mine], [100 * r.efficiency for r in mine], s=12, alpha=0.4, color=color)
        # the value at the largest count only: labels on every point pile up where the lines start together
        ax_s.annotate(f"{speedup[-1]:.2f}x", (nodes[-1], speedup[-1]), xytext=(6, 0), **_label(color))
        ax_e.annotate(f"{eff[-1]:.0f}%", (nodes[-1], eff[-1]), xytext=(6, 0), **_label(color))
    unit = f"{base} node{'s' if base > 1 else ''}"
    _axes(ax_s, all_nodes, f"speedup (samples/s / {base}-node samples/s)", "Speedup")
    _axes(ax_e, all_nodes, f"efficiency: speedup / (nodes / {base}) (%)" if base > 1 else
          "efficiency: speedup / nodes (%)", "Efficiency")
    ax_s.set_ylim(bottom=0)
    ax_e.set_ylim(0, max(110.0, *(100 * r.efficiency + 10 for r in rows)))
    ppn = sorted({r.ppn for r in rows})
    for ax in (ax_s, ax_e):
        ax.set_xlabel("nodes" + (f" ({ppn[0]} rank{'s' if ppn[0] > 1 else ''} each)" if len(ppn) == 1 else ""))
    fig.legend(loc="outside right center", fontsize=9)
    fig.suptitle(f"Scaling against {unit}" + (f": {headline}" if headline else "")
                 + (f"\n{details}" if details else ""), fontsize=11)
    return fig


def _label(color: str) -> dict[str, object]:
    return {"textcoords": "offset points", "fontsize": 8, "color": color, "va": "center"}


def _axes(ax: Axes, nodes: list[int], ylabel: str, title: str) -> None:
    ax.set_xticks(nodes)
    ax.set_xlim(min(nodes) - 0.3, max(nodes) * 1.1 + 0.3)  # room for the value labels on the right
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)


def write_plot(rows: Sequence[ScalingRow], path: Path) -> Figure:
    """Draw the rows and save the picture (format from the file's suffix, e.g. .png)."""
    if not rows:
        raise BadInput("nothing to plot", "Run `cpudist run` or `cpudist sweep` first")
    fig = scaling_figure(rows)
    try:
        fig.savefig(path, dpi=120)
    except (OSError, ValueError) as e:
        raise BadInput(f"cannot write the plot to {path}: {e}",
                       "Give a writable path ending in .png, .svg or .pdf") from None
    return fig
