"""Run records: what the report knows about one run of a sweep (docs/contracts.md, "Scaling sweeps").

A record is built from the run's sweep index entry, its DagRun state and its tasks' XComs. Any
part may be missing (a failed or still running run): every field is then None.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ultracluster.run.clock import parse_time
from ultracluster.run.states import run_state_name

# The source DAG's tasks whose XComs feed a record.
XCOM_TASKS = ("preflight", "pcluster_create", "wait_for_fleet", "train", "collect_results", "delete_cluster")


def _iso(value: Any) -> str | None:
    moment = parse_time(value)
    return moment.isoformat() if moment else None


def _dict(value: Any) -> dict[str, Any]:
    # xcom_pull of a task with no XCom answers None or [] (no map index); one value may come as [v].
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return dict(value) if isinstance(value, Mapping) else {}


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def run_record(index_entry: Mapping[str, Any], state: Any, xcoms: Mapping[str, Any]) -> dict[str, Any]:
    """One run of a sweep.

    :param index_entry: the run's sweep index JSON ``{"dag_id", "run_id", "point", "plan",
        "estimate", "written_at"}``.
    :param state: the DagRun's state (``success``/``failed``/``running``/``queued``; None: no such run).
    :param xcoms: task id -> that task's return value in the run (see ``XCOM_TASKS``).
    """
    preflight = _dict(xcoms.get("preflight"))
    created, ready = _dict(xcoms.get("pcluster_create")), _dict(xcoms.get("wait_for_fleet"))
    train, deleted = _dict(xcoms.get("train")), _dict(xcoms.get("delete_cluster"))
    metrics = _dict(xcoms.get("collect_results"))
    plan = _dict(preflight.get("plan")) or _dict(index_entry.get("plan"))
    point = _dict(_first(index_entry.get("point"), plan.get("sweep_point"), metrics.get("sweep")))
    return {
        "run_id": index_entry.get("run_id"),
        "dag_id": index_entry.get("dag_id"),
        "written_at": _iso(index_entry.get("written_at")),
        "state": run_state_name(state),
        "point": point or None,
        "scaling_mode": _first(point.get("scaling_mode"), plan.get("scaling_mode"), metrics.get("scaling_mode")),
        "nodes": _first(metrics.get("nodes"), plan.get("num_nodes"), point.get("num_nodes")),
        "world_size": metrics.get("world_size"),
        "global_batch": metrics.get("global_batch"),
        "average_throughput_seq_per_s": metrics.get("average_throughput_seq_per_s"),
        "peak_throughput_seq_per_s": metrics.get("peak_throughput_seq_per_s"),
        "time_to_train_min": metrics.get("time_to_train_min"),
        "time_to_train_extrapolated": metrics.get("time_to_train_extrapolated"),
        "final_loss": metrics.get("final_loss"),
        # What trained, from results.json (run.contracts.model_name, device_of).
        "model": metrics.get("model"),
        "device": metrics.get("device"),
        "steps": _first(train.get("steps"), metrics.get("steps")),
        "cluster_created_at": _iso(created.get("created_at")),
        "cluster_deleted_at": _iso(deleted.get("deleted_at")),
        "fleet_ready_at": _iso(ready.get("ready_at")),
        "train_started_at": _iso(train.get("started_at")),
        "train_ended_at": _iso(train.get("ended_at")),
        "instance_type": plan.get("instance_type"),
        "head_node_instance_type": plan.get("head_node_instance_type"),
        "fsx_storage_capacity_gib": plan.get("fsx_storage_capacity_gib"),
        "node_hours": metrics.get("node_hours"),
        "cost_usd": metrics.get("cost_usd"),
        # delete_cluster's bill from EC2 instance lives (None: not deleted yet, or EC2 unreadable).
        "usage": deleted.get("usage") or None,
        # Training is over and its results are in S3: a running run is only tearing down.
        "results_collected": bool(metrics),
        "estimate": _dict(_first(preflight.get("estimate"), index_entry.get("estimate"))) or None,
    }


def point_nodes(record: Mapping[str, Any]) -> int | None:
    """The node count of the sweep point a run trained."""
    nodes = _first((record.get("point") or {}).get("num_nodes"), record.get("nodes"))
    return int(nodes) if nodes is not None else None


def chosen_run(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run a point's row shows: its latest successful run, else its latest run (oldest first)."""
    successes = [run for run in runs if run["state"] == "success"]
    return (successes or runs or [None])[-1]
