"""The plugin's HTML pages: plain HTML, no script, every shown value escaped.

Links are relative, so the pages work wherever the API server mounts the app (a base URL with a
path included): from ``/ultracluster/reports`` a report is ``reports/<dag>/<sweep>``; from a report,
its plot is ``<sweep>/plot.png``. Links into the Airflow UI open in the top window (the UI shows the
pages in a frame).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from ultracluster.report.render import escape, html_table, page, report_body


def _segment(value: str) -> str:
    return quote(str(value), safe="")


def reports_list(entries: Sequence[Mapping[str, Any]], location: str) -> str:
    """The Scaling reports page: one row per reported sweep, newest first."""
    body = ["<h1>Scaling reports</h1>",
            f'<p class="muted">Scaling sweep reports written by trn1_scaling_report under {escape(location)}, '
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
        rows.append([f'<a href="{escape(href)}">{escape(entry["sweep_id"])}</a>', escape(entry["dag_id"]),
                     escape(s.get("scaling_mode")), escape(points), escape(done), escape(s.get("instance_type")),
                     escape(("partial" if s.get("partial") else "complete") if s else None), escape(entry["modified"])])
    body.append(html_table(["Sweep", "Pipeline DAG", "Scaling", "Nodes", "Succeeded", "Instance type", "Report",
                        "Written"], rows, text_columns=(0, 1, 2, 5, 6, 7)))
    return page("Scaling reports", body)


def report_page(report: Mapping[str, Any], dag_id: str, sweep_id: str) -> str:
    """One sweep's report: summary, the plot, the table (its Status cells link to the runs in the
    Airflow UI), and the notes under it."""
    links = [f"../../../dags/{_segment(dag_id)}/runs/{_segment(row['run_id'])}" if row.get("run_id") else None
             for row in report["rows"]]
    body = ['<p><a href="../../reports">&larr; Scaling reports</a></p>',
            *report_body({**report, "title": report.get("title") or f"Sweep {sweep_id}"},
                         f"{_segment(sweep_id)}/plot.png", status_links=links)]
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
        f"<h1>Slurm job of {escape(task_id)}</h1>",
        f'<p class="muted">DAG {escape(dag_id)}, run {escape(run_id)}. '
        f'<a href="{escape(task_href)}" target="_top">The task in Airflow</a> (its log follows the job).</p>',
    ]
    if not facts.get("job_id"):
        body.append("<p>No Slurm job recorded for this task yet: it is recorded once the job is submitted.</p>")
    body.append("<dl>" + "".join(f'<dt>{escape(k)}</dt><dd id="{escape(k.lower().replace(" ", "-"))}">{escape(v)}</dd>'
                                 for k, v in items) + "</dl>")
    if facts.get("job_state_note"):
        body.append(f'<p class="muted">{escape(facts["job_state_note"])}</p>')
    return page(f"Slurm job of {task_id}", body)


def message_page(title: str, message: str, *, link: tuple[str, str] | None = None) -> str:
    """A 4xx/5xx answer as a page (not found, refused, the bucket unreachable)."""
    body = [f"<h1>{escape(title)}</h1>", f'<p class="error">{escape(message)}</p>']
    if link:
        body.append(f'<p><a href="{escape(link[0])}" target="_top">{escape(link[1])}</a></p>')
    return page(title, body)
