"""A sweep on one cluster (run/shared_cluster.py): the points' plan, the holder's plan and hold, the fleet
wait on nodes other points hold, the reaper's verdict, the report's overhead line, the download lock."""
from __future__ import annotations

import subprocess
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from ultracluster import remote_commands as rc
from ultracluster.reaper.classify import CLUSTER, judge
from ultracluster.report.render import render_markdown
from ultracluster.report.table import make_report
from ultracluster.run.cost import load_prices
from ultracluster.run.fleet import judge_capacity, partition_capacity
from ultracluster.run.plan import plan_problems, run_plan
from ultracluster.run.shared_cluster import (
    HOLDER_DAG_ID,
    SharedClusterError,
    cluster_name,
    holder_plan,
    overhead,
    point_cluster,
    points_conf,
)
from ultracluster.run.states import FAILED, PENDING, READY
from ultracluster.run.sweep import HOLD, RELEASE, SWEEP_SCHEMA, network_hold
from ultracluster.run.tags import CREATED_BY, CREATED_BY_TAG, DAG_ID_TAG, RUN_ID_TAG

WEEK = timedelta(days=7)
SWEEP = {"id": "s1", "num_nodes": [1, 3, 2], "scaling_mode": "weak", "cluster": "shared"}


def test_the_schema_takes_cluster_own_or_shared_only():
    import jsonschema

    jsonschema.validate(SWEEP, SWEEP_SCHEMA)
    jsonschema.validate({**SWEEP, "cluster": "own"}, SWEEP_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**SWEEP, "cluster": "one"}, SWEEP_SCHEMA)


def test_each_point_of_a_shared_sweep_trains_on_the_sweep_cluster():
    plan = run_plan({"sweep": {**SWEEP, "point": {"num_nodes": 3}}, "min_nodes": 0}, None, WEEK)
    assert (plan["num_nodes"], plan["existing_cluster_name"]) == (3, "uc-sweep-s1")
    assert plan_problems(plan) == []   # no creation rule applies: the point creates nothing
    own = run_plan({"sweep": {**SWEEP, "cluster": "own", "point": {"num_nodes": 3}}}, None, WEEK)
    assert own["existing_cluster_name"] is None
    # The same conf for every run (a backfill): the point comes from the logical date, the cluster from the id.
    ticked = run_plan({"sweep": SWEEP}, datetime(2023, 1, 8, tzinfo=timezone.utc), WEEK)
    assert (ticked["num_nodes"], ticked["existing_cluster_name"]) == (3, "uc-sweep-s1")


def test_the_names_and_the_points_conf():
    assert cluster_name("a" * 40) == "uc-sweep-" + "a" * 40 and len(cluster_name("a" * 40)) <= 60
    assert point_cluster({"id": "s1"}) is None and point_cluster(SWEEP) == "uc-sweep-s1"
    conf = {"sweep": {"id": "s1", "num_nodes": [1]}, "max_steps": 40}
    assert points_conf(conf) == {"sweep": {"id": "s1", "num_nodes": [1], "cluster": "shared"}, "max_steps": 40}


def test_the_holder_plans_one_cluster_of_the_largest_point_and_trains_nothing():
    plan = holder_plan({"sweep": SWEEP, "min_nodes": 0, "max_nodes": 1, "num_nodes": 1, "cluster_name": None,
                        "existing_cluster_name": None, "steps_this_run": 50, "max_steps": 10})
    assert (plan["num_nodes"], plan["max_nodes"], plan["cluster_name"]) == (3, 3, "uc-sweep-s1")
    assert plan["sweep_point"] is None and plan["existing_cluster_name"] is None
    # Training rules are the points' (each point's preflight refuses steps_this_run > max_steps).
    assert plan_problems(plan, trains=False) == []
    assert plan_problems(plan) == ["steps_this_run (50) exceeds max_steps (10)"]
    with pytest.raises(SharedClusterError, match="needs a sweep"):
        holder_plan({"sweep": None})
    with pytest.raises(SharedClusterError, match="existing_cluster_name"):
        holder_plan({"sweep": SWEEP, "existing_cluster_name": "mine"})
    with pytest.raises(SharedClusterError, match="num_nodes"):
        holder_plan({"sweep": {"id": "s1", "point": {"num_nodes": 2}}})


def test_the_cluster_hold_counts_the_runs_on_the_cluster_only():
    entries = [{"run_id": "a", "plan": {"existing_cluster_name": "uc-sweep-s1"}},
               {"run_id": "b", "plan": {"existing_cluster_name": "uc-sweep-s1"}},
               {"run_id": "c", "plan": {"existing_cluster_name": None}}]
    hold = dict(vpc_id="vpc-1", sweep_id="s1", points=2, held_s=0, max_hold_hours=72, cluster_name="uc-sweep-s1")
    verdict, summary, open_runs = network_hold(entries, {"a": "success", "b": "running", "c": "running"}, **hold)
    assert (verdict, open_runs, summary["cluster_name"]) == (HOLD, ["b"], "uc-sweep-s1")
    verdict, summary, _ = network_hold(entries, {"a": "success", "b": "failed", "c": "running"}, **hold)
    assert verdict == RELEASE and summary["runs"] == {"a": "success", "b": "failed"}


def nodes(*states: str) -> list[SimpleNamespace]:
    from ultracluster.parsers.slurm import NodeStatus

    return [NodeStatus("compute1", "up", f"compute1-dy-trn1-{i}", state, None) for i, state in enumerate(states, 1)]


@pytest.mark.parametrize("states, shared, verdict, reason", [
    (("alloc", "alloc", "idle~"), True, PENDING, "nodes_held"),       # the other points hold two nodes
    (("alloc", "alloc", "idle~"), False, PENDING, "nodes_pending"),
    # Nodes of an ended point powering down ("down~" on the way back): held on a shared cluster only.
    (("down~", "down~", "idle~"), True, PENDING, "nodes_held"),
    (("down~", "down~", "idle~"), False, FAILED, "not_enough_nodes"),
    (("idle~", "idle~", "idle"), True, READY, "ready"),
])
def test_on_a_shared_cluster_the_fleet_wait_waits_for_nodes_other_points_hold(states, shared, verdict, reason):
    judgement = judge_capacity(partition_capacity(nodes(*states), "compute1", 3), shared=shared)
    assert (judgement.verdict, judgement.reason) == (verdict, reason), judgement.message


def test_a_shared_cluster_too_small_for_the_point_still_fails():
    judgement = judge_capacity(partition_capacity(nodes("alloc", "idle~"), "compute1", 3), shared=True)
    assert (judgement.verdict, judgement.reason) == (FAILED, "not_enough_nodes")


def test_the_reaper_keeps_a_shared_cluster_while_its_holder_is_live_and_reaps_it_after():
    tags = {CREATED_BY_TAG: CREATED_BY, DAG_ID_TAG: HOLDER_DAG_ID, RUN_ID_TAG: "manual__1"}
    now = datetime(2026, 12, 3, tzinfo=timezone.utc)
    kept = judge(CLUSTER, "uc-sweep-s1", tags, lambda dag, run: "running", now)
    assert not kept.reap and "shared cluster" in kept.reason and "running" in kept.reason
    assert judge(CLUSTER, "uc-sweep-s1", tags, lambda dag, run: "success", now).reap


CLUSTER_USAGE = {"basis": "ec2_instances", "usd": 10.0, "compute_usd": 6.0, "head_node_usd": 3.0, "fsx_usd": 1.0,
                 "compute_node_hours": 0.6}


def test_the_overhead_is_the_cluster_bill_less_the_points_jobs():
    found = overhead(CLUSTER_USAGE, [{"usd": 1.0, "compute_node_hours": 0.1}, {"usd": 2.0, "compute_node_hours": 0.2}])
    assert found == {"usd": 7.0, "head_node_usd": 3.0, "fsx_usd": 1.0, "idle_nodes_usd": 3.0,
                     "idle_node_hours": pytest.approx(0.3), "cluster_usd": 10.0, "points_usd": 3.0}
    assert found["usd"] + found["points_usd"] == CLUSTER_USAGE["usd"]
    assert overhead(None, []) is None


def test_the_report_shows_the_overhead_on_a_line_of_its_own():
    records = [{"run_id": f"r{n}", "state": "success", "point": {"num_nodes": n}, "written_at": str(n),
                "scaling_mode": "weak", "average_throughput_seq_per_s": 10.0 * n,
                "usage": {"basis": "slurm_jobs", "usd": float(n), "compute_usd": float(n),
                          "compute_node_hours": n / 10}} for n in (1, 2)]
    prices = load_prices()
    report = make_report("s1", "trn1_bert_pretrain", [1, 2], records, prices,
                         shared_cluster={"cluster_name": "uc-sweep-s1", "usage": CLUSTER_USAGE})
    assert [r["cost_usd"] for r in report["rows"]] == [1.0, 2.0]   # each point: its jobs' node-hours
    assert report["shared_cluster"]["overhead"]["usd"] == 7.0
    line = next(line for line in render_markdown(report).splitlines() if line.startswith("| Shared cluster |"))
    assert "| 7.00 |" in line and "head node 3.00, FSx 1.00, idle nodes 3.00 (0.300 node-h)" in line
    unbilled = make_report("s1", "trn1_bert_pretrain", [1, 2], records, prices,
                           shared_cluster={"cluster_name": "uc-sweep-s1", "usage": None})
    assert "uc-sweep-s1: not billed yet (still up)" in render_markdown(unbilled)
    assert "Shared cluster" not in render_markdown(make_report("s1", "trn1_bert_pretrain", [1, 2], records, prices))


def test_the_download_lock_is_taken_once_retaken_by_its_owner_and_released_by_it_only(tmp_path):
    lock = str(tmp_path / "data" / ".lock")

    def run(command: rc.RemoteCommand) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", command.shell], capture_output=True, text=True, timeout=30)

    assert run(rc.take_lock(lock, "run a", 3600)).returncode == 0
    held = run(rc.take_lock(lock, "run b", 3600))
    assert (held.returncode, held.stdout.strip()) == (3, "run a")
    assert run(rc.take_lock(lock, "run a", 3600)).returncode == 0     # a retry of the holder
    run(rc.release_lock(lock, "run b"))                               # not b's to release
    assert run(rc.take_lock(lock, "run b", 3600)).returncode == 3
    run(rc.release_lock(lock, "run a"))
    assert run(rc.take_lock(lock, "run b", 3600)).returncode == 0
    # A lock older than its limit: its holder died; broken and taken.
    subprocess.run(["touch", "-d", "2 hours ago", lock], check=True)
    assert run(rc.take_lock(lock, "run c", 3600)).returncode == 0


def test_without_accounting_a_job_is_billed_from_its_markers_not_its_wait_in_the_queue(tmp_path):
    """A point's job that queued behind other points' jobs: its task span holds the wait, its start and
    exit markers (remote_commands.sbatch writes them) only its run."""
    import os

    from ultracluster.parsers.files import parse_modified_times
    from ultracluster.run.cost import job_marker_seconds, task_span_jobs

    log = tmp_path / "slurm-7.out"
    for kind, stamp in (("name", 1_000_000_000), ("exit", 1_000_000_090)):
        path = tmp_path / f"slurm-7.{kind}"
        path.write_text("x\n")
        os.utime(path, (stamp, stamp))
    markers = {"7": (str(tmp_path / "slurm-7.name"), str(tmp_path / "slurm-7.exit")),
               "8": (str(tmp_path / "slurm-8.name"), str(tmp_path / "slurm-8.exit"))}   # no markers: left out
    done = subprocess.run(["bash", "-c", rc.modified_times(*markers["7"], *markers["8"]).shell],
                          capture_output=True, text=True, check=True)
    ran = job_marker_seconds(parse_modified_times(done.stdout), markers)
    assert ran == {"7": 90}
    results = [{"job_id": "7", "job_name": "t", "state": "COMPLETED", "log_path": str(log),
                "started_at": "2026-12-01T10:00:00+00:00", "ended_at": "2026-12-01T10:10:00+00:00"},
               {"job_id": "8", "job_name": "c", "state": "COMPLETED",
                "started_at": "2026-12-01T10:00:00+00:00", "ended_at": "2026-12-01T10:01:00+00:00"}]
    assert [j["elapsed_s"] for j in task_span_jobs(results, 3, ran)] == [90, 60]   # 600 s of task, 90 s of job
