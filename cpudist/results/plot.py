"""The scaling picture: speedup and efficiency against what varied (ranks on one node, else nodes),
one line per group of the report, the ideal beside them, and every flagged point marked."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from cpudist.errors import BadInput
from cpudist.results.report import ScalingRow, groups_of

IDEAL = "ideal (linear scaling)"
RANGE = "repeats: median, bar from slowest to fastest"
FLAGGED = "! beyond what the ranks allow (see the report)"
HEADLINE_PARTS = 2  # group_parts opens with the task and the model: the title's first line


def legend_and_title(rows: Sequence[ScalingRow]) -> tuple[dict[str, str], str, str]:
    """A label per group (what differs between groups, its sync at least) and a title of what they
    share."""
    parts = {r.group: r.group_parts for r in rows}
    width = max(len(p) for p in parts.values())
    varying = {i for i in range(width)
               if len({p[i] if i < len(p) else "" for p in parts.values()}) > 1}
    labels = {}
    for group, p in parts.items():
        shown = [i for i, x in enumerate(p) if i in varying or x.startswith("sync=")]
        labels[group] = " ".join(p[i] for i in shown) or group
    first = next(iter(parts.values()))
    common = [(i, x) for i, x in enumerate(first) if i not in varying and not x.startswith("sync=")]
    headline = ", ".join(x for i, x in common if i < HEADLINE_PARTS)
    details = " · ".join(x for i, x in common if i >= HEADLINE_PARTS)
    return labels, headline, details


def x_axis(rows: Sequence[ScalingRow]) -> str:
    """'ranks' when every run is on one node, or when a group has two configurations on one node
    count (nodes would draw them as one point); else 'nodes'."""
    if all(r.nodes == 1 for r in rows):
        return "ranks"
    seen = {(r.group, r.nodes) for r in rows}
    return "ranks" if len(seen) < len(rows) else "nodes"


def _xlabel(rows: Sequence[ScalingRow], axis: str) -> str:
    ppn = sorted({r.ppn for r in rows})
    if axis == "nodes":
        return "nodes" + (f" ({ppn[0]} rank{'s' if ppn[0] > 1 else ''} each)" if len(ppn) == 1
                          else "")
    return "ranks on one node" if all(r.nodes == 1 for r in rows) else "ranks (all nodes together)"


def _base(r: ScalingRow, axis: str) -> int:
    return r.base_ranks if axis == "ranks" else r.base_nodes


def scaling_figure(rows: Sequence[ScalingRow]) -> Figure:
    """Two panels (speedup, efficiency) against ranks or nodes: one line per group and the ideal
    one."""
    fig = Figure(figsize=(11, 4.8), layout="constrained")
    FigureCanvasAgg(fig)  # Agg draws it: no display, no pyplot state
    ax_s, ax_e = fig.subplots(1, 2)
    axis = x_axis(rows)
    labels, headline, details = legend_and_title(rows)
    xs_all = sorted({getattr(r, axis) for r in rows})
    bases = sorted({_base(r, axis) for r in rows})
    for i, b in enumerate(bases):  # one ideal per baseline size: x / b through (b, 1)
        xs = sorted({b, *xs_all})
        ax_s.plot(xs, [x / b for x in xs], "--", color="gray", label=IDEAL if i == 0 else None)
    ax_e.plot(sorted({*bases, *xs_all}), [100.0] * len({*bases, *xs_all}), "--", color="gray")
    for group in groups_of(rows):
        _draw_group(ax_s, ax_e, [r for r in rows if r.group == group], axis, labels[group])
    if any(r.n > 1 for r in rows):
        ax_s.vlines([], [], [], color="gray", alpha=0.5, label=RANGE)
    if any(r.flagged for r in rows):
        ax_s.scatter([], [], s=120, facecolors="none", edgecolors="red", linewidths=1.5,
                     label=FLAGGED)
    base = bases[0]
    unit = f"{base} {'rank' if axis == 'ranks' else 'node'}{'s' if base > 1 else ''}"
    _axes(ax_s, xs_all, f"speedup (samples/s over {unit}'s)", "Speedup")
    _axes(ax_e, xs_all, f"efficiency: speedup / ({axis} / {base}) (%)" if base > 1 else
          f"efficiency: speedup / {axis} (%)", "Efficiency")
    top = max(r.speedup_max or r.speedup for r in rows)
    ax_s.set_ylim(0, max(top, max(xs_all) / base) * 1.1)
    ax_e.set_ylim(0, max(110.0, *(100 * r.efficiency + 10 for r in rows)))
    for ax in (ax_s, ax_e):
        ax.set_xlabel(_xlabel(rows, axis))
    fig.legend(loc="outside right center", fontsize=9)
    fig.suptitle(f"Scaling against {unit}" + (f": {headline}" if headline else "")
                 + (f"\n{details}" if details else ""), fontsize=11)
    return fig


def _draw_group(ax_s: Axes, ax_e: Axes, mine: list[ScalingRow], axis: str, label: str) -> None:
    """The group's medians as a line, its repeats' range as bars, its flagged points ringed in
    red."""
    mine = sorted(mine, key=lambda r: getattr(r, axis))
    xs = [getattr(r, axis) for r in mine]
    speedup, eff = [r.speedup for r in mine], [100 * r.efficiency for r in mine]
    line, = ax_s.plot(xs, speedup, "o-", label=label)
    color: Any = line.get_color()  # a name or an RGB tuple, as the cycle gives it
    ax_e.plot(xs, eff, "o-", color=color)
    spread = [r for r in mine if r.n > 1]
    if spread:  # repeats: the line goes through medians, a bar spans the slowest to the fastest
        ax_s.vlines([getattr(r, axis) for r in spread], [r.speedup_min for r in spread],
                    [r.speedup_max for r in spread], color=color, alpha=0.5)
        ax_e.vlines([getattr(r, axis) for r in spread],
                    [100 * r.efficiency * r.speedup_min / r.speedup for r in spread if r.speedup],
                    [100 * r.efficiency * r.speedup_max / r.speedup for r in spread if r.speedup],
                    color=color, alpha=0.5)
    flagged = [r for r in mine if r.flagged]
    for ax, ys in ((ax_s, [r.speedup for r in flagged]),
                   (ax_e, [100 * r.efficiency for r in flagged])):
        ax.scatter([getattr(r, axis) for r in flagged], ys, s=120, facecolors="none",
                   edgecolors="red", linewidths=1.5, zorder=3)
    # the value at the largest count only: labels on every point pile up where the lines start
    # together
    ax_s.annotate(f"{speedup[-1]:.2f}x", (xs[-1], speedup[-1]), xytext=(6, 0), **_label(color))
    ax_e.annotate(f"{eff[-1]:.0f}%", (xs[-1], eff[-1]), xytext=(6, 0), **_label(color))


def _label(color: Any) -> dict[str, Any]:
    return {"textcoords": "offset points", "fontsize": 8, "color": color, "va": "center"}


def _axes(ax: Axes, xs: list[int], ylabel: str, title: str) -> None:
    ax.set_xticks(xs)
    ax.set_xlim(min(xs) - 0.3, max(xs) * 1.1 + 0.3)  # room for the value labels on the right
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
