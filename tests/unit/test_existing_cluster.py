"""Bring your own cluster (``existing_cluster_name``): the core's decisions (run.existing_cluster), the
plan's rules, the config and sacct parses, the job-based bill and the report's reading of it.

The run against a real local cluster, left as it was, is tests/e2e/test_pipeline.py's second REST run;
preflight's refusal of a missing cluster is tests/e2e/test_preflight_e2e.py's.
"""
from __future__ import annotations

import json
import logging
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from airflow.sdk.exceptions import AirflowSkipException

from tests.fixtures_localcluster import cluster_config
from ultracluster.operators.existing_cluster import step_on_existing_cluster
from ultracluster.parsers.pcluster import DEFAULT_MAX_COUNT, config_facts
from ultracluster.parsers.slurm import parse_sacct_usage
from ultracluster.reaper.classify import judge
from ultracluster.remote_commands import sacct_usage
from ultracluster.report.records import run_record
from ultracluster.report.summary import run_summary, summary_lines
from ultracluster.run import existing_cluster as byo
from ultracluster.run.cost import job_usage, load_prices, task_span_jobs
from ultracluster.run.plan import cluster_of, plan_problems, run_plan
from ultracluster.run.profiles import load_profile
from ultracluster.run.tags import ownership_tags

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# pcluster 3.16.1's describe-cluster of a complete cluster, as recorded.
DESCRIBED = json.loads((FIXTURES / "pcluster" / "describe_cluster_create_complete.json").read_text())
FACTS = config_facts(yaml.safe_dump(cluster_config("subnet-0abc", static=1, dynamic=1, accounting=True)))
PLAN = {**load_profile("local"), "existing_cluster_name": "uc-test", "num_nodes": 2, "instance_type": "trn1.32xlarge",
        "shared_storage_mount_dir": "/fsx"}


@pytest.mark.parametrize("value", [None, "", "None", "  "])
def test_without_an_existing_cluster_every_step_runs_as_always(value):
    for step in (byo.NETWORK, byo.CONFIG, byo.CREATE, byo.DELETE_CLUSTER, byo.DELETE_NETWORK):
        assert byo.step_verdict(step, value) == byo.StepVerdict(byo.RUN)


def test_on_an_existing_cluster_the_setups_adopt_it_and_the_rest_skips_with_a_reason():
    actions = {step: byo.step_verdict(step, "team").action
               for step in (byo.NETWORK, byo.CONFIG, byo.CREATE, byo.DELETE_CLUSTER, byo.DELETE_NETWORK)}
    # The setups (create_vpc, pcluster_create) cannot skip: Airflow would skip the training with them.
    assert actions == {byo.NETWORK: byo.ADOPT, byo.CREATE: byo.ADOPT, byo.CONFIG: byo.SKIP,
                       byo.DELETE_CLUSTER: byo.SKIP, byo.DELETE_NETWORK: byo.SKIP}
    reason = byo.step_verdict(byo.DELETE_CLUSTER, "team").reason
    assert "team" in reason and "never deletes, updates or stops it" in reason


def test_an_operator_asking_the_core_skips_with_the_reason_in_its_log(caplog):
    op = SimpleNamespace(existing_cluster_name="team", log=logging.getLogger("op"))
    with caplog.at_level(logging.INFO), pytest.raises(AirflowSkipException, match="not created by this run"):
        step_on_existing_cluster(op, byo.DELETE_CLUSTER)
    assert "Skipped: existing cluster team was not created by this run" in caplog.text
    assert step_on_existing_cluster(op, byo.CREATE).action == byo.ADOPT
    assert step_on_existing_cluster(SimpleNamespace(existing_cluster_name=None, log=op.log), byo.CONFIG).action == byo.RUN


def test_the_plan_names_the_cluster_and_its_queue():
    plan = run_plan({**PLAN, "existing_cluster_queue": "train"}, None, timedelta(days=7))
    assert (plan["existing_cluster_name"], plan["training_queue"]) == ("uc-test", "train")
    own = run_plan({**PLAN, "existing_cluster_name": ""}, None, timedelta(days=7))
    assert (own["existing_cluster_name"], own["training_queue"]) == (None, "compute1")

    class TI:
        def __init__(self, plan):
            self.plan = plan

        def xcom_pull(self, task_ids):
            return {"preflight": {"plan": self.plan}, "render_config": {"cluster_name": "uc-own"}}[task_ids]

    assert cluster_of(TI(plan)) == "uc-test" and cluster_of(TI(own)) == "uc-own"


def test_creation_params_beside_an_existing_cluster_are_refused_not_ignored():
    problems = plan_problems({**PLAN, "cluster_name": "mine", "extra_queues": [{"name": "cpu"}],
                              "existing_public_subnet_id": "subnet-1", "capacity_reservation_id": "cr-0123456789abcdef0"})
    assert sorted(p.split(" ", 1)[0] for p in problems) == [
        "capacity_reservation_id", "cluster_name", "existing_public_subnet_id", "extra_queues"], problems
    # The rules of a cluster the run would create do not apply: the cluster's own MaxCount does.
    assert plan_problems({**PLAN, "num_nodes": 2, "max_nodes": 1, "min_nodes": 3}) == []
    assert plan_problems({**PLAN, "existing_cluster_name": None, "existing_cluster_queue": "train"}) == [
        "existing_cluster_queue names a queue of an existing cluster: it needs existing_cluster_name"]


def test_the_estimate_prices_the_run_s_nodes_only():
    billed = byo.billed_plan({**PLAN, "head_node_instance_type": "c5.4xlarge", "fsx_storage_capacity_gib": 1200})
    assert (billed["head_node_instance_type"], billed["fsx_storage_capacity_gib"]) == (None, None)
    assert byo.billed_plan({**PLAN, "existing_cluster_name": None, "fsx_storage_capacity_gib": 1200})[
        "fsx_storage_capacity_gib"] == 1200


def test_config_facts_read_queues_instance_types_counts_storage_and_accounting():
    assert FACTS == {"queues": {"compute1": [{"name": "trn1", "instance_types": ["trn1.32xlarge"], "min_count": 1,
                                              "max_count": 2}]},
                     "mount_dirs": ["/fsx"], "accounting": True}
    # Flexible instance types, and ParallelCluster's default MaxCount when a config leaves it out.
    flexible = config_facts(yaml.safe_dump({"Scheduling": {"SlurmQueues": [{"Name": "q", "ComputeResources": [
        {"Name": "mixed", "Instances": [{"InstanceType": "trn1.32xlarge"}, {"InstanceType": "trn1n.32xlarge"}]}]}]}}))
    assert flexible == {"queues": {"q": [{"name": "mixed", "instance_types": ["trn1.32xlarge", "trn1n.32xlarge"],
                                          "min_count": 0, "max_count": DEFAULT_MAX_COUNT}]},
                        "mount_dirs": [], "accounting": False}
    with pytest.raises(ValueError, match="not a YAML mapping"):
        config_facts("- a list")


def test_a_cluster_that_fits_has_no_problem():
    assert byo.cluster_problems(DESCRIBED, FACTS, PLAN) == []
    assert byo.cluster_problems({**DESCRIBED, "clusterStatus": "UPDATE_COMPLETE"}, FACTS, PLAN) == []


@pytest.mark.parametrize("description, plan, expected", [
    ({"clusterStatus": "CREATE_IN_PROGRESS"}, {}, "existing_cluster_name: cluster uc-test is CREATE_IN_PROGRESS; "
     "a run needs it CREATE_COMPLETE or UPDATE_COMPLETE"),
    ({"clusterStatus": "UPDATE_FAILED"}, {}, "is UPDATE_FAILED"),
    ({"computeFleetStatus": "STOPPED"}, {}, "the compute fleet of cluster uc-test is STOPPED, not RUNNING; start it"),
    ({}, {"existing_cluster_queue": "gpu"}, "existing_cluster_queue: cluster uc-test has no queue 'gpu' (its "
     "queues: compute1)"),
    ({}, {"instance_type": "trn1n.32xlarge"}, "instance_type: queue compute1 of cluster uc-test has no "
     "trn1n.32xlarge compute resource (it has: trn1.32xlarge)"),
    ({}, {"num_nodes": 3}, "num_nodes (3) exceeds what queue compute1 of cluster uc-test can hold: 2 "
     "trn1.32xlarge node(s) (MaxCount)"),
    ({}, {"shared_storage_mount_dir": "/shared"}, "shared_storage_mount_dir: cluster uc-test has no shared storage at "
     "/shared (it has: /fsx)"),
])
def test_each_way_a_cluster_cannot_take_the_run_is_named(description, plan, expected):
    problems = byo.cluster_problems({**DESCRIBED, **description}, FACTS, {**PLAN, **plan})
    assert len(problems) == 1 and expected in problems[0], problems


def test_a_run_owned_cluster_and_one_without_accounting_are_warned_about():
    assert byo.cluster_warnings(DESCRIBED, FACTS) == []
    owned = {**DESCRIBED, "tags": [{"key": k, "value": v} for k, v in ownership_tags(
        "trn1_bert_pretrain", "manual__1", started_at=None, ttl_hours=1).items()]}
    warnings = byo.cluster_warnings(owned, {**FACTS, "accounting": False})
    assert len(warnings) == 2 and "the reaper deletes it once that run has ended" in warnings[0]
    assert "billed from its jobs' task spans" in warnings[1]


def test_the_reaper_keeps_a_cluster_no_run_created_whatever_runs_used_it():
    """A user's cluster carries ParallelCluster's tags only: no run's marker, so never an orphan."""
    tags = {t["key"]: t["value"] for t in DESCRIBED["tags"] if not t["key"].startswith("ultracluster:")}
    asked = []
    verdict = judge("cluster", "uc-test", tags, lambda *run: asked.append(run) or "success", None)
    assert (verdict.reap, verdict.reason) == (False, "kept: no ultracluster:created-by=ultracluster marker")
    assert asked == []  # no run is even looked up


def test_sacct_usage_is_one_quoted_command_for_every_job_name():
    command = sacct_usage(["uc.trn1_bert_pretrain-compile.0123456789ab", "uc.train.ba9876543210"], "2026-12-02")
    assert command.shell.endswith("--name uc.trn1_bert_pretrain-compile.0123456789ab,uc.train.ba9876543210 "
                                  "--starttime 2026-12-02 --format JobID,JobName,State,ElapsedRaw,NNodes")
    for names, day in ((["a,b"], "2026-12-02"), (["x;rm -rf /"], "2026-12-02"), (["a"], "today"), ([], "2026-12-02")):
        with pytest.raises(ValueError):
            sacct_usage(names, day)


def test_sacct_usage_parses_real_output():
    """Captured from the local UltraCluster with slurmdbd (tests/integration/test_slurm_side.py)."""
    out = (FIXTURES / "slurm" / "sacct_usage.out").read_text()
    jobs = parse_sacct_usage(out)
    assert [(j["name"], j["state"], j["nodes"]) for j in jobs] == [("uc.acct", "FAILED", 1)]
    assert jobs[0]["elapsed_s"] >= 0 and jobs[0]["job_id"].isdigit()


def test_the_run_is_billed_from_its_jobs_node_hours_not_the_cluster_s_life():
    prices = load_prices()
    jobs = [{"job_id": "7", "name": "c", "state": "COMPLETED", "elapsed_s": 1800, "nodes": 2},
            {"job_id": "8", "name": "t", "state": "COMPLETED", "elapsed_s": 3600, "nodes": 2}]
    usage = job_usage(jobs, "trn1.32xlarge", prices, "sacct")
    rate = prices["instances"]["trn1.32xlarge"]["usd_per_hour"]
    assert (usage["basis"], usage["source"], usage["compute_node_hours"]) == ("slurm_jobs", "sacct", 3.0)
    assert usage["usd"] == usage["compute_usd"] == round(3 * rate, 2)
    assert usage["head_node_usd"] is usage["fsx_usd"] is usage["head_node_hours"] is None
    assert job_usage(jobs, "x1.nope", prices, "sacct")["usd"] is None


def test_without_accounting_the_jobs_are_their_tasks_spans():
    results = [{"job_id": "3", "job_name": "c", "state": "COMPLETED", "started_at": "2026-12-01T10:00:00+00:00",
                "ended_at": "2026-12-01T10:06:00+00:00"}, None]
    assert task_span_jobs(results, 2) == [{"job_id": "3", "name": "c", "state": "COMPLETED", "elapsed_s": 360,
                                           "nodes": 2}]


def test_the_report_and_the_run_note_read_the_job_based_bill_and_name_the_cluster():
    usage = job_usage([{"job_id": "1", "name": "t", "state": "COMPLETED", "elapsed_s": 3600, "nodes": 2}],
                      "trn1.32xlarge", load_prices(), "sacct")
    xcoms = {"preflight": {"plan": PLAN}, "pcluster_create": {"cluster_name": "uc-test", "existing": True,
                                                              "created_at": None},
             "collect_results": {"nodes": 2, "usage": usage}}
    record = run_record({}, "success", xcoms)
    assert record["usage"] == usage and record["existing_cluster"] == "uc-test"
    summary = run_summary("success", xcoms, load_prices())
    assert (summary["cost_usd"], summary["cost_basis"]) == (usage["usd"], "slurm_jobs")
    lines = dict(summary_lines(summary))
    assert lines["cluster"] == "existing uc-test (not created, changed or deleted by this run)"
    assert "from the run's Slurm jobs' node-hours" in lines["cost"]
    # A run on its own cluster gets no such line.
    assert "cluster" not in dict(summary_lines(run_summary("success", {"preflight": {"plan": PLAN}}, load_prices())))
