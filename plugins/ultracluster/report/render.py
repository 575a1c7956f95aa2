"""The report as Markdown, HTML (the report's own page, and the parts the plugin's pages share) and JSON."""
from __future__ import annotations

import base64
import html
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ultracluster.report.hardware import device_label, trained

Row = Mapping[str, Any]


def _number(fmt: str) -> Callable[[Any], str]:
    return lambda value: "-" if value is None else format(value, fmt)


def _time(row: Row) -> str:
    text = _number(".1f")(row.get("time_to_train_min"))
    return f"{text}*" if row.get("time_to_train_extrapolated") and text != "-" else text


def _cost(row: Row) -> str:
    text = _number(",.2f")(row.get("cost_usd"))
    return text + {"wall_times": " ~", "recorded": " (recorded)"}.get(row.get("cost_basis") or "", "")


def _efficiency(row: Row) -> str:
    return _number(".1%")(row.get("efficiency"))


# (header, cell of a measured row, cell of a reference point)
COLUMNS: list[tuple[str, Callable[[Row], str], Callable[[Row], str]]] = [
    ("Nodes", lambda r: _number("d")(r.get("nodes")), lambda ref: str(ref["nodes"])),
    # What trained (results.json): a reference point stands only beside runs of its own model and device.
    ("Model", lambda r: r.get("model") or "-", lambda ref: ref.get("model") or "-"),
    ("Device", lambda r: device_label(r.get("device")) or "-", lambda ref: device_label(ref.get("device")) or "-"),
    ("World size", lambda r: _number("d")(r.get("world_size")), lambda ref: "-"),
    ("Global batch", lambda r: _number(",d")(r.get("global_batch")), lambda ref: "-"),
    ("Avg seq/s", lambda r: _number(",.1f")(r.get("average_throughput_seq_per_s")),
     lambda ref: _number(",.1f")(ref.get("seq_per_s"))),
    ("Peak seq/s", lambda r: _number(",.1f")(r.get("peak_throughput_seq_per_s")), lambda ref: "-"),
    ("Time to train (min)", _time, lambda ref: "-"),
    ("Efficiency", _efficiency, _efficiency),
    ("Final loss", lambda r: _number(".4f")(r.get("final_loss")), lambda ref: "-"),
    ("Cluster wall (min)", lambda r: _number(".1f")(r.get("cluster_wall_min")), lambda ref: "-"),
    ("Idle fleet (min)", lambda r: _number(".1f")(r.get("idle_fleet_min")), lambda ref: "-"),
    ("Cost (USD)", _cost, lambda ref: "-"),
    ("Status", lambda r: str(r.get("status")), lambda ref: f"reference: {ref.get('label')}"),
]
LEGEND = ("`*` time to train extrapolated from the steps run. Cost is what EC2 says the cluster's "
          "instances used, launch to termination; `~` marks an estimate from wall times "
          "(nodes × fleet ready → train end) where that is unknown.")


def shared_cluster_cells(shared: Mapping[str, Any]) -> list[str]:
    """The shared cluster's line: its overhead (head node, FSx, idle nodes) in the Cost column."""
    cells = ["-"] * len(COLUMNS)
    cells[0] = "Shared cluster"
    overhead = shared.get("overhead")
    if overhead is None:
        cells[-1] = f"{shared.get('cluster_name')}: not billed yet (still up)"
        return cells
    cells[-2] = _number(",.2f")(overhead["usd"])
    cells[-1] = (f"{shared.get('cluster_name')}: head node {overhead['head_node_usd']:,.2f}, "
                 f"FSx {overhead['fsx_usd']:,.2f}, idle nodes {overhead['idle_nodes_usd']:,.2f} "
                 f"({overhead['idle_node_hours']:.3f} node-h)")
    return cells


def table(report: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells: the measured rows, the shared cluster's overhead (a sweep on one cluster),
    then the reference points."""
    cells = [[measured(row) for _, measured, _ in COLUMNS] for row in report["rows"]]
    if report.get("shared_cluster"):
        cells.append(shared_cluster_cells(report["shared_cluster"]))
    cells += [[reference(ref) for _, _, reference in COLUMNS] for ref in report.get("references") or []]
    return [header for header, _, _ in COLUMNS], cells


def summary(report: Mapping[str, Any]) -> str:
    mode = f"{report['scaling_mode']} scaling" if report.get("scaling_mode") else "scaling mode unknown"
    what = trained(report.get("model"), report.get("device")) or "no run's results yet"
    text = (f"Sweep `{report['sweep_id']}` of `{report['source_dag_id']}`: {mode} of {what}, on "
            f"{report.get('instance_type') or 'an unknown instance type'} nodes, points {report.get('points')}; "
            f"generated {report['generated_at']}.")
    return text + (" **Partial**: not every point has finished." if report.get("partial") else "")


def bullets(report: Mapping[str, Any]) -> dict[str, list[str]]:
    """The lists under the table: efficiency, pending points, notes, prices."""
    formula, baseline = report.get("efficiency_formula"), report.get("baseline_nodes")
    if not formula:
        efficiency = "Not computed: the scaling mode is unknown or mixed."
    elif baseline:
        efficiency = f"{formula}; here N1 = {baseline}."
    else:
        efficiency = f"{formula}; no successful point to compare with yet."
    waiting = [f"{p['nodes']} nodes: {p['status']}" + (f" ({p['run_id']})" if p.get("run_id") else "")
               + (" — tearing down" if p.get("tearing_down") else "") for p in report.get("pending") or []]
    notes = list(report.get("notes") or [])
    notes += [f"{row['nodes']} nodes: {note}" for row in report["rows"] for note in row.get("notes") or []]
    if report.get("shared_cluster"):
        notes.append(f"the points trained on one cluster, {report['shared_cluster'].get('cluster_name')}: each is "
                     "billed its Slurm jobs' node-hours; its head node, FSx and idle nodes are the Shared cluster line")
    prices = report.get("prices") or {}
    return {"Efficiency": [efficiency], "Pending": waiting, "Notes": notes,
            "Prices": [f"{prices.get('source')} (as of {prices.get('as_of')})."]}


def render_markdown(report: Mapping[str, Any]) -> str:
    headers, cells = table(report)
    lines = [f"# {report['title']}", "", summary(report), "",
             "| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    lines += ["", LEGEND]
    for title, items in bullets(report).items():
        if items:
            lines += ["", f"**{title}**", ""] + [f"- {item}" for item in items]
    return "\n".join(lines) + "\n"


# One style for every page: the report's own file and the plugin's pages (ui/pages.py).
STYLE = ("body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:1em 0}"
         "th,td{border:1px solid #bbb;padding:4px 8px;text-align:right}th{background:#eee}"
         "td.text,th.text{text-align:left}img{max-width:100%;height:auto}.muted{color:#666}"
         ".error{color:#a00}dl{display:grid;grid-template-columns:max-content auto;gap:4px 16px}"
         "dt{font-weight:bold}dd{margin:0;font-family:monospace}")


def escape(value: Any) -> str:
    return html.escape("-" if value is None else str(value))


def page(title: str, body: Sequence[str]) -> str:
    """A whole page: inline style, no script, no external assets."""
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
        *body, "</body></html>"]) + "\n"


def html_table(headers: Sequence[str], rows: Iterable[Sequence[str]], text_columns: Iterable[int] = ()) -> str:
    """Cells are HTML already (escaped by the caller); ``text_columns`` align left."""
    left = set(text_columns)

    def cls(i: int) -> str:
        return ' class="text"' if i in left else ""

    head = "".join(f"<th{cls(i)}>{escape(h)}</th>" for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f"<td{cls(i)}>{c}</td>" for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def report_body(report: Mapping[str, Any], image_src: str, *, status_links: Sequence[str | None] = ()) -> list[str]:
    """The report as page parts: title, summary, plot, table, legend and the lists under it.

    ``status_links``: per measured row, a URL its Status cell links to (the run in the Airflow UI).
    """
    headers, cells = table(report)
    status = len(headers) - 1
    rows = []
    for index, row in enumerate(cells):
        shown = [escape(c) for c in row]
        link = status_links[index] if index < len(status_links) else None
        if link:
            shown[status] = f'<a href="{escape(link)}" target="_top">{shown[status]}</a>'
        rows.append(shown)
    parts = [
        f"<h1>{escape(report['title'])}</h1>",
        f"<p>{escape(summary(report).replace('`', '').replace('**', ''))}</p>",
        f'<img id="plot" alt="Throughput and efficiency against nodes" width="800" height="600" '
        f'src="{escape(image_src)}">',
        html_table(headers, rows, text_columns=(status,)),
        f'<p class="muted">{escape(LEGEND.replace("`", ""))}</p>',
    ]
    for title, items in bullets(report).items():
        if items:
            parts.append(f"<h2>{escape(title)}</h2><ul>" + "".join(f"<li>{escape(i)}</li>" for i in items) + "</ul>")
    return parts


def render_html(report: Mapping[str, Any], png_bytes: bytes) -> str:
    """One self-contained page: the plot embedded as a data URI."""
    image = "data:image/png;base64," + base64.b64encode(png_bytes).decode("ascii")
    return page(report["title"], report_body(report, image))


def report_json(report: Mapping[str, Any]) -> str:
    return json.dumps(report, indent=2, default=str) + "\n"
