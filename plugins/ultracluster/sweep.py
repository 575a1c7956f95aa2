"""Scaling sweeps: which point a run trains, and the run's plan (the params with its point applied).

A sweep is ``{"id", "num_nodes": [points], "scaling_mode"}`` in the ``sweep`` param. A run trains
one point:
- named explicitly (fan-out: manual and REST runs): ``"point": {"num_nodes": 4}``;
- or picked from its logical date (backfills): the index of the schedule tick since ``ORIGIN``,
  modulo the number of points. Any ``len(num_nodes)`` consecutive ticks cover every point once.

Stdlib only: imported at DAG parse time (the params' schema) and by every task's templates.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from ultracluster.s3_uri import split_s3_uri

# A Sunday 00:00 UTC: a tick of the DAG's weekly schedule, so tick indexes are whole numbers.
ORIGIN = datetime(2023, 1, 1, tzinfo=timezone.utc)
SWEEP_ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,39}$"
MAX_POINTS = 32

_NODES = {"type": "integer", "minimum": 1, "maximum": 512}
SWEEP_SCHEMA: dict[str, Any] = {
    "type": ["null", "object"],
    "required": ["id"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": "string", "pattern": SWEEP_ID_PATTERN},
        "num_nodes": {"type": "array", "items": _NODES, "minItems": 1, "maxItems": MAX_POINTS, "uniqueItems": True},
        "scaling_mode": {"enum": ["strong", "weak"]},
        "point": {"type": "object", "required": ["num_nodes"], "additionalProperties": False,
                  "properties": {"num_nodes": _NODES}},
    },
    # A sweep needs its points, or the one point this run trains.
    "anyOf": [{"required": ["num_nodes"]}, {"required": ["point"]}],
}


class SweepError(ValueError):
    """A sweep conf the schema accepts but that names no trainable point (deterministic)."""


def tick_index(logical_date: datetime, period: timedelta, origin: datetime = ORIGIN) -> int:
    """Whole schedule ticks from ``origin`` to ``logical_date`` (rounded: a tick is never split)."""
    if logical_date.tzinfo is None:
        logical_date = logical_date.replace(tzinfo=timezone.utc)
    # In seconds: pendulum's intervals (Airflow's logical dates) cannot divide by a timedelta.
    return round((logical_date - origin).total_seconds() / period.total_seconds())


def sweep_point(sweep: dict | None, logical_date: datetime | None, period: timedelta) -> dict | None:
    """The point this run trains: ``{"id", "index", "count", "points", "num_nodes", "scaling_mode",
    "chosen_by"}``; None outside a sweep. ``index`` is 0-based; ``points`` keeps the sweep's order."""
    if not sweep:
        return None
    points = [int(n) for n in sweep.get("num_nodes") or []]
    base = {"id": sweep["id"], "scaling_mode": sweep.get("scaling_mode")}
    point = sweep.get("point")
    if point:
        nodes = int(point["num_nodes"])
        if points and nodes not in points:
            raise SweepError(f"sweep {sweep['id']}: point num_nodes={nodes} is not one of its points {points}")
        points = points or [nodes]
        return {**base, "index": points.index(nodes), "count": len(points), "points": points,
                "num_nodes": nodes, "chosen_by": "point"}
    if not points:
        raise SweepError(f"sweep {sweep['id']}: no points (num_nodes) and no point")
    if logical_date is None:
        raise SweepError(f"sweep {sweep['id']}: a run without a logical date must name its point "
                         '(e.g. "point": {"num_nodes": 4})')
    index = tick_index(logical_date, period) % len(points)
    return {**base, "index": index, "count": len(points), "points": points, "num_nodes": points[index],
            "chosen_by": "logical_date"}


def run_plan(params: dict[str, Any], logical_date: datetime | None, period: timedelta) -> dict[str, Any]:
    """The params this run trains with: a sweep point sets num_nodes, sizes the cluster to it
    (max_nodes = the point, or min_nodes when that is larger) and sets the sweep's scaling_mode.
    Each point has a cluster of its own, so a larger MaxCount would never be used, yet would count
    against the node cap (which adds up MaxCounts). Every later task reads the plan, never the params."""
    plan = dict(params)
    point = sweep_point(params.get("sweep"), logical_date, period)
    if point:
        plan["num_nodes"] = point["num_nodes"]
        min_nodes = plan.get("min_nodes") if isinstance(plan.get("min_nodes"), int) else 0
        plan["max_nodes"] = max(point["num_nodes"], min_nodes)
        if point["scaling_mode"]:
            plan["scaling_mode"] = point["scaling_mode"]
    plan["sweep_point"] = point
    return plan


def describe_point(point: dict) -> str:
    """The log line of a run's point: ``sweep s1: point 3/5 -> num_nodes=8``."""
    return (f"sweep {point['id']}: point {point['index'] + 1}/{point['count']} -> num_nodes={point['num_nodes']}"
            f" (points {point['points']}, picked by {point['chosen_by'].replace('_', ' ')})")


def sweep_location(artifacts_s3_uri: str, area: str, dag_id: str, sweep_id: str) -> tuple[str, str]:
    """Bucket and prefix of a sweep's files: ``<prefix>/<area>/<dag_id>/<sweep_id>``, where area is
    ``sweeps`` (the index of its runs, under ``runs/``) or ``reports``."""
    bucket, prefix = split_s3_uri(artifacts_s3_uri)
    return bucket, "/".join(p for p in (prefix.strip("/"), area, dag_id, sweep_id) if p)


def plan_of(ti: Any) -> dict[str, Any]:
    """The run's plan as the preflight task returned it (the DAG's ``plan(ti)`` template macro)."""
    result = ti.xcom_pull(task_ids="preflight")
    if not result:
        raise RuntimeError("no plan: the preflight task has not run in this DAG run")
    return result["plan"]
