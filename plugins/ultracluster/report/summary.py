"""One run's summary: what a user asks of a finished run (the client's end-of-run lines).

Built from the run's task XComs with the report's own record and row, so a run and a sweep report
never disagree on a number.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ultracluster.report.records import point_nodes, run_record
from ultracluster.report.table import build_rows


def run_summary(state: Any, xcoms: Mapping[str, Any], prices: Mapping[str, Any]) -> dict[str, Any]:
    """``state``: the run's state; ``xcoms``: task id -> return value (``records.XCOM_TASKS``)."""
    record = run_record({}, state, xcoms)
    nodes = point_nodes(record)
    row = build_rows([nodes] if nodes else [], [record], prices)[0]
    usage = record.get("usage") or {}
    return {
        **{key: row.get(key) for key in (
            "nodes", "world_size", "global_batch", "average_throughput_seq_per_s", "peak_throughput_seq_per_s",
            "time_to_train_min", "time_to_train_extrapolated", "final_loss", "cluster_wall_min", "idle_fleet_min",
            "idle_before_train_min", "idle_after_train_min", "cost_usd", "cost_basis", "cost")},
        "instance_hours": usage.get("instance_hours"), "compute_node_hours": usage.get("compute_node_hours"),
        "head_node_hours": usage.get("head_node_hours"), "instances": usage.get("instances"),
        "estimate_usd": (record.get("estimate") or {}).get("usd"),
        "existing_cluster": record.get("existing_cluster"),
    }


def _num(value: Any, fmt: str = ",.2f") -> str:
    return "-" if value is None else format(value, fmt)


def summary_lines(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(label, text)`` pairs, in reading order."""
    cost = summary.get("cost") or {}
    basis = {"ec2_instances": "from EC2 instance lives", "slurm_jobs": "from the run's Slurm jobs' node-hours",
             "wall_times": "estimated from wall times",
             "node_hours": "from the run's node hours", "recorded": "as recorded"}.get(summary.get("cost_basis"), "")
    ttt = _num(summary.get("time_to_train_min")) + (" (extrapolated)" if summary.get("time_to_train_extrapolated") else "")
    existing = summary.get("existing_cluster")
    return [
        *([("cluster", f"existing {existing} (not created, changed or deleted by this run)")] if existing else []),
        ("nodes", f"{_num(summary.get('nodes'), 'd')} (world size {_num(summary.get('world_size'), 'd')}, "
                  f"global batch {_num(summary.get('global_batch'), ',d')})"),
        ("throughput", f"{_num(summary.get('average_throughput_seq_per_s'), ',.1f')} seq/s average, "
                       f"{_num(summary.get('peak_throughput_seq_per_s'), ',.1f')} peak"),
        ("time to train", f"{ttt} min"),
        ("final loss", _num(summary.get("final_loss"))),
        ("cluster wall time", f"{_num(summary.get('cluster_wall_min'))} min (create to delete)"),
        ("idle fleet", f"{_num(summary.get('idle_fleet_min'))} min (fleet ready to train "
                       f"{_num(summary.get('idle_before_train_min'))}, train end to delete "
                       f"{_num(summary.get('idle_after_train_min'))})"),
        ("instance-hours", f"{_num(summary.get('instance_hours'), ',.3f')} (compute nodes "
                           f"{_num(summary.get('compute_node_hours'), ',.3f')}, head node "
                           f"{_num(summary.get('head_node_hours'), ',.3f')}; {_num(summary.get('instances'), 'd')} instances)"),
        ("cost", f"${_num(summary.get('cost_usd'))} {basis} (compute ${_num(cost.get('node_usd'))}, head node "
                 f"${_num(cost.get('head_node_usd'))}, FSx ${_num(cost.get('fsx_usd'))}); "
                 f"preflight estimated ${_num(summary.get('estimate_usd'))}"),
    ]
