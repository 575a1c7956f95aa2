"""Auto-resume of SlurmJobOperator after a node fault: the decision (node fault vs the job's own
failure, attempts left or exhausted), the fleet wait it defers to, and the resumed submission
(RESUME_DIR at the newest checkpoint, steps lost, reattach to the resumed job). The head node
replays recorded Slurm output; the commands it receives are the real built commands."""

from __future__ import annotations

import json
import shlex

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from tests.unit.test_slurm_job import (OK, TRAIN_NAME, DictStore, ReplayHeadNode, context, operator, program,
                                       recorded, squeue_line, training_dir)  # noqa: F401 (training_dir is a fixture)
from ultracluster import remote_commands as rc
from ultracluster.run.events import event
from ultracluster.hooks.head_node import CommandResult
from ultracluster.operators.slurm_resume import STATE_KEY_AUTO_RESUME
from ultracluster.run.jobs import resume_summary
from ultracluster.run.plan import resume_attempts
from ultracluster.operators.slurm_job import STATE_KEY_JOB_ID
from ultracluster.run.contracts import newest_checkpoint
from ultracluster.run.states import is_node_fault
from ultracluster.sensors.fleet import STATE_KEY_LOST_NODES
from ultracluster.triggers.fleet import ComputeFleetTrigger
from ultracluster.triggers.slurm import SlurmJobTrigger

OUT = "/fsx/jobs/run1/train"
NODE_FAIL = event("job_failed", job_id="8", state="NODE_FAIL", exit_code=0, signal=0, job_reason="NodeDown",
                  last_progress={"step": 13, "total": 40})


@pytest.fixture(autouse=True)
def ssh_connection(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_ULTRACLUSTER_HEAD_NODE",
                       json.dumps({"conn_type": "ssh", "login": "ultracluster", "port": 2222}))


def listing(*names: str) -> CommandResult:
    return CommandResult(0, "".join(f"1024 {name}\n" for name in names), "")


def sbatch_env(replay: ReplayHeadNode) -> dict[str, str]:
    sbatch = rc.slurm_command("sbatch")
    (call,) = [c for c in replay.calls if sbatch in shlex.split(c.shell)]
    words = shlex.split(call.shell)
    return dict(w.split("=", 1) for w in words[1:words.index(sbatch)])


@pytest.mark.parametrize("state, reason, fault", [
    ("NODE_FAIL", "NodeDown", True), ("NODE_FAIL", None, True), ("BOOT_FAIL", None, True),
    ("FAILED", "NodeDown", True), ("FAILED", "NonZeroExitCode", False), ("TIMEOUT", "TimeLimit", False),
    ("CANCELLED", None, False), ("OUT_OF_MEMORY", None, False), ("COMPLETED", None, False), (None, None, False),
])
def test_node_fault_classification(state, reason, fault):
    assert is_node_fault(state, reason) is fault


def test_attempts_param_is_checked():
    assert resume_attempts("2") == 2 and resume_attempts(0) == 0
    for bad in ("-1", "two", None):
        with pytest.raises(ValueError, match="auto_resume_attempts"):
            resume_attempts(bad)


def test_newest_checkpoint_ignores_a_save_in_progress():
    assert newest_checkpoint("10 ckpt_10.pt\n20 ckpt_9.pt\n30 .ckpt_12.pt.tmp\n") == 10
    assert newest_checkpoint("") is None


def test_node_fault_defers_to_the_fleet_trigger_with_the_pinned_key(training_dir):
    store = DictStore()
    op = operator(ReplayHeadNode(tail=[OK]), training_dir, auto_resume_attempts="2", region_name="us-east-1")
    with pytest.raises(TaskDeferred) as deferred:
        op.execute_complete(context(store), NODE_FAIL)
    trigger = deferred.value.trigger
    assert isinstance(trigger, ComputeFleetTrigger) and deferred.value.method_name == "resume_after_fleet"
    assert (trigger.cluster_name, trigger.num_nodes, trigger.partition) == ("c1", 2, "compute1")
    assert trigger.keep_host_key and trigger.host_key == op.head_node["host_key"] and trigger.ssh_port == 2222
    assert trigger.region_name == "us-east-1" and trigger.stuck_after_s == op.resume_fleet_timeout
    assert store.values[STATE_KEY_AUTO_RESUME] == {"target_step": 40, "nodes_lost": {}, "resumes": [
        {"failed_job_id": "8", "state": "NODE_FAIL", "reason": "NodeDown", "last_step": 13, "job_id": None}]}


LOST = event("job_failed", job_id="8", state="NODE_FAIL", exit_code=0, signal=0, job_reason="NodeDown",
             nodes="compute1-dy-trn1-[1-2]", last_progress={"step": 13, "total": 40})
SINFO_ONE_DOWN = CommandResult(0, "compute1*|up|1|down*|compute1-dy-trn1-1|Not responding\n"
                                  "compute1*|up|1|mixed|compute1-dy-trn1-2|none\n", "")


def test_a_node_fault_counts_the_jobs_lost_nodes_and_the_fleet_wait_goes_on_counting(training_dir):
    store = DictStore()
    replay = ReplayHeadNode(tail=[OK], sinfo=[SINFO_ONE_DOWN])
    op = operator(replay, training_dir, auto_resume_attempts="2")
    with pytest.raises(TaskDeferred) as deferred:
        op.execute_complete(context(store), LOST)
    sinfo = [c.shell for c in replay.calls if program(c) == "sinfo"]
    assert sinfo == [rc.sinfo(nodes="compute1-dy-trn1-[1-2]").shell]
    trigger = deferred.value.trigger
    assert trigger.node_replacements == 1
    assert trigger.lost_nodes["counts"] == {"compute1-dy-trn1-1": 1}
    assert trigger.lost_nodes["reasons"] == {"compute1-dy-trn1-1": "down*: Not responding"}
    assert store.values[STATE_KEY_LOST_NODES] == trigger.lost_nodes
    assert store.values[STATE_KEY_AUTO_RESUME]["nodes_lost"] == {"compute1-dy-trn1-1": 1}
    # The same job's end seen again (a retry of the task) counts nothing more.
    with pytest.raises(TaskDeferred):
        op.execute_complete(context(store), LOST)
    assert store.values[STATE_KEY_LOST_NODES]["counts"] == {"compute1-dy-trn1-1": 1}


def test_a_node_lost_past_node_replacements_fails_the_task_naming_it(training_dir):
    store = DictStore()
    op = operator(ReplayHeadNode(tail=[OK], sinfo=[SINFO_ONE_DOWN]), training_dir, auto_resume_attempts="2",
                  node_replacements=0)
    with pytest.raises(AirflowFailException, match=r"Nodes lost past node_replacements=0: compute1-dy-trn1-1 "
                                                   r"\(down\*: Not responding\) lost 1 time\(s\)"):
        op.execute_complete(context(store), LOST)
    # The resume's fleet wait reports a node lost past the limit: deterministic, no retry.
    op = operator(ReplayHeadNode(), training_dir, auto_resume_attempts="2")
    ledger = {"counts": {"compute1-dy-trn1-1": 2}, "reasons": {"compute1-dy-trn1-1": "down~: ResumeTimeout reached"},
              "failing": ["compute1-dy-trn1-1"], "jobs": ["8"]}
    with pytest.raises(AirflowFailException, match="lost 2 time"):
        op.resume_after_fleet(context(store), event("node_lost", "Nodes lost past node_replacements=1: "
                                                    "compute1-dy-trn1-1 (down~: ResumeTimeout reached) lost 2 time(s)",
                                                    lost_nodes=ledger))
    assert store.values[STATE_KEY_LOST_NODES] == ledger
    with pytest.raises(ValueError, match="node_replacements"):
        operator(ReplayHeadNode(), training_dir, node_replacements="9").job(context(DictStore()))


@pytest.mark.parametrize("event, tail, error", [
    ({**NODE_FAIL, "state": "FAILED", "job_reason": "NonZeroExitCode", "exit_code": 1}, "Traceback\n", AirflowException),
    (NODE_FAIL, "UC_ERROR DATA_DIR has no *_training_*.hdf5\n", AirflowFailException),
])
def test_the_jobs_own_failure_never_resumes(training_dir, event, tail, error):
    store = DictStore()
    op = operator(ReplayHeadNode(tail=[CommandResult(0, tail, "")]), training_dir, auto_resume_attempts=2)
    with pytest.raises(error) as raised:
        op.execute_complete(context(store), event)
    assert not isinstance(raised.value, TaskDeferred)
    assert STATE_KEY_AUTO_RESUME not in store.values


def test_attempts_exhausted_fail_naming_them(training_dir):
    done = [{"failed_job_id": jid, "state": "NODE_FAIL", "last_step": 5, "from_step": 0, "steps_lost": 5,
             "job_id": nxt} for jid, nxt in (("3", "5"), ("5", "8"))]
    store = DictStore(**{STATE_KEY_AUTO_RESUME: {"target_step": 40, "resumes": done}})
    op = operator(ReplayHeadNode(tail=[OK]), training_dir, auto_resume_attempts=2)
    with pytest.raises(AirflowException, match=r"after 2 of 2 auto-resume attempt\(s\) \(earlier failed jobs: 3, 5\)"
                       r".*NODE_FAIL") as raised:
        op.execute_complete(context(store), NODE_FAIL)
    assert not isinstance(raised.value, TaskDeferred)


def test_zero_attempts_is_a_plain_node_fail(training_dir):
    op = operator(ReplayHeadNode(tail=[OK]), training_dir, auto_resume_attempts=0)
    with pytest.raises(AirflowException, match="NODE_FAIL") as raised:
        op.execute_complete(context(), NODE_FAIL)
    assert not isinstance(raised.value, TaskDeferred) and "auto_resume_attempts=0" in str(raised.value)


def pending(*failed: tuple[str, int | None]) -> dict:
    resumes = [{"failed_job_id": jid, "state": "NODE_FAIL", "reason": "NodeDown", "last_step": last,
                "job_id": str(int(jid) + 1)} for jid, last in failed]
    resumes[-1]["job_id"] = None
    return {"target_step": 40, "resumes": resumes}


def test_resume_submits_from_the_newest_checkpoint_of_all_earlier_jobs(training_dir):
    # Job 6 left ckpt_10 and died at step 12; job 7, its resume, died at step 13 before checkpointing.
    store = DictStore(**{STATE_KEY_AUTO_RESUME: pending(("6", 12), ("7", 13))})
    replay = ReplayHeadNode(squeue=[recorded("squeue_none")], list=[listing("ckpt_10.pt", "ckpt_5.pt"), listing()],
                            sbatch=[recorded("sbatch_mix")])
    op = operator(replay, training_dir, auto_resume_attempts=2)
    ctx = context(store)
    with pytest.raises(TaskDeferred) as deferred:
        op.resume_after_fleet(ctx, event("complete", head_node={}))
    trigger = deferred.value.trigger
    assert isinstance(trigger, SlurmJobTrigger) and deferred.value.method_name == "execute_complete"
    assert (trigger.job_id, trigger.job_name, trigger.log_offset) == ("1", TRAIN_NAME, 0)
    assert [c.description for c in replay.calls if c.description.startswith("list")] == [
        f"list files under {OUT}/output_6/checkpoints", f"list files under {OUT}/output_7/checkpoints"]
    env = sbatch_env(replay)
    assert env["RESUME_DIR"] == f"{OUT}/output_6" and env["STEPS_THIS_RUN"] == "30"  # ends at step 40 as planned
    auto = json.loads(env["AUTO_RESUME"])
    assert (auto["resumes"], auto["steps_lost"]) == (2, 3)  # 13 - 10 (the first entry here has no figure)
    last = store.values[STATE_KEY_AUTO_RESUME]["resumes"][-1]
    assert (last["from_step"], last["steps_lost"], last["job_id"]) == (10, 3, "1")
    assert store.values[STATE_KEY_JOB_ID] == "1"


def test_resume_without_any_checkpoint_starts_over_and_counts_every_step_lost(training_dir):
    store = DictStore(**{STATE_KEY_AUTO_RESUME: pending(("8", 4))})
    replay = ReplayHeadNode(squeue=[recorded("squeue_none")], list=[listing()], sbatch=[recorded("sbatch_mix")])
    op = operator(replay, training_dir, auto_resume_attempts=1)
    with pytest.raises(TaskDeferred):
        op.resume_after_fleet(context(store), event("complete"))
    env = sbatch_env(replay)
    assert "RESUME_DIR" not in env and "STEPS_THIS_RUN" not in env
    assert resume_summary(store.values[STATE_KEY_AUTO_RESUME])["steps_lost"] == 4


def test_resume_counts_from_resume_froms_checkpoint_when_it_is_the_newest(training_dir):
    store = DictStore(**{STATE_KEY_AUTO_RESUME: {**pending(("8", 57)), "target_step": 90}})  # 50 + 40 this run
    replay = ReplayHeadNode(squeue=[recorded("squeue_none")], list=[listing()], sbatch=[recorded("sbatch_mix")])
    op = operator(replay, training_dir, auto_resume_attempts=1)
    op.job_env["RESUME_CKPT"] = f"{OUT}/.resume/ckpt_50.pt"
    with pytest.raises(TaskDeferred):
        op.resume_after_fleet(context(store), event("complete"))
    env = sbatch_env(replay)
    assert "RESUME_DIR" not in env and env["RESUME_CKPT"] == f"{OUT}/.resume/ckpt_50.pt"
    entry = store.values[STATE_KEY_AUTO_RESUME]["resumes"][-1]
    assert (entry["from_step"], entry["steps_lost"]) == (50, 7) and env["STEPS_THIS_RUN"] == "40"


def test_steps_lost_come_from_the_log_when_the_trigger_saw_no_progress(training_dir):
    record = pending(("8", None))
    del record["target_step"]
    store = DictStore(**{STATE_KEY_AUTO_RESUME: record})
    log = "UC_PROGRESS step=11 total=40 loss=7.1 lr=0.0001 throughput=9.00 eta_s=30\n" \
          "UC_PROGRESS step=12 total=40 loss=7.0 lr=0.0001 throughput=9.00 eta_s=29\n"
    replay = ReplayHeadNode(squeue=[recorded("squeue_none")], list=[listing("ckpt_10.pt")],
                            tail=[CommandResult(0, log, "")], sbatch=[recorded("sbatch_mix")])
    op = operator(replay, training_dir, auto_resume_attempts=1)
    with pytest.raises(TaskDeferred):
        op.resume_after_fleet(context(store), event("complete"))
    assert any(c.description == f"tail -n 200 {OUT}/slurm-8.out" for c in replay.calls)
    entry = store.values[STATE_KEY_AUTO_RESUME]["resumes"][-1]
    assert (entry["last_step"], entry["from_step"], entry["steps_lost"]) == (12, 10, 2)
    assert sbatch_env(replay)["STEPS_THIS_RUN"] == "30"


def test_a_fleet_that_does_not_recover_fails_the_task(training_dir):
    store = DictStore(**{STATE_KEY_AUTO_RESUME: pending(("8", 4))})
    replay = ReplayHeadNode()
    op = operator(replay, training_dir, auto_resume_attempts=1)
    with pytest.raises(AirflowException, match="fleet did not recover: Nodes stayed down"):
        op.resume_after_fleet(context(store), event("nodes_stuck", "Nodes stayed down"))
    assert replay.calls == []


def test_resume_reattaches_to_a_resumed_job_already_running(training_dir):
    store = DictStore(**{STATE_KEY_AUTO_RESUME: pending(("8", 4))})
    replay = ReplayHeadNode(squeue=[squeue_line("9", TRAIN_NAME, "RUNNING")])
    op = operator(replay, training_dir, auto_resume_attempts=1)
    with pytest.raises(TaskDeferred) as deferred:
        op.resume_after_fleet(context(store), event("complete"))
    assert deferred.value.trigger.job_id == "9" and "sbatch" not in replay.programs()


def test_retry_after_a_crash_between_the_records_submits_that_resume_not_a_fresh_job(training_dir):
    store = DictStore(**{STATE_KEY_AUTO_RESUME: pending(("8", 13)), STATE_KEY_JOB_ID: None})
    replay = ReplayHeadNode(squeue=[recorded("squeue_none")], list=[listing("ckpt_10.pt")],
                            sbatch=[recorded("sbatch_mix")])
    op = operator(replay, training_dir, auto_resume_attempts=2)
    with pytest.raises(TaskDeferred):
        op.execute(context(store))
    assert sbatch_env(replay)["RESUME_DIR"] == f"{OUT}/output_8"
    assert "mkdir" not in replay.programs()  # a resume, not a fresh submission (which copies the files)
    assert len(store.values[STATE_KEY_AUTO_RESUME]["resumes"]) == 1


def test_a_fresh_submission_clears_an_old_record(training_dir):
    done = pending(("3", 5))
    done["resumes"][-1]["job_id"] = "4"
    store = DictStore(**{STATE_KEY_AUTO_RESUME: done})
    replay = ReplayHeadNode(squeue=[recorded("squeue_none")], mkdir=[OK], sbatch=[recorded("sbatch_mix")])
    op = operator(replay, training_dir, auto_resume_attempts=2)
    with pytest.raises(TaskDeferred):
        op.execute(context(store))
    assert store.values[STATE_KEY_AUTO_RESUME] == {"resumes": []} and "AUTO_RESUME" not in sbatch_env(replay)


def test_success_reports_the_resumes(training_dir):
    record = pending(("8", 13))
    record["resumes"][-1].update(job_id="9", from_step=10, steps_lost=3)
    op = operator(ReplayHeadNode(), training_dir, auto_resume_attempts=2)
    result = op.execute_complete(context(DictStore(**{STATE_KEY_AUTO_RESUME: record})),
                                 event("complete", job_id="9", state="COMPLETED", exit_code=0))
    assert result["auto_resume"] == {"resumes": 1, "steps_lost": 3, "history": [
        {"failed_job_id": "8", "state": "NODE_FAIL", "last_step": 13, "from_step": 10, "steps_lost": 3, "job_id": "9"}],
        "nodes_lost": {}}


def test_validate_needs_the_cluster_name_when_auto_resume_is_on(training_dir):
    op = operator(ReplayHeadNode(), training_dir, auto_resume_attempts=1)
    op.head_node = {k: v for k, v in op.head_node.items() if k != "cluster_name"}
    with pytest.raises(ValueError, match="cluster_name"):
        op.job(context())
