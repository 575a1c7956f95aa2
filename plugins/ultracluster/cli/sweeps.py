"""`ultracluster sweep`: one training run per node count, as a fan-out of runs or as a backfill.

A backfilled run picks its point from its logical date (``ultracluster.run.sweep``): index = whole weeks
since 2023-01-01 (a Sunday) modulo the number of points, so any ``len(points)`` consecutive weekly
ticks cover each point once, yet the first tick need not train the first point (a run cannot tell
its backfill's first tick: ``run.sweep``). The plan printed before anything is created shows each
tick's point. The backfill spans the most recent ``len(points)`` ticks (Sunday 00:00 UTC) strictly
before now:

- Airflow 3.3 creates a backfill run for every tick with ``from_date <= logical_date <= to_date``
  (both ends inclusive: ``SerializedDAG.iter_dagrun_infos_between``), keeping only those whose data
  interval has ended before now (``airflow.models.backfill._get_info_list``). ``@weekly`` is a
  ``CronTriggerTimetable``: its interval is the tick itself, so a tick counts once it is past.
- So ``from_date`` is the first of those ticks and ``to_date`` the last one. The dry run
  (``POST /api/v2/backfills/dry_run``) must plan exactly those dates, or nothing is created.
"""
from __future__ import annotations

import argparse
import time
from datetime import datetime, timedelta, timezone

from ultracluster.cli.client import AirflowClient, CliError, segment
from ultracluster.cli.follow import Followed, follow, run_path, say, task_instances, xcom_value
from ultracluster.cli.runs import build_conf, ensure_unpaused, start_run
from ultracluster.run.shared_cluster import HOLDER_DAG_ID, points_conf
from ultracluster.run.sweep import ORIGIN, tick_index

WEEK = timedelta(days=7)  # the DAG's @weekly schedule; ORIGIN is one of its ticks (a Sunday 00:00 UTC)
NETWORK_DAG = "trn1_sweep_network"
# create_vpc's network -> the pipeline params through which a run adopts it.
NETWORK_PARAMS = {"vpc_id": "existing_vpc_id", "public_subnet_id": "existing_public_subnet_id",
                  "private_subnet_id": "existing_private_subnet_id", "security_group_id": "existing_security_group_id"}
# Pipeline params the network DAG shares: where the network goes and where the sweep index is.
SHARED_WITH_NETWORK = ("region", "availability_zone_id", "artifacts_s3_uri", "extra_tags")


def parse_nodes(text: str) -> list[int]:
    """``1,2,4`` -> [1, 2, 4]: positive, distinct (each point is one run)."""
    try:
        nodes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise CliError(f"--nodes {text!r}: expected node counts like 1,2,4") from None
    if not nodes or min(nodes) < 1:
        raise CliError(f"--nodes {text!r}: expected positive node counts like 1,2,4")
    if len(set(nodes)) != len(nodes):
        raise CliError(f"--nodes {text!r}: each node count once")
    return nodes


def sweep_conf(args: argparse.Namespace, nodes: list[int]) -> dict:
    """The --conf-file/--param conf with the sweep set: {"sweep": {"id", "num_nodes", "scaling_mode"}}
    (and ``"cluster": "shared"`` with ``--cluster shared``: ``run.shared_cluster``)."""
    conf = build_conf(args.conf_file, args.param)
    conf["sweep"] = {"id": args.id, "num_nodes": nodes, "scaling_mode": args.mode}
    return points_conf(conf) if getattr(args, "cluster", "own") == "shared" else conf


def past_ticks(now: datetime, count: int) -> list[datetime]:
    """The ``count`` most recent weekly ticks (Sunday 00:00 UTC) strictly before ``now``, oldest first."""
    last = ORIGIN + WEEK * ((now - ORIGIN) // WEEK)
    if last >= now:  # now is a tick: its run is not yet past
        last -= WEEK
    return [last - WEEK * back for back in range(count - 1, -1, -1)]


def iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def point_at(nodes: list[int], logical_date: datetime) -> int:
    """The node count a backfilled run at ``logical_date`` trains (``ultracluster.run.sweep``'s rule)."""
    return nodes[tick_index(logical_date, WEEK) % len(nodes)]


def cmd_sweep(client: AirflowClient, args: argparse.Namespace, now: datetime | None = None) -> int:
    nodes = parse_nodes(args.nodes)
    conf = sweep_conf(args, nodes)
    if args.via == "runs":
        followed = fan_out(client, args, conf, nodes)
    else:
        followed = backfill(client, args, conf, nodes, now or datetime.now(timezone.utc))
    if not followed or args.no_follow:
        return 0
    holder = getattr(args, "network_run", None)
    ok = follow(client, followed + ([holder] if holder else []), poll_s=args.poll_interval, timeout_s=args.timeout)
    done = sum(run.state == "success" for run in followed)
    say(f"sweep {args.id}: {done}/{len(followed)} runs succeeded")
    return 0 if ok else 1


def fan_out(client: AirflowClient, args: argparse.Namespace, conf: dict, nodes: list[int]) -> list[Followed]:
    """One manual run per point, each naming its point: {"sweep": {..., "point": {"num_nodes": N}}}."""
    if args.dry_run:
        raise CliError("--dry-run is for --via backfill (a fan-out has nothing to plan)")
    ensure_unpaused(client, args.dag, args.wait_for_dag)
    with shared_network(client, args, conf, len(nodes)) as network, shared_cluster(client, args, conf, len(nodes)):
        followed = []
        for count in nodes:
            point = {**conf, **network, "sweep": {**conf["sweep"], "point": {"num_nodes": count}}}
            run_id = start_run(client, args.dag, point)
            say(f"sweep {args.id}: num_nodes={count}  run {run_id}")
            followed.append(Followed(args.dag, run_id, label=f"[n={count}] "))
    return followed


class shared_network:  # noqa: N801 - used as a context manager
    """``with shared_network(...) as params``: the network every point adopts (``existing_*`` params),
    from a run of trn1_sweep_network; ``{}`` with ``--network per-run``, a network in the conf, or a
    shared cluster (``shared_cluster``, below, holds its own network). If starting the points fails,
    what is held is released at once (its hold task marked success, so its teardowns delete it)
    instead of being held for the points that never came."""

    dag_id, what, ready_task, hold_task, label = NETWORK_DAG, "network", "create_vpc", "hold_network", "[network] "

    def __init__(self, client: AirflowClient, args: argparse.Namespace, conf: dict, points: int) -> None:
        self.client, self.args, self.conf, self.points = client, args, conf, points
        self.run_id: str | None = None

    def wanted(self) -> bool:
        return (self.args.network == "shared" and getattr(self.args, "cluster", "own") != "shared"
                and not any(self.conf.get(p) for p in NETWORK_PARAMS.values()))

    def holder_conf(self) -> dict:
        return {"sweep_id": self.args.id, "points": self.points,
                **{key: self.conf[key] for key in SHARED_WITH_NETWORK if key in self.conf}}

    def ready(self, value: object) -> bool:
        return isinstance(value, dict) and bool(value.get("vpc_id"))

    def params(self, value: dict) -> dict:
        say(f"sweep {self.args.id}: network {value.get('vpc_id')} is up; every point adopts it")
        return {param: value[key] for key, param in NETWORK_PARAMS.items() if value.get(key)}

    def __enter__(self) -> dict:
        if not self.wanted():
            return {}
        client, args = self.client, self.args
        ensure_unpaused(client, self.dag_id, args.wait_for_dag)
        self.run_id = start_run(client, self.dag_id, self.holder_conf())
        say(f"sweep {args.id}: shared {self.what}: {self.dag_id} run {self.run_id}")
        try:
            value = self._wait_until_ready()
        except BaseException as error:
            self.__exit__(type(error), error, None)
            raise
        self.args.network_run = Followed(self.dag_id, self.run_id, label=self.label)
        return self.params(value)

    def _wait_until_ready(self) -> dict:
        limit = self.args.timeout or float("inf")   # 0: no limit, as for following
        deadline = time.monotonic() + limit
        task = self.ready_task
        while time.monotonic() < deadline:
            states = {ti["task_id"]: ti.get("state") for ti in task_instances(self.client, self.dag_id, self.run_id)}
            if states.get(task) == "success":
                value = xcom_value(self.client, self.dag_id, self.run_id, task)
                if self.ready(value):
                    return value
            if states.get(task) in ("failed", "upstream_failed", "skipped") or \
                    self.client.get(run_path(self.dag_id, self.run_id))["state"] == "failed":
                failed = [t for t, state in states.items() if state in ("failed", "upstream_failed")]
                raise CliError(f"the sweep's {self.what} was not created: {self.dag_id} run {self.run_id} failed "
                               f"({task} {states.get(task)}; failed: {', '.join(sorted(failed)) or 'none'}); "
                               "their logs say why")
            time.sleep(self.args.poll_interval)
        raise CliError(f"the sweep's {self.what} was not up after {limit:.0f} s ({self.dag_id} run {self.run_id})")

    def __exit__(self, kind, error, trace) -> None:
        if error is not None and self.run_id:
            say(f"sweep {self.args.id}: points not started; releasing the {self.what} ({self.dag_id} run "
                f"{self.run_id})")
            try:
                self.client.patch(f"{run_path(self.dag_id, self.run_id)}/taskInstances/{self.hold_task}",
                                  {"new_state": "success"})
            except CliError as failed:   # the first error is the one to report
                say(f"sweep {self.args.id}: could not release the {self.what} ({failed}); mark {self.dag_id} run "
                    f"{self.run_id}'s {self.hold_task} success in the UI, or it is held for max_hold_hours")


class shared_cluster(shared_network):  # noqa: N801 - used as a context manager
    """``with shared_cluster(...)``: with ``--cluster shared``, the sweep's one cluster, from a run of
    trn1_sweep_cluster (given the sweep's conf: it sizes the cluster to the largest point). The
    points need no param of it: their sweep conf names it (``run.shared_cluster.point_cluster``)."""

    dag_id, what, ready_task, hold_task, label = HOLDER_DAG_ID, "cluster", "pcluster_create", "hold_cluster", \
        "[cluster] "

    def wanted(self) -> bool:
        return getattr(self.args, "cluster", "own") == "shared"

    def holder_conf(self) -> dict:
        return dict(self.conf)

    def ready(self, value: object) -> bool:
        return isinstance(value, dict) and bool(value.get("cluster_name"))

    def params(self, value: dict) -> dict:
        say(f"sweep {self.args.id}: cluster {value.get('cluster_name')} is up; every point trains on it")
        return {}


def backfill(client: AirflowClient, args: argparse.Namespace, conf: dict, nodes: list[int],
             now: datetime) -> list[Followed]:
    """A backfill over the last len(nodes) weekly ticks; its runs, one per point."""
    ticks = past_ticks(now, len(nodes))
    body = {"dag_id": args.dag, "from_date": iso(ticks[0]), "to_date": iso(ticks[-1]), "run_backwards": False,
            "dag_run_conf": conf, "reprocess_behavior": "completed", "max_active_runs": args.max_active}
    planned = client.post("/api/v2/backfills/dry_run", body)["backfills"]
    dates = sorted(datetime.fromisoformat(item["logical_date"]) for item in planned if item.get("logical_date"))
    say(f"sweep {args.id}: backfill {args.dag} from {body['from_date']} to {body['to_date']}; "
        f"the dry run plans {len(dates)} runs, each training the point of its week (weeks since "
        f"{ORIGIN:%Y-%m-%d} modulo {len(nodes)}):")
    for date in dates:
        nodes_then = point_at(nodes, date)
        say(f"  {iso(date)}  num_nodes={nodes_then} (point {nodes.index(nodes_then) + 1}/{len(nodes)})")
    if dates != ticks:
        raise CliError(f"the dry run plans {[iso(d) for d in dates]}, the sweep needs one run at each of "
                       f"{[iso(t) for t in ticks]}: a run at one of them is still in flight, or {args.dag}'s "
                       "schedule is not weekly at Sunday 00:00 UTC")
    if args.dry_run:
        return []
    ensure_unpaused(client, args.dag, args.wait_for_dag)
    with shared_network(client, args, conf, len(nodes)) as network, shared_cluster(client, args, conf, len(nodes)):
        # Every backfilled run gets the same conf: the shared network goes in it.
        created = client.post("/api/v2/backfills", {**body, "dag_run_conf": {**conf, **network}})
        say(f"sweep {args.id}: backfill {created['id']} created")
        runs = client.get(f"/api/v2/dags/{segment(args.dag)}/dagRuns",
                          params={"run_type": "backfill", "logical_date_gte": body["from_date"],
                                  "logical_date_lte": body["to_date"], "limit": 100})["dag_runs"]
        by_date = {datetime.fromisoformat(run["logical_date"]): run["dag_run_id"]
                   for run in runs if run.get("logical_date")}
        missing = [iso(tick) for tick in ticks if tick not in by_date]
        if missing:
            raise CliError(f"backfill {created['id']} has no run at {', '.join(missing)} (GET /api/v2/backfills/"
                           f"{created['id']} and the Airflow UI show why)")
    followed = []
    for tick in ticks:
        label = f"[n={point_at(nodes, tick)} {tick:%Y-%m-%d}] "
        say(f"  {label}run {by_date[tick]}")
        followed.append(Followed(args.dag, by_date[tick], label=label))
    return followed
