"""The node health gate in the train task (operators/health_gate.py, SlurmJobOperator): the job it
submits, the report read back, the unhealthy nodes drained with their reasons, then the resume through
the fleet wait, and the clear failures when a drain cannot be done. The head node replays recorded
Slurm output; the commands it receives are the real built commands."""
from __future__ import annotations

import json
import shlex

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from tests.unit.test_health import line
from tests.unit.test_slurm_job import OK, DictStore, ReplayHeadNode, context, operator, recorded
from ultracluster import remote_commands as rc
from ultracluster.hooks.head_node import CommandResult, HeadNodeUnreachableError
from ultracluster.hooks.slurm import SlurmHook
from ultracluster.operators import health_gate
from ultracluster.parsers.job_end import job_end_extras, log_lines
from ultracluster.operators.slurm_resume import STATE_KEY_AUTO_RESUME
from ultracluster.run.events import event
from ultracluster.run.health import HEALTH_GATE_EXIT_CODE, gate_env
from ultracluster.triggers.fleet import ComputeFleetTrigger

JOB_DIR = "/fsx/jobs/run1/train"
GATE_FAILED = event("job_failed", job_id="9", state="FAILED", exit_code=HEALTH_GATE_EXIT_CODE,
                    job_reason="NonZeroExitCode", log_offset=0)
REPORT = CommandResult(0, "\n".join(["UC_HEALTH_NODES compute1-st-trn1-1 compute1-st-trn1-2",
                                     line("compute1-st-trn1-1"), line("compute1-st-trn1-2", neuron=15)]) + "\n", "")
REASON = "UC health check failed: neuron (found 15 of 16 devices)"


class Recorder:
    """A logger that keeps its lines (the helpers take the task's logger)."""

    def __init__(self):
        self.lines: list[tuple[str, str]] = []

    def _add(self, level, message, *args):
        self.lines.append((level, message % args if args else message))

    def info(self, message, *args):
        self._add("info", message, *args)

    def warning(self, message, *args):
        self._add("warning", message, *args)

    def exception(self, message, *args):
        self._add("exception", message, *args)

    debug = info


@pytest.fixture
def training_dir(tmp_path):
    for name in ("run_dp_bert_large_hf_pretrain_bf16_s128.sh", "dp_bert_large_hf_pretrain_hdf5.py", "node_health.sh"):
        (tmp_path / name).write_text("#!/bin/bash\n")
    return str(tmp_path)


@pytest.fixture(autouse=True)
def ssh_connection(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_ULTRACLUSTER_HEAD_NODE",
                       json.dumps({"conn_type": "ssh", "login": "ultracluster", "port": 2222}))


def gated(replay, training_dir, **kwargs):
    return operator(replay, training_dir, health_gate="trn1.32xlarge", **kwargs)


def drains(replay: ReplayHeadNode) -> list[list[str]]:
    return [shlex.split(c.shell) for c in replay.calls if c.shell.startswith("sudo ")]


# ------------------------------------------------------------------------------- the job
def test_the_gated_job_carries_the_expectations_and_runs_the_gate_first(training_dir):
    replay = ReplayHeadNode(squeue=[recorded("squeue_none")], mkdir=[OK], sbatch=[recorded("sbatch_mix")])
    op = gated(replay, training_dir)
    with pytest.raises(TaskDeferred):
        op.execute(context())
    (sbatch,) = [c for c in replay.calls if rc.slurm_command("sbatch") in c.shell]
    words = shlex.split(sbatch.shell)
    env = dict(w.split("=", 1) for w in words[1:words.index(rc.slurm_command("sbatch"))])
    assert {k: env[k] for k in gate_env("trn1.32xlarge")} == gate_env("trn1.32xlarge")
    assert f"--kill-on-bad-exit=0 {JOB_DIR}/node_health.sh" in words[words.index("--wrap") + 1]


@pytest.mark.parametrize("setting", [None, "None", ""])
def test_no_gate_no_gate_step(training_dir, setting):
    op = operator(ReplayHeadNode(), training_dir, health_gate=setting)
    spec = op.job(context()).spec
    assert spec.health_gate is None and spec.sbatch_args("r")["health_check"] is None
    assert not [k for k in spec.env if k.startswith("UC_HEALTH_")]


def test_the_gate_needs_its_script_and_a_known_instance_type(training_dir, tmp_path):
    (tmp_path / "node_health.sh").unlink()
    with pytest.raises(ValueError, match="node_health.sh not found"):
        gated(ReplayHeadNode(), training_dir).job(context())
    with pytest.raises(ValueError, match="no expectations for instance type 'trn2.48xlarge'"):
        operator(ReplayHeadNode(), training_dir, health_gate="trn2.48xlarge").job(context())


# ------------------------------------------------------------------------------- a failed gate
def test_unhealthy_nodes_are_drained_then_the_job_resumes_after_the_fleet_wait(training_dir, capsys):
    replay = ReplayHeadNode(tail=[OK], read=[REPORT], sudo=[OK])
    store = DictStore()
    op = gated(replay, training_dir, auto_resume_attempts=2)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute_complete(context(store), GATE_FAILED)
    assert isinstance(deferred.value.trigger, ComputeFleetTrigger)
    assert deferred.value.method_name == "resume_after_fleet"
    assert [c.description for c in replay.calls if c.description.startswith("read")] == [
        f"read {JOB_DIR}/slurm-9.health"]
    assert drains(replay) == [["sudo", "-n", "--preserve-env=SLURM_CONF", rc.slurm_command("scontrol"), "update",
                               "NodeName=compute1-st-trn1-2", "State=DRAIN", f"Reason={REASON}"]]
    (entry,) = store.values[STATE_KEY_AUTO_RESUME]["resumes"]
    assert entry["failed_job_id"] == "9" and entry["drained"] == {"compute1-st-trn1-2": REASON}
    log = capsys.readouterr().out  # the task log
    assert "Node health gate (trn1.32xlarge): 2 node(s), 1 unhealthy" in log
    assert "  compute1-st-trn1-1: healthy [efa=8, neuron=16]" in log
    assert "  compute1-st-trn1-2: neuron (found 15 of 16 devices) [efa=8, neuron=15]" in log
    assert f"Drained compute1-st-trn1-2: {REASON}" in log
    assert "unhealthy nodes drained: compute1-st-trn1-2" in log


def test_nodes_are_drained_once_per_reason(training_dir):
    report = CommandResult(0, "\n".join([line("n-1", efa=7), line("n-2", neuron=15), line("n-3", neuron=15)]), "")
    replay = ReplayHeadNode(tail=[OK], read=[report], sudo=[OK])
    with pytest.raises(TaskDeferred):
        gated(replay, training_dir, auto_resume_attempts=2).execute_complete(context(), GATE_FAILED)
    assert [(d[5], d[7]) for d in drains(replay)] == [
        ("NodeName=n-1", "Reason=UC health check failed: efa (found 7 of 8 devices)"),
        ("NodeName=n-2,n-3", f"Reason={REASON}")]


def test_without_resumes_left_it_fails_naming_the_node_and_the_check(training_dir):
    replay = ReplayHeadNode(tail=[OK], read=[REPORT], sudo=[OK])
    with pytest.raises(AirflowFailException) as raised:
        gated(replay, training_dir, auto_resume_attempts=0).execute_complete(context(), GATE_FAILED)
    assert not isinstance(raised.value, TaskDeferred)
    assert f"compute1-st-trn1-2 ({REASON}); drained" in str(raised.value)
    assert "auto_resume_attempts=0" in str(raised.value)
    assert len(drains(replay)) == 1  # drained all the same: no later job may land on it


def test_a_refused_drain_fails_the_task_at_once(training_dir):
    refused = CommandResult(1, "", "sudo: a password is required\n")
    replay = ReplayHeadNode(tail=[OK], read=[REPORT], sudo=[refused])
    with pytest.raises(AirflowFailException, match=r"Could not drain compute1-st-trn1-2 .*a password is required"):
        gated(replay, training_dir, auto_resume_attempts=2).execute_complete(context(), GATE_FAILED)


class UnreachableOn(ReplayHeadNode):
    """The head node is lost when ``program`` runs."""

    def __init__(self, program: str, **responses):
        super().__init__(**responses)
        self.lost_on = program

    def run(self, command, *, timeout=None):
        if command.shell.startswith(self.lost_on) or command.description.startswith(self.lost_on):
            raise HeadNodeUnreachableError("connection refused")
        return super().run(command, timeout=timeout)


@pytest.mark.parametrize("lost_on, match", [
    ("sudo", r"Could not drain compute1-st-trn1-2 \(UC health check failed: neuron .*connection refused"),
    ("read", r"its report cannot be read, so no node was drained: connection refused"),
])
def test_an_unreachable_head_node_fails_the_task_clearly(training_dir, lost_on, match):
    replay = UnreachableOn(lost_on, tail=[OK], read=[REPORT], sudo=[OK])
    store = DictStore()
    with pytest.raises(AirflowFailException, match=match):
        gated(replay, training_dir, auto_resume_attempts=2).execute_complete(context(store), GATE_FAILED)
    assert STATE_KEY_AUTO_RESUME not in store.values  # no resume decided on undrained nodes


def test_a_failed_gate_without_a_failing_report_drains_nothing(training_dir):
    replay = ReplayHeadNode(tail=[CommandResult(0, "srun: error: Unable to create step\n", "")],
                            read=[CommandResult(0, "UC_HEALTH_NODES n-1 n-2\n", "")])
    with pytest.raises(AirflowFailException, match="no node's report says why") as raised:
        gated(replay, training_dir, auto_resume_attempts=2).execute_complete(context(), GATE_FAILED)
    assert "srun: error: Unable to create step" in str(raised.value) and drains(replay) == []


def test_exit_75_without_a_gate_is_an_ordinary_failure(training_dir):
    replay = ReplayHeadNode(tail=[OK])
    with pytest.raises(AirflowException) as raised:
        operator(replay, training_dir, auto_resume_attempts=2).execute_complete(context(), GATE_FAILED)
    assert not isinstance(raised.value, (AirflowFailException, TaskDeferred))
    assert replay.programs() == ["tail"]


def test_the_resume_after_a_drain_runs_the_gate_again(training_dir):
    store = DictStore()
    op = gated(ReplayHeadNode(tail=[OK], read=[REPORT], sudo=[OK]), training_dir, auto_resume_attempts=2)
    with pytest.raises(TaskDeferred):
        op.execute_complete(context(store), GATE_FAILED)
    replay = ReplayHeadNode(squeue=[recorded("squeue_none")], list=[CommandResult(0, "", "")],
                            tail=[OK], sbatch=[recorded("sbatch_mix")])
    op = gated(replay, training_dir, auto_resume_attempts=2)
    with pytest.raises(TaskDeferred):
        op.resume_after_fleet(context(store), event("complete", head_node={}))
    (sbatch,) = [c for c in replay.calls if rc.slurm_command("sbatch") in c.shell]
    words = shlex.split(sbatch.shell)
    assert "node_health.sh" in words[words.index("--wrap") + 1]
    auto = json.loads(dict(w.split("=", 1) for w in words[1:words.index(rc.slurm_command("sbatch"))])["AUTO_RESUME"])
    assert auto["history"][0]["drained"] == {"compute1-st-trn1-2": REASON}


# ------------------------------------------------------------------------------- a passed gate
def test_a_passed_gate_shows_in_the_task_log_and_the_result(training_dir, capsys):
    healthy = CommandResult(0, "\n".join(["UC_HEALTH_NODES n-1 n-2", line("n-1"), line("n-2")]), "")
    replay = ReplayHeadNode(read=[healthy])
    op = gated(replay, training_dir)
    result = op.execute_complete(context(), event("complete", job_id="7", state="COMPLETED", exit_code=0))
    assert result["node_health"] == {"instance_type": "trn1.32xlarge", "healthy": True, "nodes": {
        "n-1": {"verdict": "healthy", "found": {"neuron": 16, "efa": 8}},
        "n-2": {"verdict": "healthy", "found": {"neuron": 16, "efa": 8}}}}
    assert "Node health gate (trn1.32xlarge): 2 node(s), all healthy" in capsys.readouterr().out


def test_an_unreadable_report_after_success_only_warns():
    log = Recorder()

    class Lost:
        def run(self, command, *, timeout=None):
            raise HeadNodeUnreachableError("gone")

    files = SlurmHook(head_node_hook=Lost()).job_end_files(JOB_DIR, "7", f"{JOB_DIR}/results.json", health_gate=True,
                                                           launcher=False)
    extras, lines = job_end_extras(files, job_id="7", results_path=f"{JOB_DIR}/results.json",
                                   health_gate="trn1.32xlarge")
    log_lines(log, lines)
    assert extras == {"node_health": None}
    assert log.lines == [("warning", "Node health gate: the report of job 7 is unreadable: gone")]


def test_unreadable_report_lines_are_logged():
    log = Recorder()
    health_gate.log_gate(log, "trn1.32xlarge", [], ["UC_HEALTH {broken"])
    assert log.lines == [("info", "Node health gate (trn1.32xlarge): no node reported"),
                         ("warning", "Node health gate: unreadable report line: UC_HEALTH {broken")]


# ------------------------------------------------------------------------------- the lost-node rule
def test_drained_nodes_are_lost_nodes_counted_against_node_replacements(training_dir):
    from ultracluster.sensors.fleet import STATE_KEY_LOST_NODES

    store = DictStore()
    op = gated(ReplayHeadNode(tail=[OK], read=[REPORT], sudo=[OK]), training_dir, auto_resume_attempts=3,
               node_replacements=1)
    with pytest.raises(TaskDeferred):
        op.execute_complete(context(store), GATE_FAILED)
    ledger = store.values[STATE_KEY_LOST_NODES]
    assert ledger["counts"] == {"compute1-st-trn1-2": 1} and ledger["reasons"] == {"compute1-st-trn1-2": REASON}
    # Its replacement fails the gate too (the fleet wait saw it healthy in between): one loss too many.
    ledger["failing"] = []
    op = gated(ReplayHeadNode(tail=[OK], read=[REPORT], sudo=[OK]), training_dir, auto_resume_attempts=3,
               node_replacements=1)
    with pytest.raises(AirflowFailException, match=r"Nodes lost past node_replacements=1: compute1-st-trn1-2 "
                       r"\(UC health check failed: neuron \(found 15 of 16 devices\)\) lost 2 time\(s\)") as raised:
        op.execute_complete(context(store), {**GATE_FAILED, "job_id": "11"})
    assert not isinstance(raised.value, TaskDeferred)
