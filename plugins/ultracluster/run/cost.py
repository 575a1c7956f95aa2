"""What a training run costs: an estimate before it runs, and the cost of what it used.

Prices come from ``include/cluster/prices.json`` (on-demand, us-east-1, USD) or the file named by
``$ULTRACLUSTER_PRICES_FILE``: ``{"instances": {type: {"usd_per_hour", "vcpus",
["reference_seq_per_s_per_node"]}}, "fsx_lustre_scratch2_usd_per_gb_month", "hours_per_month",
"references": [...], "source", "as_of"}``.

preflight, the budget guard, delete_cluster, collect_results (a run on an existing cluster) and the
scaling report all price with this module.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from ultracluster.run.clock import minutes_between
from ultracluster.run.profiles import include_dir

PRICES_ENV_VAR = "ULTRACLUSTER_PRICES_FILE"
# Cluster creation, fleet start and the Neuron compile: paid for, but not training.
DEFAULT_OVERHEAD_HOURS = 0.5
# Training workers (NeuronCores) per node: torchrun starts one per core.
WORKERS_PER_NODE = {"trn1.32xlarge": 32, "trn1n.32xlarge": 32, "trn1.2xlarge": 2}


# In place of a prices file that cannot be read: hours still count, every cost is unknown (None).
NO_PRICES: dict[str, Any] = {"instances": {}, "fsx_lustre_scratch2_usd_per_gb_month": 0, "hours_per_month": 730}


class PriceError(ValueError):
    """The prices file is missing or malformed, or has no price the computation needs."""


def prices_path(path: str | os.PathLike | None = None) -> Path:
    """``path``, else ``$ULTRACLUSTER_PRICES_FILE``, else include/cluster/prices.json."""
    return Path(path or os.environ.get(PRICES_ENV_VAR) or include_dir() / "cluster" / "prices.json")


def load_prices(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The prices file (see ``prices_path``), keys starting with "_" (comments) dropped."""
    where = prices_path(path)
    try:
        raw = json.loads(where.read_text())
    except (OSError, ValueError) as err:  # missing, unreadable or not JSON
        raise PriceError(f"Cannot read the prices file {where} (override: {PRICES_ENV_VAR}): {err}") from err
    instances = raw.get("instances") if isinstance(raw, dict) else None
    if not isinstance(instances, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("usd_per_hour"), (int, float)) for v in instances.values()):
        raise PriceError(f"Prices file {where}: 'instances' must map each type to {{\"usd_per_hour\": number}}")
    for key in ("fsx_lustre_scratch2_usd_per_gb_month", "hours_per_month"):
        if not isinstance(raw.get(key), (int, float)) or raw[key] < 0:
            raise PriceError(f"Prices file {where}: {key} must be a number >= 0")
    prices = {k: v for k, v in raw.items() if not k.startswith("_")}
    prices["file"] = str(where)
    return prices


def prices_for_billing(warn: Callable[[str], Any], counted: str) -> dict[str, Any]:
    """``load_prices()`` for a bill, else ``NO_PRICES``: the bill keeps its ``counted`` hours
    ("Node-hours", "Instance-hours") and says why it has no cost; a bill never fails a run."""
    try:
        return load_prices()
    except PriceError as err:
        warn(f"{counted} only, no cost: {err}")
        return NO_PRICES


def _hourly(prices: dict[str, Any], instance_type: str | None) -> float | None:
    entry = prices["instances"].get(instance_type or "")
    return float(entry["usd_per_hour"]) if entry else None


def _money(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def run_cost(instance_type: str | None, node_hours: float | None, head_node_type: str | None,
             cluster_hours: float | None, fsx_gib: float | None, prices: dict[str, Any]) -> dict[str, Any]:
    """Cost of what a run used: ``{"usd", "node_usd", "head_node_usd", "fsx_usd"}`` (USD, cents).

    Compute nodes bill ``node_hours``; the head node and FSx for Lustre bill the cluster's life
    (``cluster_hours``), FSx pro rata of a month. A part whose input or price is unknown is None;
    ``usd`` adds the known parts and is None when the node part (nearly all of it) is unknown.
    """
    node_rate, head_rate = _hourly(prices, instance_type), _hourly(prices, head_node_type)
    node_usd = node_hours * node_rate if None not in (node_hours, node_rate) else None
    head_usd = cluster_hours * head_rate if None not in (cluster_hours, head_rate) else None
    fsx_usd = None
    if None not in (cluster_hours, fsx_gib):
        fsx_usd = (float(fsx_gib) * float(prices["fsx_lustre_scratch2_usd_per_gb_month"]) * cluster_hours
                   / float(prices["hours_per_month"]))
    usd = None if node_usd is None else node_usd + (head_usd or 0.0) + (fsx_usd or 0.0)
    return {"usd": _money(usd), "node_usd": _money(node_usd), "head_node_usd": _money(head_usd),
            "fsx_usd": _money(fsx_usd)}


def instance_usage(lives: list[dict[str, Any]], prices: dict[str, Any],
                   fsx_gib: float | None = None) -> dict[str, Any]:
    """What a cluster used and cost, from its instances' own lives (``parsers.ec2.instance_life``).

    Each instance bills its hours at its type's price; FSx bills the head node's life (the head node
    lives as long as the cluster). ``unpriced_types`` lists types the prices file lacks: their hours
    count, their cost does not, and ``usd`` is None when a compute type is unpriced.
    :return: ``{"basis": "ec2_instances", "instances", "instance_hours", "compute_node_hours",
        "head_node_hours", "compute_usd", "head_node_usd", "fsx_usd", "usd", "unpriced_types",
        "unended"}`` (hours to 4 places, USD to cents); ``unended``: instances counted up to now.
    """
    hours = {"Compute": 0.0, "HeadNode": 0.0, "other": 0.0}
    usd = {"Compute": 0.0, "HeadNode": 0.0, "other": 0.0}
    unpriced: set[str] = set()
    for life in lives:
        kind = life["node_type"] if life["node_type"] in ("Compute", "HeadNode") else "other"
        spent = float(life.get("hours") or 0.0)
        hours[kind] += spent
        rate = _hourly(prices, life.get("instance_type"))
        if rate is None:
            unpriced.add(str(life.get("instance_type")))
        else:
            usd[kind] += spent * rate
    fsx_usd = None
    if fsx_gib and hours["HeadNode"]:
        fsx_usd = (float(fsx_gib) * float(prices["fsx_lustre_scratch2_usd_per_gb_month"]) * hours["HeadNode"]
                   / float(prices["hours_per_month"]))
    compute_unpriced = any(_hourly(prices, life.get("instance_type")) is None
                           for life in lives if life["node_type"] == "Compute")
    total = None if compute_unpriced else sum(usd.values()) + (fsx_usd or 0.0)
    return {
        "basis": "ec2_instances", "instances": len(lives),
        "instance_hours": round(sum(hours.values()), 4), "compute_node_hours": round(hours["Compute"], 4),
        "head_node_hours": round(hours["HeadNode"], 4), "compute_usd": _money(usd["Compute"]),
        "head_node_usd": _money(usd["HeadNode"]), "fsx_usd": _money(fsx_usd), "usd": _money(total),
        "unpriced_types": sorted(unpriced), "unended": sum(1 for life in lives if life.get("ended") != "yes"),
        # When the last instance ended (None while any runs): the cluster's end, as EC2 saw it.
        "ended_at": None if not lives or any(life.get("ended") != "yes" for life in lives)
        else max(life["ended_at"] for life in lives),
    }


def job_usage(jobs: list[dict[str, Any]], instance_type: str | None, prices: dict[str, Any],
              source: str) -> dict[str, Any]:
    """What a run on an existing cluster used and cost: its own Slurm jobs' node-hours (each job's
    elapsed time x its nodes) at ``instance_type``'s price. The cluster's head node and shared
    storage outlive the run, and are not its bill.

    :param jobs: ``[{"job_id", "name", "state", "elapsed_s", "nodes"}]`` (``parsers.slurm.parse_sacct_usage``,
        or ``task_span_jobs``).
    :param source: where the jobs' times come from: ``sacct``; without accounting ``job_markers`` (the
        markers the job writes as it starts and ends) or ``task_spans``.
    :return: ``instance_usage``'s keys (``basis`` ``slurm_jobs``; the head node's and FSx's None) plus
        ``source`` and ``jobs``.
    """
    hours = sum(max(0, int(j.get("elapsed_s") or 0)) * max(0, int(j.get("nodes") or 0)) for j in jobs) / 3600
    rate = _hourly(prices, instance_type)
    usd = None if rate is None else _money(hours * rate)
    return {
        "basis": "slurm_jobs", "source": source, "jobs": [dict(j) for j in jobs], "instances": None,
        "instance_hours": round(hours, 4), "compute_node_hours": round(hours, 4), "head_node_hours": None,
        "compute_usd": usd, "head_node_usd": None, "fsx_usd": None, "usd": usd,
        "unpriced_types": [] if rate is not None else [str(instance_type)], "unended": 0, "ended_at": None,
    }


def task_span_jobs(results: list[Any], nodes: int, ran_s: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    """Jobs as their tasks saw them (SlurmJobOperator's XComs: submission to the end seen), each on
    ``nodes`` nodes: the bill of a cluster without Slurm accounting. ``ran_s``: job id -> the seconds
    it ran, from its start and exit markers (``job_marker_seconds``): a job that queued behind others
    (a sweep's shared cluster) is billed its run, not its wait."""
    jobs = []
    for result in results:
        if not isinstance(result, dict) or not result.get("job_id"):
            continue
        minutes = minutes_between(result.get("started_at"), result.get("ended_at"))
        elapsed = (ran_s or {}).get(str(result["job_id"]))
        jobs.append({"job_id": str(result["job_id"]), "name": result.get("job_name"), "state": result.get("state"),
                     "elapsed_s": round((minutes or 0) * 60) if elapsed is None else int(elapsed),
                     "nodes": int(nodes)})
    return jobs


def job_marker_seconds(times: Mapping[str, int], markers: Mapping[str, tuple[str, str]]) -> dict[str, int]:
    """job id -> seconds between its start marker (the name file the job writes as it starts) and its
    exit marker, from their modification times (``times``: path -> epoch seconds); jobs without both
    are left out."""
    found = {}
    for job_id, (name_file, exit_file) in markers.items():
        if name_file in times and exit_file in times and times[exit_file] >= times[name_file]:
            found[job_id] = times[exit_file] - times[name_file]
    return found


def global_batch(plan: dict[str, Any], world_size: int) -> int:
    """Sequences per optimizer step. Strong scaling splits the accumulation micro-steps over the
    nodes (the training script does, to keep the global batch fixed); weak scaling does not."""
    accumulation = int(plan["grad_accum_usteps"])
    if plan.get("scaling_mode") == "strong":
        accumulation = max(1, accumulation // int(plan["num_nodes"]))
    return int(plan["batch_size"]) * accumulation * world_size


def estimate(plan: dict[str, Any], prices: dict[str, Any], *, world_size: int | None = None,
             overhead_hours: float = DEFAULT_OVERHEAD_HOURS, node_price: dict[str, Any] | None = None) -> dict[str, Any]:
    """Expected time and cost of a run, before it starts.

    :param plan: the run's params (``instance_type``, ``num_nodes``, ``steps_this_run`` (else
        ``max_steps``), ``batch_size``, ``grad_accum_usteps``, ``scaling_mode``, and optionally
        ``head_node_instance_type``, ``fsx_storage_capacity_gib``).
    :param prices: ``load_prices()``.
    :param world_size: training workers in all; default nodes x NeuronCores per node (the local
        stand-in runs fewer workers than its Trn1 instance type has cores).
    :param overhead_hours: cluster creation, fleet start and compile time, billed like training.
    :param node_price: what a compute node-hour costs this run (``run.capacity.node_price``: a
        reservation's price, or a note that it is not known); default: the On-Demand price.
    :return: ``{"usd", "hours", "node_hours", "instance_type", "usd_per_node_hour", "node_price",
        "head_node_usd", "fsx_usd", "reference_seq_per_s", "node_usd", "train_hours",
        "overhead_hours", "world_size", "global_batch"}``. Hours = steps x global batch /
        (reference seq/s per node x nodes) / 3600 + overhead; nodes, head node and FSx bill all of it.
        Every amount is a number (0 for a head node or FSx the plan does not name).
    :raises PriceError: no price or reference throughput for the instance type, or no price for
        the head node type the plan names (a plan without one prices no head node).
    """
    instance_type = plan["instance_type"]
    entry = prices["instances"].get(instance_type)
    if not entry or not entry.get("reference_seq_per_s_per_node"):
        raise PriceError(f"No price and reference throughput for {instance_type!r} in {prices.get('file')}")
    nodes = int(plan["num_nodes"])
    if world_size is None:
        if instance_type not in WORKERS_PER_NODE:
            raise PriceError(f"Workers per node of {instance_type!r} unknown: pass world_size")
        world_size = nodes * WORKERS_PER_NODE[instance_type]
    head_node_type = plan.get("head_node_instance_type")
    if head_node_type and _hourly(prices, head_node_type) is None:
        raise PriceError(f"No price for the head node type {head_node_type!r} in {prices.get('file')}")
    batch = global_batch(plan, int(world_size))
    steps = int(plan.get("steps_this_run") or plan["max_steps"])
    reference = float(entry["reference_seq_per_s_per_node"]) * nodes
    train_hours = steps * batch / reference / 3600
    hours = train_hours + overhead_hours
    price = node_price or {"basis": "on-demand", "usd_per_hour": float(entry["usd_per_hour"]), "known": True,
                           "note": None}
    node_prices = {**prices, "instances": {**prices["instances"],
                                           instance_type: {**entry, "usd_per_hour": price["usd_per_hour"]}}}
    cost = run_cost(instance_type, nodes * hours, head_node_type, hours, plan.get("fsx_storage_capacity_gib") or 0,
                    node_prices)
    return {
        "usd": cost["usd"], "hours": round(hours, 4), "node_hours": round(nodes * hours, 4),
        "instance_type": instance_type, "usd_per_node_hour": float(price["usd_per_hour"]), "node_price": price,
        "head_node_usd": cost["head_node_usd"] or 0.0, "fsx_usd": cost["fsx_usd"], "reference_seq_per_s": reference,
        "node_usd": cost["node_usd"], "train_hours": round(train_hours, 4), "overhead_hours": overhead_hours,
        "world_size": int(world_size), "global_batch": batch,
        # What the running cluster costs an hour (nodes, head node, FSx): the budget guard's rate.
        "usd_per_hour": round(cost["usd"] / hours, 4) if hours else None,
    }


def budget_verdict(budget: dict[str, Any], eta_s: float | None, now: Any = None) -> str | None:
    """The budget guard's decision on a progress line: None while the projected cost fits.

    :param budget: ``{"max_usd", "usd_per_hour", "since"}``: the limit, the cluster's hourly cost and
        when it started to bill (ISO-8601, the cluster's creation).
    :param eta_s: the job's estimate of its remaining seconds.
    :return: the reason to cancel: projected = (elapsed since ``since`` + ``eta_s``) x the rate.
    """
    now = now or datetime.now(timezone.utc)
    since = datetime.fromisoformat(str(budget["since"]).replace("Z", "+00:00"))
    since = since if since.tzinfo else since.replace(tzinfo=timezone.utc)
    rate, limit = float(budget["usd_per_hour"]), float(budget["max_usd"])
    spent = max(0.0, (now - since).total_seconds()) / 3600 * rate
    left = max(0.0, float(eta_s or 0)) / 3600 * rate
    if spent + left <= limit:
        return None
    return (f"budget guard: projected cost ${spent + left:.2f} (${spent:.2f} spent since {budget['since']}, "
            f"${left:.2f} more to finish) exceeds max_cost_usd ${limit:.2f}")
