"""The report's table: one row per sweep point, scaling efficiency, time and cost."""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from ultracluster.report import hardware
from ultracluster.report.records import chosen_run, point_nodes
from ultracluster.run.clock import minutes_between
from ultracluster.run.cost import run_cost
from ultracluster.run.shared_cluster import overhead
from ultracluster.run.states import RUN_ENDED

EFFICIENCY_FORMULAS = {
    "strong": "T1·N1 / (TN·N), T = time to train, against the smallest successful point (N1 nodes)",
    "weak": "throughputN / ((N/N1)·throughput1), against the smallest successful point (N1 nodes)",
}
TEARING_DOWN = "training done, cluster being torn down"


def _common(values: Iterable[Any]) -> tuple[Any, bool]:
    """The most common non-null value, and whether there were several different ones."""
    counts = Counter(v for v in values if v is not None)
    return (counts.most_common(1)[0][0] if counts else None), len(counts) > 1


def _cost(run: Mapping[str, Any], nodes: int | None, wall_min: float | None,
          prices: Mapping[str, Any]) -> tuple[dict[str, Any], str | None, float | None]:
    """Cost, its basis and the node hours it bills: what EC2 says the cluster's instances used
    (``ec2_instances``) or, on an existing cluster, what the run's Slurm jobs used (``slurm_jobs``),
    else the run's node hours, else nodes x (fleet ready -> train end) from its timestamps
    (``wall_times``, an estimate), else the cost the run recorded itself."""
    usage = run.get("usage") or {}
    if usage.get("usd") is not None:
        return ({"usd": usage["usd"], "node_usd": usage.get("compute_usd"), "head_node_usd": usage.get("head_node_usd"),
                 "fsx_usd": usage.get("fsx_usd")}, usage.get("basis") or "ec2_instances", usage.get("compute_node_hours"))
    node_hours, basis = run.get("node_hours"), "node_hours"
    if node_hours is None:
        busy = minutes_between(run.get("fleet_ready_at"), run.get("train_ended_at"))
        node_hours, basis = (nodes * busy / 60, "wall_times") if busy is not None and nodes else (None, None)
    cost = run_cost(run.get("instance_type"), node_hours, run.get("head_node_instance_type"),
                    None if wall_min is None else wall_min / 60, run.get("fsx_storage_capacity_gib"), prices)
    if cost["usd"] is None:
        recorded = run.get("cost_usd")
        cost, basis = {"usd": recorded, "node_usd": None, "head_node_usd": None, "fsx_usd": None}, (
            "recorded" if recorded is not None else None)
    return cost, basis, node_hours


_EMPTY = dict.fromkeys((
    "world_size", "global_batch", "average_throughput_seq_per_s", "peak_throughput_seq_per_s",
    "time_to_train_min", "time_to_train_extrapolated", "final_loss", "efficiency", "cluster_wall_min",
    "idle_fleet_min", "idle_before_train_min", "idle_after_train_min", "node_hours", "cost_usd",
    "cost_basis", "cost", "run_id", "instance_type", "scaling_mode", "model", "device"))


def _row(index: int | None, nodes: int | None, runs: list[dict[str, Any]], prices: Mapping[str, Any]) -> dict:
    notes = [f"point ran {len(runs)} times"] if len(runs) > 1 else []
    if index is None:
        notes.append("not one of the sweep's points")
    run = chosen_run(runs)
    if run is None:
        return {**_EMPTY, "index": index, "nodes": nodes, "status": "missing", "runs": 0, "notes": notes}
    wall = minutes_between(run.get("cluster_created_at"), run.get("cluster_deleted_at"))
    before = minutes_between(run.get("fleet_ready_at"), run.get("train_started_at"))
    after = minutes_between(run.get("train_ended_at"), run.get("cluster_deleted_at"))
    cost, basis, node_hours = _cost(run, nodes, wall, prices)
    if run["state"] == "running" and run.get("results_collected"):
        notes.append(TEARING_DOWN)
    return {
        **{key: run.get(key) for key in _EMPTY if key in run},
        "index": index, "nodes": nodes, "efficiency": None, "cluster_wall_min": wall,
        "idle_fleet_min": None if None in (before, after) else before + after,
        "idle_before_train_min": before, "idle_after_train_min": after,
        "node_hours": node_hours, "cost_usd": cost["usd"], "cost_basis": basis, "cost": cost,
        "status": run["state"], "runs": len(runs), "notes": notes,
    }


def add_efficiency(rows: list[dict[str, Any]], scaling_mode: str | None) -> int | None:
    """Set each successful row's ``efficiency`` (see ``EFFICIENCY_FORMULAS``); returns N1, the
    baseline's node count (None: no baseline, or the scaling mode is unknown)."""
    key = {"strong": "time_to_train_min", "weak": "average_throughput_seq_per_s"}.get(scaling_mode or "")
    usable = [r for r in rows if key and r["status"] == "success" and r["nodes"] and r.get(key)]
    if not usable:
        return None
    base = min(usable, key=lambda r: r["nodes"])
    n1, v1 = base["nodes"], base[key]
    for row in usable:
        n, v = row["nodes"], row[key]
        row["efficiency"] = v1 * n1 / (v * n) if scaling_mode == "strong" else v / ((n / n1) * v1)
    return n1


def build_rows(sweep_points: Sequence[int], records: Iterable[Mapping[str, Any]],
               prices: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per point, in the sweep's order (a point without a run is "missing"), then rows of
    runs of other node counts. A point that ran several times shows its latest successful run.
    Records are ordered by ``written_at`` (when the run was indexed)."""
    records = sorted(records, key=lambda r: r.get("written_at") or "")
    by_nodes: dict[int | None, list[dict[str, Any]]] = {}
    for record in records:
        by_nodes.setdefault(point_nodes(record), []).append(dict(record))
    points = [int(n) for n in sweep_points]
    extra = [n for n in by_nodes if n not in points]
    rows = [_row(i, n, by_nodes.get(n, []), prices) for i, n in enumerate(points)]
    rows += [_row(None, n, by_nodes[n], prices) for n in extra]
    add_efficiency(rows, sweep_scaling_mode(records)[0])
    return rows


def sweep_scaling_mode(records: Iterable[Mapping[str, Any]]) -> tuple[str | None, bool]:
    """The sweep's scaling mode, and whether its runs disagree (then no efficiency is computed)."""
    mode, mixed = _common(r.get("scaling_mode") for r in records)
    return (None, True) if mixed else (mode, False)


def pending(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows whose run has not ended (missing, queued, running); ``tearing_down``: only the
    cluster's deletion is left (the results are in)."""
    return [{"nodes": r["nodes"], "status": r["status"], "run_id": r.get("run_id"),
             "tearing_down": TEARING_DOWN in r["notes"]}
            for r in rows if r["status"] not in RUN_ENDED]


def make_report(sweep_id: str, source_dag_id: str, sweep_points: Sequence[int],
                records: Sequence[Mapping[str, Any]], prices: Mapping[str, Any], *,
                partial: bool = False, generated_at: datetime | None = None,
                shared_cluster: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Everything the renderers show: rows, efficiency baseline, reference points, what is pending.
    ``shared_cluster``: ``{"cluster_name", "usage"}`` when the points trained on one cluster (its
    usage None while it is up): the report adds its overhead (``run.shared_cluster.overhead``)."""
    rows = build_rows(sweep_points, records, prices)
    mode, mixed_modes = sweep_scaling_mode(records)
    instance_type, mixed_types = _common(r.get("instance_type") for r in rows if r["status"] == "success")
    instance_type = instance_type or _common(r.get("instance_type") for r in rows)[0]
    # What really trained, as the runs' results.json say (none before a run has results).
    model, mixed_models = _common(r.get("model") for r in rows)
    device, mixed_devices = _common(r.get("device") for r in rows)
    baseline = min((r["nodes"] for r in rows if r["efficiency"] is not None), default=None)
    notes = []
    if mixed_modes:
        notes.append("the runs used different scaling modes: no efficiency computed")
    if mixed_types:
        notes.append("the successful runs used different instance types")
    mixed = [what for what, differ in (("model", mixed_models), ("device", mixed_devices)) if differ]
    notes += hardware.notes(prices, model, device, instance_type, mixed=mixed)
    return {
        "title": hardware.title(sweep_id, model, device),
        "sweep_id": sweep_id,
        "source_dag_id": source_dag_id,
        "generated_at": (generated_at or datetime.now(timezone.utc)).isoformat(),
        "partial": partial,
        "scaling_mode": mode,
        "instance_type": instance_type,
        "model": model,
        "device": device,
        "points": [int(n) for n in sweep_points],
        "baseline_nodes": baseline,
        "efficiency_formula": EFFICIENCY_FORMULAS.get(mode or ""),
        "rows": rows,
        "references": hardware.references(prices, model, device, instance_type),
        "pending": pending(rows),
        "notes": notes,
        "prices": {"source": prices.get("source"), "as_of": prices.get("as_of"), "file": prices.get("file")},
        "shared_cluster": None if shared_cluster is None else {
            "cluster_name": shared_cluster.get("cluster_name"),
            "overhead": overhead(shared_cluster.get("usage"), [
                {"usd": r.get("cost_usd"), "compute_node_hours": r.get("node_hours")} for r in rows]),
        },
    }
