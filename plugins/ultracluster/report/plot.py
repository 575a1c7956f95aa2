"""The report's plot: throughput against nodes, the ideal linear line, efficiency on a second axis.

matplotlib is imported inside ``plot_figure`` (Agg, no display): heavy, so never at parse time.
"""
from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

from ultracluster.report.hardware import trained

SIZE_INCHES = (8.0, 6.0)
DPI = 100


def plot_png(report: Mapping[str, Any]) -> bytes:
    """PNG bytes, ``SIZE_INCHES`` x ``DPI`` pixels (``plot_figure``)."""
    buffer = io.BytesIO()
    plot_figure(report).savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def plot_figure(report: Mapping[str, Any]) -> Any:
    """The plot as a matplotlib Figure. Successful points only; a sweep without one gets an empty
    plot that says so. The title names what trained (``report.hardware``); the reference points are
    the report's, which match it."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure  # no pyplot: no global figure state in a worker
    from matplotlib.ticker import MaxNLocator

    done = sorted((r for r in report["rows"] if r["status"] == "success" and r.get("nodes")
                   and r.get("average_throughput_seq_per_s")), key=lambda r: r["nodes"])
    figure = Figure(figsize=SIZE_INCHES, dpi=DPI)
    axes = figure.add_subplot()
    nodes = [r["nodes"] for r in done]
    if done:
        base = done[0]
        axes.plot(nodes, [r["average_throughput_seq_per_s"] for r in done], "o-", color="tab:blue",
                  label="average throughput")
        peaks = [(r["nodes"], r["peak_throughput_seq_per_s"]) for r in done if r.get("peak_throughput_seq_per_s")]
        if peaks:
            axes.plot(*zip(*peaks), "x", color="tab:blue", alpha=0.6, label="peak throughput")
        ideal_nodes = sorted({*nodes, *(ref["nodes"] for ref in report.get("references") or [])})
        per_node = base["average_throughput_seq_per_s"] / base["nodes"]
        axes.plot(ideal_nodes, [n * per_node for n in ideal_nodes], "--", color="gray",
                  label=f"ideal linear (from the {base['nodes']}-node point)")
    else:
        axes.text(0.5, 0.5, "no successful point yet", ha="center", va="center", transform=axes.transAxes)
    # Distinct from the measured series: other shapes and colours.
    for marker, color, ref in zip("*DP^v", ("tab:green", "tab:red", "tab:purple", "tab:brown", "tab:olive"),
                                  report.get("references") or []):
        axes.plot([ref["nodes"]], [ref["seq_per_s"]], marker, color=color, markersize=11, linestyle="none",
                  label=f"reference: {ref.get('label')}")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # node counts: no 1.25 nodes
    axes.set_xlabel("nodes" + (f" ({report['instance_type']})" if report.get("instance_type") else ""))
    values = [r["average_throughput_seq_per_s"] for r in done] + [
        ref["seq_per_s"] for ref in report.get("references") or [] if ref.get("seq_per_s")]
    # Measured points far below the references (a small or local cluster): a linear axis would
    # flatten them into a line on zero.
    log_scale = bool(values) and min(values) > 0 and max(values) / min(values) > 100
    if log_scale:
        axes.set_yscale("log")
    axes.set_ylabel("throughput (sequences/s)" + (", log scale" if log_scale else ""))
    axes.grid(True, alpha=0.3, which="both" if log_scale else "major")
    handles, labels = axes.get_legend_handles_labels()

    with_efficiency = [r for r in done if r.get("efficiency") is not None]
    if with_efficiency:
        efficiency_axes = axes.twinx()
        efficiency_axes.plot([r["nodes"] for r in with_efficiency], [r["efficiency"] for r in with_efficiency],
                             "s:", color="tab:orange", label=f"{report.get('scaling_mode')} scaling efficiency")
        efficiency_axes.set_ylabel("scaling efficiency")
        efficiency_axes.set_ylim(0, max(1.1, max(r["efficiency"] for r in with_efficiency) * 1.05))
        more_handles, more_labels = efficiency_axes.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    if handles:
        # Below the axes: inside, it would hide points whatever the corner.
        axes.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize="small")
    what = trained(report.get("model"), report.get("device"))
    axes.set_title(f"Throughput{f' of {what}' if what else ''} against nodes\nsweep {report['sweep_id']}"
                   + (f" ({report['scaling_mode']} scaling)" if report.get("scaling_mode") else ""))
    figure.tight_layout()
    return figure
