"""Capacity faults through the lost-node rule (docs/operations.md, "Capacity faults"): a node EC2 has
no capacity for is a lost node; a job that never started because of it is submitted again (not an
auto-resume) once ParallelCluster's insufficient-capacity hold has put the node back to idle~, and
one loss past node_replacements fails the task naming the EC2 error. The head node replays recorded
Slurm output (tests/fixtures/slurm/sinfo_power_up_failed: real Slurm on the local UltraCluster with
the insufficient-capacity fault); the commands it receives are the real built commands."""

from __future__ import annotations

import json

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred
from ultracluster.hooks.head_node import CommandResult
from ultracluster.operators.slurm_job import STATE_KEY_JOB_ID
from ultracluster.operators.slurm_resume import STATE_KEY_AUTO_RESUME
from ultracluster.parsers.slurm import parse_sinfo
from ultracluster.run.events import event
from ultracluster.run.fleet import judge_capacity, partition_capacity
from ultracluster.run.jobs import resume_summary
from ultracluster.run.lost_nodes import LostNodes, capacity_denied, capacity_error
from ultracluster.run.states import FAILED, PENDING, READY
from ultracluster.sensors.fleet import STATE_KEY_LOST_NODES
from ultracluster.triggers.fleet import ComputeFleetTrigger
from ultracluster.triggers.slurm import SlurmJobTrigger

from tests.unit.test_auto_resume import (  # noqa: F401 (autouse)
    OUT,
    listing,
    pending,
    sbatch_env,
    ssh_connection,
)
from tests.unit.test_slurm_job import (
    OK,
    DictStore,
    ReplayHeadNode,
    context,
    operator,
    recorded,
    training_dir,  # noqa: F401 (training_dir is a fixture)
)

ICE = "(Code:InsufficientInstanceCapacity)Failure when resuming nodes"
NODES = ("compute1-dy-trn1-1", "compute1-dy-trn1-2")
# A job whose two dynamic nodes EC2 refused: it ends NODE_FAIL before its script ran.
DENIED = event("job_failed", job_id="8", state="NODE_FAIL", exit_code=0, signal=0, job_reason="NodeDown",
               nodes="compute1-dy-trn1-[1-2]")
AGAIN = {**DENIED, "job_id": "9"}


def sinfo(*lines: str) -> list:
    return parse_sinfo("".join(f"compute1*|up|1|{line}\n" for line in lines))


def test_the_capacity_error_is_read_from_parallelclusters_reason():
    assert capacity_error(ICE) == "InsufficientInstanceCapacity"
    assert capacity_error("down#: (Code:InsufficientHostCapacity)Temporarily disabling node due to insufficient "
                          "capacity") == "InsufficientHostCapacity"
    # Other EC2 errors, bootstrap failures and the health gate's drains are not capacity.
    for reason in ("(Code:InvalidParameterValue)Failure when resuming nodes", "ResumeTimeout reached",
                   "Scheduler health check failed", "UC health check failed: neuron", "", None):
        assert capacity_error(reason) is None
    assert capacity_denied({"n1": f"down#: {ICE}", "n2": f"down#: {ICE}"}) == "InsufficientInstanceCapacity"
    assert capacity_denied({"n1": f"down#: {ICE}", "n2": "down*: Not responding"}) is None
    assert capacity_denied({}) is None


def test_a_node_lost_for_capacity_past_the_limit_names_the_error_and_what_to_do():
    lost = LostNodes(limit=1)
    for job in ("8", "9"):
        lost.fault(job, {NODES[0]: f"down#: {ICE}"})
        lost.observe({}, [NODES[0]])  # back in power saving between the two launches
    message = lost.failure()
    assert message.startswith(f"Nodes lost past node_replacements=1: {NODES[0]} (down#: {ICE}) lost 2 time(s). "
                              "EC2 had no capacity (InsufficientInstanceCapacity)"), message
    assert "capacity_reservation_id" in message and "CAPACITY_BLOCK" in message
    assert "EC2 had no capacity" not in LostNodes(limit=0, counts={"n": 1}, reasons={"n": "ResumeTimeout reached"}
                                                  ).failure()


def test_the_fleet_wait_waits_out_the_hold_and_the_node_is_launched_again():
    """ParallelCluster's hold as the fleet wait sees it: down with the code (replacing), then powered
    down with the hold's reason (a node to launch again: ready)."""
    lost = LostNodes(limit=1)
    held = parse_sinfo(recorded("sinfo_power_up_failed").stdout)
    verdict, reason, message = judge_capacity(partition_capacity(held, None, 2), lost)
    assert (verdict, reason) == (PENDING, "nodes_replacing"), message
    assert lost.counts == dict.fromkeys(NODES, 1)
    disabled = sinfo(f"down~|{NODES[0]}|{ICE}",
                     f"down~|{NODES[1]}|(Code:InsufficientInstanceCapacity)Temporarily disabling node due to "
                     "insufficient capacity")
    assert judge_capacity(partition_capacity(disabled, None, 2), lost).verdict == PENDING
    reset = "Enabling node since insufficient capacity timeout expired"
    back = sinfo(f"idle~|{NODES[0]}|{reset}", f"idle~|{NODES[1]}|{reset}")
    assert judge_capacity(partition_capacity(back, None, 2), lost).verdict == READY
    verdict, reason, message = judge_capacity(partition_capacity(held, None, 2), lost)  # denied again
    assert (verdict, reason) == (FAILED, "node_lost") and "EC2 had no capacity (InsufficientInstanceCapacity)" in message


def test_a_job_ec2_had_no_capacity_for_waits_for_the_fleet_even_with_auto_resume_off(training_dir):
    store = DictStore()
    replay = ReplayHeadNode(tail=[OK], sinfo=[recorded("sinfo_power_up_failed")])
    op = operator(replay, training_dir, auto_resume_attempts=0)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute_complete(context(store), DENIED)
    trigger = deferred.value.trigger
    assert isinstance(trigger, ComputeFleetTrigger) and deferred.value.method_name == "resume_after_fleet"
    assert trigger.lost_nodes["counts"] == dict.fromkeys(NODES, 1) and trigger.node_replacements == 1
    record = store.values[STATE_KEY_AUTO_RESUME]
    assert record["resumes"] == []  # not an auto-resume
    assert record["relaunches"] == [{"failed_job_id": "8", "capacity_error": "InsufficientInstanceCapacity",
                                     "job_id": None}]
    # The same job's end seen again (a retry of the task) decides nothing more.
    with pytest.raises(TaskDeferred):
        op.execute_complete(context(store), DENIED)
    assert len(store.values[STATE_KEY_AUTO_RESUME]["relaunches"]) == 1
    assert store.values[STATE_KEY_LOST_NODES]["counts"] == dict.fromkeys(NODES, 1)


def test_once_the_fleet_is_back_the_job_is_submitted_again_as_it_was(training_dir):
    relaunch = {"resumes": [], "relaunches": [{"failed_job_id": "8", "capacity_error": "InsufficientInstanceCapacity",
                                              "job_id": None}]}
    store = DictStore(**{STATE_KEY_AUTO_RESUME: relaunch})
    replay = ReplayHeadNode(squeue=[recorded("squeue_none")], mkdir=[OK], sbatch=[recorded("sbatch_mix")])
    op = operator(replay, training_dir, auto_resume_attempts=0)
    with pytest.raises(TaskDeferred) as deferred:
        op.resume_after_fleet(context(store), event("complete", lost_nodes={"counts": dict.fromkeys(NODES, 1)}))
    assert isinstance(deferred.value.trigger, SlurmJobTrigger) and deferred.value.trigger.job_id == "1"
    assert "mkdir" in replay.programs()  # a fresh submission: the training files copied again
    env = sbatch_env(replay)
    assert "AUTO_RESUME" not in env and "RESUME_DIR" not in env
    assert store.values[STATE_KEY_AUTO_RESUME]["relaunches"][-1]["job_id"] == "1"
    assert store.values[STATE_KEY_JOB_ID] == "1"
    summary = resume_summary(store.values[STATE_KEY_AUTO_RESUME])
    assert summary["resumes"] == 0 and summary["relaunches"] == [
        {"failed_job_id": "8", "capacity_error": "InsufficientInstanceCapacity", "job_id": "1"}]


def test_a_resume_ec2_had_no_capacity_for_is_submitted_again_as_that_resume(training_dir):
    record = pending(("6", 12))
    record["resumes"][-1]["job_id"] = "7"  # the resume, job 7, was refused capacity
    record["relaunches"] = [{"failed_job_id": "7", "capacity_error": "InsufficientInstanceCapacity", "job_id": None}]
    store = DictStore(**{STATE_KEY_AUTO_RESUME: record})
    replay = ReplayHeadNode(squeue=[recorded("squeue_none")], list=[listing("ckpt_10.pt")],
                            sbatch=[recorded("sbatch_mix")])
    op = operator(replay, training_dir, auto_resume_attempts=1)
    with pytest.raises(TaskDeferred):
        op.resume_after_fleet(context(store), event("complete"))
    env = sbatch_env(replay)
    assert env["RESUME_DIR"] == f"{OUT}/output_6" and json.loads(env["AUTO_RESUME"])["resumes"] == 1
    assert "mkdir" not in replay.programs()
    saved = store.values[STATE_KEY_AUTO_RESUME]
    assert len(saved["resumes"]) == 1 and saved["resumes"][-1]["job_id"] == "1"  # still one resume
    assert saved["relaunches"][-1]["job_id"] == "1"


def test_a_retry_after_a_crash_before_the_relaunch_submits_it(training_dir):
    relaunch = {"resumes": [], "relaunches": [{"failed_job_id": "8", "capacity_error": "InsufficientInstanceCapacity",
                                              "job_id": None}]}
    store = DictStore(**{STATE_KEY_AUTO_RESUME: relaunch, STATE_KEY_JOB_ID: None})
    replay = ReplayHeadNode(squeue=[recorded("squeue_none")], mkdir=[OK], sbatch=[recorded("sbatch_mix")])
    with pytest.raises(TaskDeferred):
        operator(replay, training_dir).execute(context(store))
    assert [p for p in replay.programs() if p == "sbatch"] == ["sbatch"]
    assert store.values[STATE_KEY_AUTO_RESUME]["relaunches"][-1]["job_id"] == "1"


def test_denied_again_past_node_replacements_fails_the_task_naming_the_capacity_error(training_dir):
    store = DictStore()
    sinfo_out = recorded("sinfo_power_up_failed")
    reset = CommandResult(0, "".join(f"compute1*|up|1|idle~|{n}|none\n" for n in NODES), "")
    op = operator(ReplayHeadNode(tail=[OK], sinfo=[sinfo_out]), training_dir)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute_complete(context(store), DENIED)
    ledger = LostNodes.from_dict(deferred.value.trigger.lost_nodes, 1)
    judge_capacity(partition_capacity(parse_sinfo(reset.stdout), None, 2), ledger)  # the fleet wait saw them back
    store.values[STATE_KEY_LOST_NODES] = ledger.to_dict()
    op = operator(ReplayHeadNode(tail=[OK], sinfo=[sinfo_out]), training_dir)
    with pytest.raises(AirflowFailException) as failed:
        op.execute_complete(context(store), AGAIN)
    message = str(failed.value)
    assert message.startswith(f"Nodes lost past node_replacements=1: {NODES[0]} (down#: {ICE}) lost 2 time(s)"), message
    assert "EC2 had no capacity (InsufficientInstanceCapacity)" in message
    assert len(store.values[STATE_KEY_AUTO_RESUME]["relaunches"]) == 1  # no second relaunch


def test_a_node_fault_that_is_not_capacity_stays_auto_resumes_business(training_dir):
    down = CommandResult(0, f"compute1*|up|1|down*|{NODES[0]}|Not responding\n"
                            f"compute1*|up|1|down#|{NODES[1]}|{ICE}\n", "")
    op = operator(ReplayHeadNode(tail=[OK], sinfo=[down]), training_dir, auto_resume_attempts=0)
    with pytest.raises(AirflowFailException, match="auto_resume_attempts=0"):
        op.execute_complete(context(DictStore()), DENIED)
