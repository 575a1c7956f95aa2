"""Time to first step: a run's time from its trigger to its first training step, split by phase
(bench/pipeline.py measures it; docs/operations.md, "Time to first step", estimates it for AWS).

The phases partition the span: each runs from the previous one's end to its own end, so they add up
to the total. A task's phase includes the scheduling hop before the task started (``hop_s``). The
marks come from the run's records (bench/_collect.py): Airflow's run and task instances, the train
task's log (its "Submitted Slurm job" line), Slurm's job completion log (the job's start, whole
seconds) and the training program's results.json (the "First step" metric: the wall-clock time the
first step was done and the seconds since the training loop began). Times are POSIX seconds.
Stdlib only.
"""
from __future__ import annotations

import re
from typing import Any

from _timeline import parse_time

# (phase, its tasks): the pipeline's path to train, in order; a phase ends when its last task does.
STAGES = (
    ("preflight", ("preflight",)),
    ("network (create_vpc)", ("create_vpc",)),
    ("config (render_config)", ("render_config",)),
    ("cluster (pcluster_create)", ("pcluster_create",)),
    ("fleet (wait_for_fleet)", ("wait_for_fleet",)),
    ("data and caches", ("download_data", "restore_compile_cache", "restore_checkpoint")),
    ("compile (parallel_compile)", ("parallel_compile",)),
)
TRAIN_PHASES = ("train: task start to sbatch", "train: Slurm, sbatch to job start (node power-up)",
                "train: job start to training loop (health gate, imports, model, data)",
                "train: first step (warm-up, compilation)")
_SUBMITTED = re.compile(r"Submitted Slurm job (\d+)")


class MissingMark(ValueError):
    """A record the breakdown needs is missing (the run failed, or a log line is absent)."""


def first_step_mark(results: dict[str, Any] | None) -> dict[str, float] | None:
    """From a results.json document: {"at": first step done, "loop_start": the loop's start}."""
    metrics = ((results or {}).get("results") or {}).get("metrics") or []
    found = [m for m in metrics if m.get("MetricName") == "First step"]
    if not found or not (found[0].get("AdditionalData") or {}).get("at") or found[0].get("MeasuredValue") is None:
        return None
    at = parse_time(found[0]["AdditionalData"]["at"])
    return {"at": at, "loop_start": at - float(found[0]["MeasuredValue"])}


def submitted_at(events: list[tuple[float, str]]) -> tuple[str, float] | None:
    """The last job a task's log says it submitted: (job id, the log line's time)."""
    found = [(m.group(1), when) for when, event in events if (m := _SUBMITTED.search(event))]
    return found[-1] if found else None


def _marks(r: dict[str, Any]) -> list[tuple[str, float | None, float | None]]:
    """(phase, the start of its own work where it has one, its end)."""
    marks: list[tuple[str, float | None, float | None]] = [("queued (trigger to the run's start)", None, r["start"])]
    for phase, tasks in STAGES:
        tis = [r["tis"].get(task) or {} for task in tasks]
        starts = [ti["start"] for ti in tis if ti.get("start") is not None]
        ends = [ti["end"] for ti in tis if ti.get("end") is not None]
        marks.append((phase, min(starts) if starts else None, max(ends) if len(ends) == len(tasks) else None))
    train, first = r["tis"].get("train") or {}, r.get("first_step") or {}
    submitted = submitted_at(r["logs"].get("train", []))
    job = r["jobs"].get(submitted[0]) if submitted else None
    marks += [(TRAIN_PHASES[0], train.get("start"), submitted[1] if submitted else None),
              (TRAIN_PHASES[1], None, (job or {}).get("start")),
              (TRAIN_PHASES[2], None, first.get("loop_start")),
              (TRAIN_PHASES[3], None, first.get("at"))]
    return marks


def phases(r: dict[str, Any]) -> dict[str, Any]:
    """{"total_s", "phases": [{"phase", "s", "hop_s"}]}: trigger to first step; MissingMark if a mark
    is missing. ``hop_s``: from the previous phase's end to the phase's task starting (None: no task)."""
    if r.get("queued") is None:
        raise MissingMark("the run's trigger time (queued_at)")
    out, previous = [], r["queued"]
    for phase, own_start, end in _marks(r):
        if end is None:
            raise MissingMark(f"the end of {phase}")
        out.append({"phase": phase, "s": end - previous,
                    "hop_s": own_start - previous if own_start is not None else None})
        previous = end
    return {"total_s": previous - r["queued"], "phases": out}
