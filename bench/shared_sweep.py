"""Benchmark 10, a sweep on one cluster: the same 3-point weak sweep (1, 2, 3 nodes) with a cluster per
point against one shared cluster (``run.shared_cluster``), both started at once, in one deployment.

Both legs are the product's own fan-out, `ultracluster sweep --via runs` (``ultracluster.cli.sweeps``):
``--cluster own`` (a cluster per point, one shared network, trn1_sweep_network) and ``--cluster
shared`` (trn1_sweep_cluster's one cluster of 3 nodes; points 1 and 2 fill it, point 3 waits for
their nodes). Cold compiles both ways (compile_cache_s3_uri null), so both start from the same state.

Measured per leg, as ratios shared / per-point:
- wall time: the first run's start to the last run's end, the holder's run included (REST records);
- total cost: what EC2 billed for every cluster of the leg, instance launch to termination
  (delete_cluster's bill: each point's cluster, or the holder's one cluster);
- idle-fleet node-minutes: compute node-minutes EC2 billed less the node-minutes the points' Slurm
  jobs held (parallel_compile and train, from their task records × the point's nodes).

    .venvs/airflow/bin/python bench/shared_sweep.py
"""
from __future__ import annotations

import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _deploy import Deployment  # noqa: E402 - puts the repo's packages on sys.path
from _record import Report  # noqa: E402
from concurrency import interval  # noqa: E402

from ultracluster.cli.follow import xcom_value  # noqa: E402
from ultracluster.cli.main import build_parser  # noqa: E402
from ultracluster.cli.sweeps import fan_out, sweep_conf  # noqa: E402

NODES = [1, 2, 3]
PARAMS = ["max_steps=40", "steps_this_run=12", "compile_cache_s3_uri=null"]
RUN_TIMEOUT_S = 1500
JOB_TASKS = ("parallel_compile", "train")


def sweep_args(sweep_id: str, cluster: str):
    argv = ["sweep", "--id", sweep_id, "--nodes", ",".join(map(str, NODES)), "--mode", "weak", "--via", "runs",
            "--cluster", cluster, "--wait-for-dag", "180", "--poll-interval", "2", "--timeout", str(RUN_TIMEOUT_S)]
    for param in PARAMS:
        argv += ["--param", param]
    return build_parser().parse_args(argv)


def job_node_minutes(deployment: Deployment, run: tuple[str, str], nodes: int) -> float:
    tis = {ti["task_id"]: ti for ti in deployment.task_instances(*run)}
    spans = [interval(tis[task]) for task in JOB_TASKS if (tis.get(task) or {}).get("end_date")]
    return sum(end - start for start, end in spans) / 60 * nodes


def run_leg(deployment: Deployment, cluster: str) -> dict:
    client = deployment.client
    args = sweep_args(f"bench-{cluster}-{uuid.uuid4().hex[:6]}", cluster)
    followed = fan_out(client, args, sweep_conf(args, NODES), NODES)
    holder = args.network_run   # trn1_sweep_network (own clusters) or trn1_sweep_cluster (shared)
    points = [(f.dag_id, f.run_id) for f in followed]
    records = {run: deployment.wait(*run, timeout=RUN_TIMEOUT_S) for run in points}
    holder_record = deployment.wait(holder.dag_id, holder.run_id, timeout=RUN_TIMEOUT_S)
    failed = [run for run, record in records.items() if record["state"] != "success"]
    if failed or holder_record["state"] != "success":
        raise RuntimeError(f"{cluster} sweep {args.id}: runs {failed} or the holder did not succeed")
    spans = [interval(record) for record in [*records.values(), holder_record]]
    jobs = 0.0
    bills = []
    for run in points:
        nodes = xcom_value(client, *run, "preflight")["plan"]["num_nodes"]
        jobs += job_node_minutes(deployment, run, nodes)
        if cluster == "own":
            bills.append(xcom_value(client, *run, "delete_cluster")["usage"])
    if cluster == "shared":
        bills.append(xcom_value(client, holder.dag_id, holder.run_id, "delete_cluster")["usage"])
    billed_node_min = sum(bill["compute_node_hours"] for bill in bills) * 60
    leg = {"cluster": cluster, "sweep_id": args.id, "wall_s": max(e for _, e in spans) - min(s for s, _ in spans),
           "usd": sum(bill["usd"] for bill in bills), "clusters": len(bills),
           "idle_node_min": max(0.0, billed_node_min - jobs), "billed_node_min": billed_node_min,
           "job_node_min": jobs}
    print(f"shared_sweep: {cluster}: wall {leg['wall_s']:.0f} s, ${leg['usd']:.2f} over {leg['clusters']} "
          f"cluster(s), idle fleet {leg['idle_node_min']:.1f} node-min ({billed_node_min:.1f} billed, "
          f"{jobs:.1f} in jobs)", flush=True)
    return leg


def record(own: dict, shared: dict) -> None:
    report = Report("shared_sweep", "10. A sweep on one cluster: a 3-point weak sweep (1, 2, 3 nodes), one "
                                    "shared cluster against a cluster per point")
    for key, label, unit in (("wall_s", "wall time", "s"), ("usd", "total cost", "USD"),
                             ("idle_node_min", "idle-fleet node-minutes", "node-min")):
        report.figure(f"{label}, shared / per-point", shared[key] / own[key] if own[key] else float("nan"), "ratio",
                      note=f"{shared[key]:.4g} against {own[key]:.4g} {unit}; one sweep each way, all points at once")
        for leg in (own, shared):
            report.figure(f"{leg['cluster']}: {label}", leg[key], unit)
    print(f"shared_sweep: saved {report.save()}", flush=True)


def run(deployment: Deployment) -> None:
    for dag_id in ("trn1_bert_pretrain", "trn1_sweep_network", "trn1_sweep_cluster"):
        deployment.wait_for_dag(dag_id)
    own = run_leg(deployment, "own")
    shared = run_leg(deployment, "shared")
    record(own, shared)


def main() -> None:
    with Deployment("shared-sweep") as deployment:
        run(deployment)


if __name__ == "__main__":
    main()
