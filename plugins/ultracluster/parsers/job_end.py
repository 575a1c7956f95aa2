"""What a succeeded Slurm job left on the head node, parsed for its task's return value: the node
health gate's report (train), the launch marker and results.json's compile cache figures (a job
under a launcher: parallel_compile).

The worker path (``operators.slurm``) and the trigger that ends the task itself (``triggers.slurm``)
read the same files (``SlurmHook.job_end_files``, ``ajob_end_files``) and parse them here, so both return the same value
and log the same lines. A file that cannot be read comes in as the exception that said so: the job
itself succeeded, so that is a warning and a None, never a failed task.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ultracluster.parsers.progress import parse_launch
from ultracluster.run import health
from ultracluster.run.clock import utc_now
from ultracluster.run.contracts import RESULTS_FILE, compile_cache_figures
from ultracluster.run.returns import job_succeeded

# (level, text): a task log line, logged by whichever path read the files.
LogLine = tuple[str, str]


def gate_lines(instance_type: str, verdicts: Sequence[health.Verdict], unreadable: Sequence[str] = ()) -> list[LogLine]:
    """One task-log line per node (healthy, or the check that failed and why), then the report's
    unreadable lines."""
    return ([("info", line) for line in health.log_lines(instance_type, verdicts)]
            + [("warning", f"Node health gate: unreadable report line: {line}") for line in unreadable])


def job_end_extras(files: Mapping[str, str | Exception], *, job_id: str, results_path: str,
                   health_gate: str | None) -> tuple[dict[str, Any], list[LogLine]]:
    """(the return value's ``node_health``, ``launch`` and ``compile_cache``, as read; the log lines)."""
    extras: dict[str, Any] = {}
    lines: list[LogLine] = []
    if "health" in files and health_gate:
        text = files["health"]
        if isinstance(text, Exception):
            lines.append(("warning", f"Node health gate: the report of job {job_id} is unreadable: {text}"))
            extras["node_health"] = None
        else:
            report = health.parse_report(text)
            verdicts = health.judge(report, health_gate)
            lines += gate_lines(health_gate, verdicts, report.unreadable)
            extras["node_health"] = health.summary(health_gate, verdicts)
    if "launch" in files:
        text = files["launch"]
        launch = parse_launch("" if isinstance(text, Exception) else text)
        lines.append(("info", f"Compile mode: {launch['mode']}" + (f" ({launch['path']})" if launch.get("path") else "")))
        extras["launch"] = launch
    if "results" in files:
        text = files["results"]
        try:
            figures = None if isinstance(text, Exception) else compile_cache_figures(json.loads(text))
        except ValueError:
            figures = None
        if figures is None:
            lines.append(("warning", f"No readable {RESULTS_FILE} at {results_path}: compile cache figures unknown"))
        else:
            lines.append(("info", "Compile cache: backend={backend} hits={hits} misses={misses}".format(**figures)))
        extras["compile_cache"] = figures
    return extras, lines


def log_lines(log: Any, lines: Sequence[LogLine]) -> None:
    for level, text in lines:
        getattr(log, level)("%s", text)


def job_end_result(payload: Mapping[str, Any], end: Mapping[str, Any], files: Mapping[str, str | Exception], *,
                   log_path: str, results_path: str, log: Any) -> dict[str, Any]:
    """A completed job's return value (``run.returns.job_succeeded``), its lines logged: ``payload``,
    the wait's event; ``end``, the worker's part (``SlurmJob.task_end``); ``files``, what it read."""
    job_id = str(payload.get("job_id"))
    extras, lines = job_end_extras(files, job_id=job_id, results_path=results_path, health_gate=end.get("health_gate"))
    log_lines(log, lines)
    result = job_succeeded(payload, job_name=end.get("job_name"), output_dir=end["output_dir"], log_path=log_path,
                           started_at=end.get("started_at"),
                           ended_at=utc_now(), auto_resume=end.get("auto_resume") or {}, extras=extras)
    log.info("Slurm job %s %s; outputs in %s", job_id, result["state"], end["output_dir"])
    return result
