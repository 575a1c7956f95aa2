"""Scaling sweeps: which point a run trains, and the sweep index that lists its runs.

A sweep is ``{"id", "num_nodes": [points], "scaling_mode"}`` in the ``sweep`` param. A run trains
one point:
- named explicitly (fan-out: manual and REST runs): ``"point": {"num_nodes": 4}``;
- or picked from its logical date (backfills): the index of the schedule tick since ``ORIGIN``,
  modulo the number of points. Any ``len(num_nodes)`` consecutive ticks cover every point once,
  from whichever point the first tick falls on: the Task SDK (Airflow 3.3) tells a run its
  ``run_type`` but not its backfill or the backfill's ``from_date``, so a run cannot count from there.

The sweep index: preflight writes one entry per run of a sweep (``write_index_entry``) at
``<artifacts>/sweeps/<dag_id>/<sweep_id>/runs/<run slug>.json``; the report, the network holder and
the CLI read them back (``read_index``). Both take an S3Hook (or anything with its methods).
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

from ultracluster.run.clock import utc_now
from ultracluster.run.names import safe_run_id
from ultracluster.run.s3 import join_key, split_s3_uri
from ultracluster.run.states import RUN_ENDED

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
        # "shared": every point trains on one cluster, trn1_sweep_cluster's (run.shared_cluster).
        "cluster": {"enum": ["own", "shared"]},
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


def describe_point(point: dict) -> str:
    """The log line of a run's point: ``sweep s1: point 3/5 -> num_nodes=8``."""
    return (f"sweep {point['id']}: point {point['index'] + 1}/{point['count']} -> num_nodes={point['num_nodes']}"
            f" (points {point['points']}, picked by {point['chosen_by'].replace('_', ' ')})")


def sweep_location(artifacts_s3_uri: str, area: str, dag_id: str, sweep_id: str) -> tuple[str, str]:
    """Bucket and prefix of a sweep's files: ``<prefix>/<area>/<dag_id>/<sweep_id>``, where area is
    ``sweeps`` (the index of its runs, under ``runs/``) or ``reports``."""
    bucket, prefix = split_s3_uri(artifacts_s3_uri)
    return bucket, join_key(prefix, area, dag_id, sweep_id)


def index_uri(artifacts_s3_uri: str, dag_id: str, sweep_id: str) -> str:
    bucket, prefix = sweep_location(artifacts_s3_uri, "sweeps", dag_id, sweep_id)
    return f"s3://{bucket}/{prefix}/runs/"


def write_index_entry(s3: Any, artifacts_s3_uri: str, dag_id: str, run_id: str, plan: dict[str, Any],
                      estimate: dict[str, Any]) -> str:
    """Record a run under its sweep (``plan["sweep_point"]``); returns the entry's URI."""
    point = plan["sweep_point"]
    bucket, prefix = sweep_location(artifacts_s3_uri, "sweeps", dag_id, point["id"])
    key = f"{prefix}/runs/{safe_run_id(run_id)}.json"
    entry = {"dag_id": dag_id, "run_id": run_id, "point": point, "plan": plan, "estimate": estimate,
             "written_at": utc_now()}
    s3.load_string(json.dumps(entry, default=str), key, bucket, replace=True)
    return f"s3://{bucket}/{key}"


def read_index(s3: Any, artifacts_s3_uri: str, dag_id: str, sweep_id: str, log: Any) -> list[dict[str, Any]]:
    """The sweep's index entries, oldest first (by ``written_at``); unreadable ones are logged and skipped."""
    bucket, prefix = sweep_location(artifacts_s3_uri, "sweeps", dag_id, sweep_id)
    entries = []
    for key in s3.list_keys(bucket_name=bucket, prefix=f"{prefix}/runs/") or []:
        if not key.endswith(".json"):
            continue
        try:
            entry = json.loads(s3.read_key(key, bucket_name=bucket))
        except ValueError as err:
            log.warning("Skipping s3://%s/%s: not JSON (%s)", bucket, key, err)
            continue
        if not isinstance(entry, dict) or not entry.get("run_id"):
            log.warning("Skipping s3://%s/%s: no run_id", bucket, key)
            continue
        entries.append(entry)
    return sorted(entries, key=lambda e: (str(e.get("written_at") or ""), e["run_id"]))


# The holders' verdicts (operators.sweep_network: the network or the cluster): hold on, release it, or
# give up holding.
HOLD, RELEASE, GIVE_UP = "hold", "release", "give_up"


def on_network(entries: list[dict[str, Any]], vpc_id: str | None) -> list[dict[str, Any]]:
    """The sweep index's runs that adopted the shared network ``vpc_id``."""
    return [e for e in entries if (e.get("plan") or {}).get("existing_vpc_id") == vpc_id]


def on_held(entries: list[dict[str, Any]], vpc_id: str | None, cluster_name: str | None) -> list[dict[str, Any]]:
    """The sweep index's runs on what a holder holds: its cluster when it holds one, else its network."""
    if cluster_name:
        return [e for e in entries if (e.get("plan") or {}).get("existing_cluster_name") == cluster_name]
    return on_network(entries, vpc_id)


def network_hold(entries: list[dict[str, Any]], states: dict[str, str], *, vpc_id: str | None, sweep_id: str,
                 points: int, held_s: float, max_hold_hours: float, cluster_name: str | None = None,
                 ) -> tuple[str, dict[str, Any], list[str]]:
    """(verdict, the holder's return value, the runs still open) for a sweep's shared network, or its
    shared cluster (``cluster_name``): ``entries``, the sweep index; ``states``, run id ->
    ``states.run_state_name``. Released once the index lists ``points`` runs on it and all of them have
    ended (a run that no longer exists, "missing", has ended too)."""
    mine = {e["run_id"]: states.get(e["run_id"], "missing") for e in on_held(entries, vpc_id, cluster_name)}
    open_runs = sorted(run for run, state in mine.items() if state not in (*RUN_ENDED, "missing"))
    summary: dict[str, Any] = {"vpc_id": vpc_id, "sweep_id": sweep_id, "runs": mine, "expected": int(points),
                               **({"cluster_name": cluster_name} if cluster_name else {})}
    if len(mine) >= int(points) and not open_runs:
        return RELEASE, summary, open_runs
    if held_s > float(max_hold_hours) * 3600:
        return GIVE_UP, {**summary, "gave_up": True}, open_runs
    return HOLD, summary, open_runs
