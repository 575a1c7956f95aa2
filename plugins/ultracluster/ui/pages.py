"""The plugin's HTML pages (stdlib only): plain HTML, no script, every shown value escaped.

Links are relative, so the pages work wherever the API server mounts the app (a base URL with a
path included): from ``/ultracluster/reports`` a report is ``reports/<dag>/<sweep>``; from a report,
its plot is ``<sweep>/plot.png``. Links into the Airflow UI open in the top window (the UI shows the
pages in a frame).
"""
from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from ultracluster.report.render import LEGEND, _bullets, summary, table

_STYLE = ("body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:1em 0}"
          "th,td{border:1px solid #bbb;padding:4px 8px;text-align:right}th{background:#eee}"
          "td.text,th.text{text-align:left}img{max-width:100%;height:auto}.muted{color:#666}"
          ".error{color:#a00}dl{display:grid;grid-template-columns:max-content auto;gap:4px 16px}"
          "dt{font-weight:bold}dd{margin:0;font-family:monospace}")


def _e(value: Any) -> str:
    return html.escape("-" if value is None else str(value))


def _segment(value: str) -> str:
    return quote(str(value), safe="")


def page(title: str, body: Sequence[str]) -> str:
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>",
        *body, "</body></html>"]) + "\n"


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], text_columns: Iterable[int] = ()) -> str:
    """Cells are HTML already (escaped by the caller); ``text_columns`` align left."""
    left = set(text_columns)
    cls = lambda i: ' class="text"' if i in left else ""  # noqa: E731
    head = "".join(f"<th{cls(i)}>{_e(h)}</th>" for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f"<td{cls(i)}>{c}</td>" for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def reports_list(entries: Sequence[Mapping[str, Any]], location: str) -> str:
    """The Scaling reports page: one row per reported sweep, newest first."""
    body = ["<h1>Scaling reports</h1>",
            f'<p class="muted">Scaling sweep reports written by trn1_scaling_report under {_e(location)}, '
            "newest first.</p>"]
    if not entries:
        body.append("<p>No report yet. A sweep is reported when its last point ends, or by triggering "
                    "trn1_scaling_report with its sweep id.</p>")
        return page("Scaling reports", body)
    rows = []
    for entry in entries:
        s = entry.get("summary") or {}
        href = f"reports/{_segment(entry['dag_id'])}/{_segment(entry['sweep_id'])}"
        points = ", ".join(str(p) for p in s.get("points") or []) or None
        done = f"{s['succeeded']} of {s['rows']}" if s else None
        rows.append([f'<a href="{_e(href)}">{_e(entry["sweep_id"])}</a>', _e(entry["dag_id"]),
                     _e(s.get("scaling_mode")), _e(points), _e(done), _e(s.get("instance_type")),
                     _e(("partial" if s.get("partial") else "complete") if s else None), _e(entry["modified"])])
    body.append(_table(["Sweep", "Pipeline DAG", "Scaling", "Nodes", "Succeeded", "Instance type", "Report",
                        "Written"], rows, text_columns=(0, 1, 2, 5, 6, 7)))
    return page("Scaling reports", body)


def report_page(report: Mapping[str, Any], dag_id: str, sweep_id: str) -> str:
    """One sweep's report: summary, the plot, the table, and the notes under it."""
    headers, cells = table(report)
    runs = [row.get("run_id") for row in report["rows"]] + [None] * len(report.get("references") or [])
    status = len(headers) - 1
    rows = []
    for run_id, row in zip(runs, cells):
        shown = [_e(c) for c in row]
        if run_id:  # the Status cell links to the run in the Airflow UI
            href = f"../../../dags/{_segment(dag_id)}/runs/{_segment(run_id)}"
            shown[status] = f'<a href="{_e(href)}" target="_top" title="{_e(run_id)}">{shown[status]}</a>'
        rows.append(shown)
    body = [
        '<p><a href="../../reports">&larr; Scaling reports</a></p>',
        f"<h1>{_e(report.get('title') or f'Sweep {sweep_id}')}</h1>",
        f"<p>{_e(summary(report).replace('`', '').replace('**', ''))}</p>",
        f'<img id="plot" alt="Throughput and efficiency against nodes" width="800" height="600" '
        f'src="{_e(_segment(sweep_id))}/plot.png">',
        _table(headers, rows, text_columns=(status,)),
        f'<p class="muted">{_e(LEGEND.replace("`", ""))}</p>',
    ]
    for title, items in _bullets(report).items():
        if items:
            body.append(f"<h2>{_e(title)}</h2><ul>" + "".join(f"<li>{_e(i)}</li>" for i in items) + "</ul>")
    return page(str(report.get("title") or sweep_id), body)


def job_page(facts: Mapping[str, Any]) -> str:
    """A Slurm task's job: id, state, the log on the head node (``jobs.job_facts``)."""
    dag_id, run_id, task_id = facts["dag_id"], facts["run_id"], facts["task_id"]
    task_href = f"../../../../dags/{_segment(dag_id)}/runs/{_segment(run_id)}/tasks/{_segment(task_id)}"
    items = [
        ("Slurm job id", facts.get("job_id")),
        ("Slurm job state", facts.get("job_state")),
        ("Exit code", facts.get("exit_code")),
        ("Log on the head node", facts.get("log_path")),
        ("Head node", facts.get("head_node")),
        ("Outputs", facts.get("output_dir")),
        ("Task state", facts.get("task_state")),
        ("Try", facts.get("try_number")),
    ]
    body = [
        f"<h1>Slurm job of {_e(task_id)}</h1>",
        f'<p class="muted">DAG {_e(dag_id)}, run {_e(run_id)}. '
        f'<a href="{_e(task_href)}" target="_top">The task in Airflow</a> (its log follows the job).</p>',
    ]
    if not facts.get("job_id"):
        body.append("<p>No Slurm job recorded for this task yet: it is recorded once the job is submitted.</p>")
    body.append("<dl>" + "".join(f'<dt>{_e(k)}</dt><dd id="{_e(k.lower().replace(" ", "-"))}">{_e(v)}</dd>'
                                 for k, v in items) + "</dl>")
    if facts.get("job_state_note"):
        body.append(f'<p class="muted">{_e(facts["job_state_note"])}</p>')
    return page(f"Slurm job of {task_id}", body)


def message_page(title: str, message: str, *, link: tuple[str, str] | None = None) -> str:
    """A 4xx/5xx answer as a page (not found, refused, the bucket unreachable)."""
    body = [f"<h1>{_e(title)}</h1>", f'<p class="error">{_e(message)}</p>']
    if link:
        body.append(f'<p><a href="{_e(link[0])}" target="_top">{_e(link[1])}</a></p>')
    return page(title, body)
