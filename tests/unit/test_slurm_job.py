"""SlurmJobOperator and SlurmJobTrigger: submit, reattach (state store / by name), no duplicate
submissions, failure messages, log streaming, SSH outages. The head node replays REAL Slurm output
recorded in tests/fixtures/slurm; the commands it receives are the real built commands."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import shlex
import types
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowException, TaskDeferred

from tests.unit.triggerer import in_triggerer
from ultracluster.run.events import event
from ultracluster import remote_commands as rc
from ultracluster.hooks.head_node import CommandResult, HeadNodeUnreachableError
from ultracluster.hooks.slurm import SlurmHook
from ultracluster.links import SlurmJobLink
from ultracluster.operators.slurm import SlurmJobOperator
from ultracluster.operators.slurm_job import STATE_KEY_JOB_ID
from ultracluster.run.names import slurm_job_name
from ultracluster.triggers import slurm as slurm_trigger_module
from ultracluster.triggers.slurm import SlurmJobTrigger

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
HEAD = {"cluster_name": "c1", "address": "127.100.1.1", "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake", "partition": "compute1"}


def recorded(name: str) -> CommandResult:
    def part(ext: str) -> str:
        path = FIXTURES / f"{name}.{ext}"
        return path.read_text() if path.exists() else ""

    return CommandResult(int(part("rc").strip() or 0), part("out"), part("err"))


def argv(command: rc.RemoteCommand) -> tuple[str, ...] | None:
    """The words of a single program call (``shlex.join``-built), else None."""
    words = shlex.split(command.shell)
    return tuple(words) if shlex.join(words) == command.shell else None


def named(result: CommandResult, job_name: str) -> CommandResult:
    """A recorded scontrol reply for a job of this name (the recordings are of uc-pending)."""
    return CommandResult(result.exit_status, result.stdout.replace("JobName=uc-pending", f"JobName={job_name}"),
                         result.stderr)


def program(command: rc.RemoteCommand) -> str:
    if words := list(argv(command) or ()):
        while words and (words[0] == "env" or "=" in words[0]):
            words.pop(0)
        return words[0].removeprefix(rc.SLURM_BIN + "/")
    return command.description.split()[0]


class ReplayHeadNode:
    """Stands in for HeadNodeHook: answers each program with queued recorded results."""

    def __init__(self, **responses):
        self.responses = {k: list(v) for k, v in responses.items()}
        self.calls: list[rc.RemoteCommand] = []
        self.files: list[tuple[str, str]] = []
        self.unreachable_connects = 0

    def run(self, command, *, timeout=None):
        self.calls.append(command)
        queue = self.responses.get(program(command))
        if not queue:
            raise AssertionError(f"unexpected command: {command.shell}")
        return queue.pop(0) if len(queue) > 1 else queue[0]

    def check(self, command, *, timeout=None):
        result = self.run(command)
        assert result.ok, result
        return result

    def put_files(self, files):
        self.files.extend((local, remote) for local, remote, _mode in files)

    async def arun(self, command, *, conn=None, timeout=None):
        return self.run(command)

    @contextlib.asynccontextmanager
    async def aconnection(self):
        if self.unreachable_connects > 0:
            self.unreachable_connects -= 1
            raise HeadNodeUnreachableError("connection refused")
        yield ReplayConnection(self)

    def programs(self) -> list[str]:
        return [program(c) for c in self.calls]


class _Stream:
    def __init__(self, data: bytes) -> None:
        self.data = data

    async def read(self, n: int = -1) -> bytes:
        chunk, self.data = (self.data, b"") if n < 0 else (self.data[:n], self.data[n:])
        return chunk


class ReplayConnection:
    """The trigger's connection: its head-node wait command (remote_commands.wait_job_end) streams
    nothing and ends its window at once, so the replayed polls decide (tests/integration runs the
    real command against Slurm)."""

    def __init__(self, head: ReplayHeadNode) -> None:
        self.head = head
        self.waits = 0

    async def create_process(self, command, encoding=None):
        self.head.waits = getattr(self.head, "waits", 0) + 1
        return types.SimpleNamespace(stdout=_Stream(b""), stderr=_Stream(b"UC_WAIT_END window\n"),
                                     exit_status=0, wait=_noop, close=lambda: None)


async def _noop():
    return None


class DictStore:
    def __init__(self, **values):
        self.values = dict(values)

    def get(self, key, default=None):
        return self.values.get(key, default)

    def set(self, key, value, **_):
        self.values[key] = value


def context(store=None):
    ti = SimpleNamespace(dag_id="trn1_bert_pretrain", run_id="manual__2026-11-30T08:00:00+00:00", task_id="train",
                         map_index=-1, xcom={})
    ti.xcom_push = lambda key, value: ti.xcom.__setitem__(key, value)  # the extra link's values
    return {"ti": ti, "task_state_store": store if store is not None else DictStore()}


OK = CommandResult(0, "", "")
RUN_ID = "manual__2026-11-30T08:00:00+00:00"
TRAIN_NAME = slurm_job_name("trn1_bert_pretrain", RUN_ID, "train")
COMPILE_NAME = slurm_job_name("trn1_bert_pretrain", RUN_ID, "parallel_compile")
# slurmctld no longer knows the id (squeue prints what scontrol prints for it)
SQUEUE_UNKNOWN = CommandResult(1, "", "slurm_load_jobs error: Invalid job id specified\n")


def job_of(fixture: str, name: str = TRAIN_NAME, run_id: str = RUN_ID) -> CommandResult:
    """A recorded scontrol record as if the job had been submitted under ``name`` for ``run_id``."""
    result = recorded(fixture)
    out = re.sub(r"JobName=\S+", f"JobName={name}", result.stdout, count=1)
    out = re.sub(r"Comment=\S+", f"Comment=ultracluster run_id={run_id}", out, count=1)
    assert name in out
    return CommandResult(result.exit_status, out, result.stderr)


def queued(job_id: str, state: str, name: str = TRAIN_NAME, run_id: str = RUN_ID) -> CommandResult:
    return CommandResult(0, f"{job_id}|{name}|{state}|None|compute1-st-trn1-1|ultracluster run_id={run_id}\n", "")


@pytest.fixture
def training_dir(tmp_path):
    (tmp_path / "run_dp_bert_large_hf_pretrain_bf16_s128.sh").write_text("#!/bin/bash\n")
    (tmp_path / "dp_bert_large_hf_pretrain_hdf5.py").write_text("print('x')\n")
    return str(tmp_path)


def operator(head_node: ReplayHeadNode, training_dir=None, **kwargs) -> SlurmJobOperator:
    op = SlurmJobOperator(
        task_id="train", head_node=HEAD, job_dir="/fsx/jobs/run1/train", num_nodes=2,
        job_env={"SCALING_MODE": "strong", "MAX_STEPS": "40"}, training_files_dir=training_dir,
        poll_interval=0, **kwargs,
    )
    op._hook = SlurmHook(head_node_hook=head_node)
    return op


def squeue_line(job_id: str, name: str, state: str) -> CommandResult:
    return CommandResult(0, f"{job_id}|{name}|{state}|None|compute1-st-trn1-1|ultracluster run_id=x\n", "")


def test_fresh_submit_copies_files_stores_id_and_defers(training_dir):
    replay = ReplayHeadNode(squeue=[recorded("squeue_none")], mkdir=[OK], sbatch=[recorded("sbatch_mix")])
    store = DictStore()
    op = operator(replay, training_dir)
    ctx = context(store)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    assert replay.programs() == ["squeue", "mkdir", "sbatch"]
    sbatch = replay.calls[-1]
    expected_name = slurm_job_name("trn1_bert_pretrain", "manual__2026-11-30T08:00:00+00:00", "train")
    assert argv(sbatch)[argv(sbatch).index("--job-name") + 1] == expected_name
    assert argv(sbatch)[argv(sbatch).index("--partition") + 1] == "compute1"
    assert "SCALING_MODE=strong" in argv(sbatch) and "OUTPUT_ROOT=/fsx/jobs/run1/train" in argv(sbatch)
    assert sorted(remote for _, remote in replay.files) == [
        "/fsx/jobs/run1/train/dp_bert_large_hf_pretrain_hdf5.py",
        "/fsx/jobs/run1/train/run_dp_bert_large_hf_pretrain_bf16_s128.sh",
    ]
    assert store.values[STATE_KEY_JOB_ID] == "1"
    trigger = deferred.value.trigger
    assert trigger.job_id == "1" and trigger.log_path == "/fsx/jobs/run1/train/slurm-1.out"
    assert deferred.value.method_name == "execute_complete"
    # The Slurm Job link's values were pushed before the deferral: the link shows while the job runs.
    assert ctx["ti"].xcom[SlurmJobLink.key] == {
        "dag_id": "trn1_bert_pretrain", "run_id": RUN_ID, "task_id": "train", "job_id": "1", "job_name": expected_name,
        "log_path": "/fsx/jobs/run1/train/slurm-1.out", "output_dir": "/fsx/jobs/run1/train/output_1",
        "cluster_name": "c1"}
    assert SlurmJobLink().format_link(**ctx["ti"].xcom[SlurmJobLink.key]) == (
        "/ultracluster/jobs/trn1_bert_pretrain/manual__2026-11-30T08%3A00%3A00%2B00%3A00/train")


def test_extra_job_env_adds_knobs_but_never_overrides_the_contract(training_dir):
    replay = ReplayHeadNode(squeue=[recorded("squeue_none")], mkdir=[OK], sbatch=[recorded("sbatch_mix")])
    op = operator(replay, training_dir, extra_job_env={"TORCH_NUM_THREADS": "1", "SCALING_MODE": "weak"})
    with pytest.raises(TaskDeferred):
        op.execute(context(DictStore()))
    words = argv(replay.calls[-1])
    assert "TORCH_NUM_THREADS=1" in words
    assert "SCALING_MODE=strong" in words and "SCALING_MODE=weak" not in words


def test_natively_rendered_values_go_to_the_job_as_json(training_dir):
    """render_template_as_native_obj turns '{{ plan(ti).sweep_point }}' into a dict (or None)."""
    replay = ReplayHeadNode(squeue=[recorded("squeue_none")], mkdir=[OK], sbatch=[recorded("sbatch_mix")])
    point = {"id": "s1", "index": 1, "num_nodes": 2}
    op = operator(replay, training_dir, extra_job_env={"SWEEP_POINT": point, "NOTHING": None})
    with pytest.raises(TaskDeferred):
        op.execute(context(DictStore()))
    words = argv(replay.calls[-1])
    assert f"SWEEP_POINT={json.dumps(point, sort_keys=True)}" in words and "NOTHING=" in words


def test_the_budget_guard_skips_the_warm_up_line_and_needs_its_inputs(training_dir):
    from ultracluster.triggers.slurm import SlurmJobTrigger

    since = "2026-12-01T00:00:00+00:00"  # hours ago: at $3600/h any ETA is over a $1 budget
    trigger = SlurmJobTrigger(head_node={"cluster_name": "c", "address": "127.0.0.1"}, ssh_conn_id="x",
                              job_id="7", job_dir="/fsx/j", log_path="/fsx/j/slurm-7.out",
                              budget={"max_usd": 1.0, "usd_per_hour": 3600.0, "since": since})
    line = "UC_PROGRESS step={} total=100 loss=7.000000 lr=0.000100 throughput=10.00 eta_s=60\n"
    trigger.job_log.consume(-1, line.format(1).encode(), 1 << 20)
    assert trigger.job_log.over_budget is None  # the first line's ETA includes warm-up
    trigger.job_log.consume(-1, line.format(2).encode(), 1 << 20)
    assert trigger.job_log.over_budget.startswith("budget guard: projected cost $")
    # A guard without its rate or start (e.g. no creation time) is off, not a crash of the training.
    off = operator(ReplayHeadNode(), training_dir, budget={"max_usd": 5.0, "usd_per_hour": None, "since": since})
    assert off._budget() is None
    assert operator(ReplayHeadNode(), training_dir, budget={"max_usd": None})._budget() is None


def test_reattaches_by_name_without_submitting(training_dir):
    name = slurm_job_name("trn1_bert_pretrain", "manual__2026-11-30T08:00:00+00:00", "train")
    replay = ReplayHeadNode(squeue=[CommandResult(0, squeue_line("40", name, "FAILED").stdout + squeue_line("41", name, "RUNNING").stdout, "")])
    store = DictStore()
    ctx = context(store)
    with pytest.raises(TaskDeferred) as deferred:
        operator(replay, training_dir).execute(ctx)
    assert "sbatch" not in replay.programs() and not replay.files
    assert deferred.value.trigger.job_id == "41" and store.values[STATE_KEY_JOB_ID] == "41"
    # Reattached: the link names the job it follows, pushed before the deferral.
    assert ctx["ti"].xcom[SlurmJobLink.key]["job_id"] == "41"
    assert ctx["ti"].xcom[SlurmJobLink.key]["log_path"] == "/fsx/jobs/run1/train/slurm-41.out"


def test_log_offset_is_carried_only_for_the_same_job(training_dir):
    replay = ReplayHeadNode(squeue=[queued("1", "RUNNING")], scontrol=[job_of("scontrol_running")])
    store = DictStore(**{STATE_KEY_JOB_ID: "1", "slurm_log_offset": {"job_id": "1", "offset": 512}})
    with pytest.raises(TaskDeferred) as deferred:
        operator(replay, training_dir).execute(context(store))
    assert deferred.value.trigger.log_offset == 512
    replay = ReplayHeadNode(scontrol=[job_of("scontrol_failed")], squeue=[queued("4", "FAILED"), recorded("squeue_none")],
                            mkdir=[OK], sbatch=[CommandResult(0, "99\n", "")])
    store = DictStore(**{STATE_KEY_JOB_ID: "4", "slurm_log_offset": {"job_id": "4", "offset": 512}})
    with pytest.raises(TaskDeferred) as deferred:
        operator(replay, training_dir).execute(context(store))
    assert deferred.value.trigger.job_id == "99" and deferred.value.trigger.log_offset == 0


def test_reattaches_to_stored_running_job(training_dir):
    replay = ReplayHeadNode(squeue=[queued("1", "RUNNING")], scontrol=[job_of("scontrol_running")])
    with pytest.raises(TaskDeferred) as deferred:
        operator(replay, training_dir).execute(context(DictStore(**{STATE_KEY_JOB_ID: "1"})))
    assert replay.programs() == ["squeue", "scontrol"]
    assert argv(replay.calls[0])[argv(replay.calls[0]).index("--jobs") + 1] == "1"
    assert deferred.value.trigger.job_id == "1"


def test_stored_id_now_naming_another_job_is_not_reattached(training_dir):
    """A rebuilt cluster restarts job ids: stored id 1 (train, old cluster) is now the new cluster's
    finished compile job. It must not be taken for train's own result."""
    replay = ReplayHeadNode(
        squeue=[queued("1", "COMPLETED", name=COMPILE_NAME), recorded("squeue_none")],
        scontrol=[job_of("scontrol_completed", name=COMPILE_NAME)],
        mkdir=[OK], sbatch=[CommandResult(0, "2\n", "")],
    )
    store = DictStore(**{STATE_KEY_JOB_ID: "1"})
    with pytest.raises(TaskDeferred) as deferred:
        operator(replay, training_dir).execute(context(store))
    assert replay.programs().count("sbatch") == 1
    assert deferred.value.trigger.job_id == "2" and store.values[STATE_KEY_JOB_ID] == "2"


def test_stored_id_of_another_runs_job_is_not_reattached(training_dir):
    """Same name but another run id in the comment (squeue shows it): not this task's job."""
    replay = ReplayHeadNode(squeue=[queued("1", "RUNNING", run_id="manual__other"), recorded("squeue_none")],
                            mkdir=[OK], sbatch=[CommandResult(0, "2\n", "")])
    with pytest.raises(TaskDeferred) as deferred:
        operator(replay, training_dir).execute(context(DictStore(**{STATE_KEY_JOB_ID: "1"})))
    assert deferred.value.trigger.job_id == "2"


def test_forgotten_stored_id_with_another_jobs_exit_marker_is_not_reattached(training_dir):
    """slurmctld forgot the id, no slurmdbd, and slurm-1.exit in the shared job dir is the compile job's."""
    replay = ReplayHeadNode(
        squeue=[SQUEUE_UNKNOWN, recorded("squeue_none")], scontrol=[recorded("scontrol_unknown_job")],
        sacct=[recorded("sacct_no_dbd")],
        read=[CommandResult(0, "0\n", ""), CommandResult(0, f"{COMPILE_NAME}\n", "")],
        mkdir=[OK], sbatch=[CommandResult(0, "2\n", "")],
    )
    with pytest.raises(TaskDeferred) as deferred:
        operator(replay, training_dir).execute(context(DictStore(**{STATE_KEY_JOB_ID: "1"})))
    assert deferred.value.trigger.job_id == "2"
    sacct = next(c for c in replay.calls if program(c) == "sacct")
    assert argv(sacct)[argv(sacct).index("--name") + 1] == TRAIN_NAME  # accounting asked for this name only


def test_stored_completed_job_is_not_resubmitted(training_dir):
    replay = ReplayHeadNode(squeue=[queued("3", "COMPLETED")], scontrol=[job_of("scontrol_completed")])
    with pytest.raises(TaskDeferred) as deferred:
        operator(replay, training_dir).execute(context(DictStore(**{STATE_KEY_JOB_ID: "3"})))
    assert "sbatch" not in replay.programs()
    assert deferred.value.trigger.job_id == "3"


def test_stored_failed_job_leads_to_one_new_submission(training_dir):
    replay = ReplayHeadNode(
        scontrol=[job_of("scontrol_failed")], squeue=[queued("4", "FAILED"), recorded("squeue_none")], mkdir=[OK],
        sbatch=[CommandResult(0, "99\n", "")],
    )
    store = DictStore(**{STATE_KEY_JOB_ID: "4"})
    with pytest.raises(TaskDeferred):
        operator(replay, training_dir).execute(context(store))
    assert replay.programs().count("sbatch") == 1
    assert store.values[STATE_KEY_JOB_ID] == "99"


def test_stored_job_forgotten_by_slurm_uses_exit_marker(training_dir):
    """scontrol forgot it (MinJobAge), no slurmdbd: the exit marker says it succeeded: reattach."""
    replay = ReplayHeadNode(
        squeue=[SQUEUE_UNKNOWN], scontrol=[recorded("scontrol_unknown_job")], sacct=[recorded("sacct_no_dbd")],
        read=[CommandResult(0, "0\n", ""), CommandResult(0, f"{TRAIN_NAME}\n", "")],
    )
    with pytest.raises(TaskDeferred):
        operator(replay, training_dir).execute(context(DictStore(**{STATE_KEY_JOB_ID: "5"})))
    assert replay.programs() == ["squeue", "scontrol", "sacct", "read", "read"]
    assert [c.description for c in replay.calls[-2:]] == [
        "read /fsx/jobs/run1/train/slurm-5.exit", "read /fsx/jobs/run1/train/slurm-5.name"]


def test_sbatch_refusal_is_a_clear_error(training_dir):
    replay = ReplayHeadNode(squeue=[recorded("squeue_none")], mkdir=[OK], sbatch=[recorded("sbatch_bad_partition")])
    with pytest.raises(Exception, match="Invalid partition name specified"):
        operator(replay, training_dir).execute(context())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_nodes": 0}, "num_nodes"),
        ({"num_nodes": "two"}, "num_nodes"),
        ({"job_dir": "relative/dir"}, "absolute"),
        ({"job_env": {"BAD-NAME": "1"}}, "environment variable"),
        ({"run_script": "missing.sh"}, "not found"),
    ],
)
def test_bad_input_fails_before_any_remote_command(training_dir, kwargs, message):
    replay = ReplayHeadNode()
    params = dict(task_id="train", head_node=HEAD, job_dir="/fsx/j", num_nodes=2, job_env={},
                  training_files_dir=training_dir)
    params.update(kwargs)
    op = SlurmJobOperator(**params)
    op._hook = SlurmHook(head_node_hook=replay)
    with pytest.raises(ValueError, match=message):
        op.execute(context())
    assert replay.calls == []


def test_failure_message_has_state_exit_code_and_log_tail(training_dir):
    tail = "UC_PROGRESS step=3 total=40 loss=7.5\nTraceback (most recent call last):\nRuntimeError: boom\n"
    replay = ReplayHeadNode(tail=[CommandResult(0, tail, "")])
    op = operator(replay, training_dir)
    failed = event("job_failed", job_id="4", state="FAILED", exit_code=3, signal=0, job_reason="NonZeroExitCode",
                   log_offset=10)
    store = DictStore()
    with pytest.raises(AirflowException) as error:
        op.execute_complete(context(store), failed)
    text = str(error.value)
    assert "Slurm job 4 ended FAILED" in text and "exit code 3" in text and "RuntimeError: boom" in text
    assert replay.calls[0].description == "tail -n 40 /fsx/jobs/run1/train/slurm-4.out"
    assert store.values["slurm_log_offset"] == {"job_id": "4", "offset": 10}


def test_the_jobs_own_uc_error_fails_at_once_without_retries(training_dir):
    from airflow.sdk.exceptions import AirflowFailException

    tail = "UC_INFO launcher torchrun\nUC_ERROR GRAD_ACCUM_USTEPS=3 is not divisible by 2 nodes\n"
    op = operator(ReplayHeadNode(tail=[CommandResult(0, tail, "")]), training_dir)
    with pytest.raises(AirflowFailException, match=r"refused its input \(UC_ERROR\): GRAD_ACCUM_USTEPS=3 is not "
                                                   r"divisible by 2 nodes"):
        op.execute_complete(context(), event("job_failed", job_id="9", state="FAILED", exit_code=2))


def test_a_host_key_mismatch_seen_by_the_trigger_fails_at_once(training_dir):
    from airflow.sdk.exceptions import AirflowFailException

    replay = ReplayHeadNode()
    op = operator(replay, training_dir)
    ctx = context()
    with pytest.raises(AirflowFailException, match="not the key pinned"):
        op.execute_complete(ctx, event("host_key_mismatch", "head node 127.0.0.1 presented a host key that is not the "
                                       "key pinned", job_id="9"))
    assert ctx["ti"].xcom[SlurmJobLink.key]["state"] == "host_key_mismatch"  # no Slurm state: the event's reason
    assert replay.calls == []  # nothing more is asked of a head node that may not be ours


@pytest.mark.parametrize("state", ["TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "CANCELLED"])
def test_every_failure_state_fails_the_task(training_dir, state):
    op = operator(ReplayHeadNode(tail=[OK]), training_dir)
    ctx = context()
    with pytest.raises(AirflowException, match=state):
        op.execute_complete(ctx, event("job_failed", job_id="8", state=state, exit_code=0, signal=15))
    # The job page shows how it ended, though the task has no return value.
    assert (ctx["ti"].xcom[SlurmJobLink.key]["job_id"], ctx["ti"].xcom[SlurmJobLink.key]["state"]) == ("8", state)


def test_success_result_shape(training_dir):
    op = operator(ReplayHeadNode(), training_dir)
    ctx = context()
    ctx["ti"].start_date = datetime(2026, 11, 30, 8, 5, tzinfo=timezone.utc)  # kept across the deferral
    result = op.execute_complete(ctx, event("complete", job_id="7", state="COMPLETED", exit_code=0, log_offset=5,
                                            results_path="/fsx/jobs/run1/train/output_7/results.json"))
    assert result.pop("started_at") == "2026-11-30T08:05:00+00:00"
    assert datetime.fromisoformat(result.pop("ended_at")) > datetime(2026, 11, 30, 8, 5, tzinfo=timezone.utc)
    assert result == {
        "job_id": "7", "job_name": TRAIN_NAME, "state": "COMPLETED", "exit_code": 0,
        "output_dir": "/fsx/jobs/run1/train/output_7",
        "log_path": "/fsx/jobs/run1/train/slurm-7.out", "results_path": "/fsx/jobs/run1/train/output_7/results.json",
        "auto_resume": {"resumes": 0, "steps_lost": 0, "history": [], "nodes_lost": {}},
    }
    assert {k: ctx["ti"].xcom[SlurmJobLink.key][k] for k in ("job_id", "state", "log_path", "output_dir")} == {
        k: result[k] for k in ("job_id", "state", "log_path", "output_dir")}


def test_on_kill_cancels_the_job(training_dir):
    replay = ReplayHeadNode(scancel=[OK])
    op = operator(replay, training_dir)
    op.on_kill()
    assert replay.calls == []  # nothing submitted yet: nothing to cancel
    op._running = (op.job(context()), "12")  # a worker-side wait on job 12
    op.on_kill()
    assert [argv(c) for c in replay.calls] == [(rc.slurm_command("scancel"), "12")]


# ------------------------------------------------------------------------------- trigger


def trigger(**kwargs) -> SlurmJobTrigger:
    params = dict(head_node=HEAD, ssh_conn_id="ultracluster_head_node", job_id="7", job_dir="/fsx/j",
                  log_path="/fsx/j/slurm-7.out", poll_interval=1, outage_timeout=60)
    params.update(kwargs)
    return SlurmJobTrigger(**params)


def test_trigger_serialize_round_trip():
    original = trigger(log_offset=123)
    classpath, kwargs = original.serialize()
    module, _, name = classpath.rpartition(".")
    import importlib

    cls = getattr(importlib.import_module(module), name)
    assert cls is SlurmJobTrigger
    assert cls(**kwargs).serialize() == (classpath, kwargs)
    assert kwargs["log_offset"] == 123 and kwargs["head_node"] == HEAD
    import json

    json.dumps(kwargs)  # serialisable arguments only


def log_chunk(size: int, data: bytes) -> CommandResult:
    return CommandResult(0, f"{size}\n{base64.b64encode(data).decode()}\n", "")


def run_trigger(t: SlurmJobTrigger, replay: ReplayHeadNode):
    t._slurm = lambda: SlurmHook(head_node_hook=replay)
    async def first():
        async for event in t.run():
            return event.payload
    return asyncio.run(first())


def test_trigger_streams_progress_and_finishes_from_exit_marker(capsys):
    part1 = b"starting\nUC_PROGRESS step=1 total=4 loss=9.5 lr=0.0001 throughput=10.0 eta_s=30\nUC_PROGRESS step=2 tot"
    part2 = b"al=4 loss=8.25 lr=0.0001 throughput=12.5 eta_s=20\nUC_RESULTS /fsx/j/output_7/results.json\n"
    whole = part1 + part2
    replay = ReplayHeadNode(
        scontrol=[recorded("scontrol_running"), recorded("scontrol_unknown_job")],
        sacct=[recorded("sacct_no_dbd")],
        read=[
            log_chunk(len(part1), part1),          # poll 1: a partial last line stays unread
            CommandResult(0, "0\n", ""),           # exit marker: 0
            log_chunk(len(whole), whole[part1.rfind(b"\n") + 1:]),
        ],
    )
    # order of reads: poll 1 log, then poll 2 exit marker, then poll 2 log
    event = run_trigger(trigger(), replay)
    assert event["status"] == "success" and event["state"] == "COMPLETED" and event["source"] == "exit_marker"
    assert event["log_offset"] == len(whole)
    assert event["last_progress"]["step"] == 2 and event["last_progress"]["loss"] == 8.25
    assert event["results_path"] == "/fsx/j/output_7/results.json"
    # Airflow routes trigger logs through structlog (stdout here, the task log in the triggerer).
    logged = [line for line in capsys.readouterr().out.splitlines() if "SlurmJobTrigger" in line]
    assert len(logged) == 3, logged  # two progress lines and UC_RESULTS; "starting" is not streamed
    assert "UC_PROGRESS step=1 total=4 loss=9.5 lr=0.0001 throughput=10.0 eta_s=30" in logged[0]
    assert "UC_PROGRESS step=2 total=4 loss=8.25 lr=0.0001 throughput=12.5 eta_s=20" in logged[1]


COMPILE_RESULTS = json.dumps({"results": {"metrics": [
    {"MetricName": "Compile cache hits", "MeasuredValue": 3, "AdditionalData": {"backend": "neuron"}},
    {"MetricName": "Compile cache misses", "MeasuredValue": 1}]}})


def finished_job(log_read: bool = True) -> ReplayHeadNode:
    """The head node once the compile job completed: Slurm's record, its log (read by a wait), its
    launch marker, results.json."""
    return ReplayHeadNode(scontrol=[job_of("scontrol_completed")],
                          read=[log_chunk(0, b"")] * log_read + [CommandResult(0, COMPILE_RESULTS, "")],
                          tail=[CommandResult(0, "UC_INFO launch mode=compile_only path=/opt/bin/npc\n", "")])


def test_a_completed_job_ends_the_task_in_the_triggerer_with_the_worker_paths_value(training_dir, monkeypatch, pushed):
    from airflow.triggers.base import TaskSuccessEvent

    from ultracluster.parsers import job_end

    monkeypatch.setattr(job_end, "utc_now", lambda: "2026-11-30T08:09:00+00:00")
    replay = ReplayHeadNode(squeue=[recorded("squeue_none")], mkdir=[OK], sbatch=[recorded("sbatch_mix")])
    op = operator(replay, training_dir, launcher="neuron_parallel_compile")
    ctx = context()
    ctx["ti"].start_date = datetime(2026, 11, 30, 8, 5, tzinfo=timezone.utc)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    waiting = deferred.value.trigger
    assert waiting.task_end["started_at"] == "2026-11-30T08:05:00+00:00" and waiting.task_end["launcher"] is True

    waiting._slurm = lambda: SlurmHook(head_node_hook=finished_job())
    in_triggerer(waiting, "train")

    async def first(t):
        async for fired in t.run():
            return fired

    ended = asyncio.run(first(waiting))
    assert isinstance(ended, TaskSuccessEvent)
    # The worker path, resumed with the plain event of the same wait, returns the same value.
    # dag.test() runs the trigger without a task instance: the same wait resumes the task there.
    plain = run_trigger(trigger(**waiting.serialize()[1]), finished_job())
    op._hook = SlurmHook(head_node_hook=finished_job(log_read=False))
    worker_ctx = context()
    worker_ctx["ti"].start_date = ctx["ti"].start_date
    assert pushed["return_value"] == op.execute_complete(worker_ctx, plain)
    assert pushed["return_value"]["compile_cache"] == {"backend": "neuron", "hits": 3, "misses": 1}
    assert pushed["return_value"]["launch"] == {"mode": "compile_only", "path": "/opt/bin/npc"}
    # The Slurm Job page's values, with the job's end state, as the worker path pushes them.
    assert pushed[SlurmJobLink.key] == worker_ctx["ti"].xcom[SlurmJobLink.key]
    assert pushed[SlurmJobLink.key]["state"] == "COMPLETED"


def test_a_failed_job_resumes_the_task_on_a_worker(training_dir, pushed):
    """A failure has work only a worker can do (a resume after a node fault, no retry for UC_ERROR)."""
    end = {"output_dir": "/fsx/j/output_5", "started_at": None, "auto_resume": {}, "health_gate": None,
           "launcher": False, "link_key": SlurmJobLink.key, "link": {}}
    replay = ReplayHeadNode(scontrol=[recorded("scontrol_timeout")], read=[log_chunk(0, b"")])
    ended = run_trigger(in_triggerer(trigger(job_id="5", task_end=end)), replay)
    assert (ended["status"], ended["state"], pushed) == ("failed", "TIMEOUT", {})


def test_trigger_does_not_follow_a_job_id_that_now_names_another_job():
    """The async status check asks for the name as the sync one does (a rebuilt cluster reuses ids)."""
    replay = ReplayHeadNode(scontrol=[recorded("scontrol_completed")], read=[log_chunk(0, b"")])
    event = run_trigger(trigger(job_id="3", job_name=TRAIN_NAME), replay)
    assert (event["status"], event["reason"]) == ("error", "job_renamed") and "'uc-pending'" in event["message"]
    # The same job followed under its own name ends normally.
    replay = ReplayHeadNode(scontrol=[recorded("scontrol_completed")], read=[log_chunk(0, b"")])
    assert run_trigger(trigger(job_id="3", job_name="uc-pending"), replay)["status"] == "success"


def test_trigger_reports_failure_state_from_scontrol():
    replay = ReplayHeadNode(scontrol=[recorded("scontrol_timeout")], read=[log_chunk(0, b"")])
    event = run_trigger(trigger(job_id="5"), replay)
    assert (event["status"], event["reason"], event["state"], event["exit_code"], event["signal"],
            event["job_reason"]) == ("failed", "job_failed", "TIMEOUT", 0, 15, "TimeLimit")


def test_trigger_rides_out_a_short_ssh_outage(monkeypatch):
    monkeypatch.setattr(slurm_trigger_module, "backoff", lambda attempt, **_: 0)
    replay = ReplayHeadNode(scontrol=[recorded("scontrol_completed")], read=[log_chunk(0, b"")])
    replay.unreachable_connects = 3
    event = run_trigger(trigger(job_id="3"), replay)
    assert event["status"] == "success" and replay.unreachable_connects == 0


def test_trigger_gives_up_after_outage_timeout(monkeypatch):
    monkeypatch.setattr(slurm_trigger_module, "backoff", lambda attempt, **_: 0.01)
    replay = ReplayHeadNode()
    replay.unreachable_connects = 10**9
    event = run_trigger(trigger(outage_timeout=0.05), replay)
    assert (event["status"], event["reason"]) == ("error", "unreachable") and "unreachable" in event["message"]


def test_trigger_on_kill_cancels_unless_still_deferred(monkeypatch):
    replay = ReplayHeadNode(scancel=[OK])
    t = trigger(job_id="21")
    t._slurm = lambda: SlurmHook(head_node_hook=replay)

    async def deferred(_ti):
        return True

    monkeypatch.setattr(slurm_trigger_module, "task_is_still_deferred", deferred)
    asyncio.run(t.on_kill())
    assert replay.calls == []

    async def killed(_ti):
        return False

    monkeypatch.setattr(slurm_trigger_module, "task_is_still_deferred", killed)
    asyncio.run(t.on_kill())
    assert [argv(c) for c in replay.calls] == [(rc.slurm_command("scancel"), "21")]


def test_trigger_on_kill_connects_before_the_state_read(monkeypatch):
    """The state read can stall the triggerer's supervisor, which the connection's secret masking
    also waits on: connected first, the scancel needs nothing more from the supervisor."""
    order = []

    class Recording(ReplayHeadNode):
        @contextlib.asynccontextmanager
        async def aconnection(self):
            order.append("connect")
            async with super().aconnection() as conn:
                yield conn

    replay = Recording(scancel=[OK])
    t = trigger(job_id="21")
    t._slurm = lambda: SlurmHook(head_node_hook=replay)

    async def killed(_ti):
        order.append("state read")
        return False

    monkeypatch.setattr(slurm_trigger_module, "task_is_still_deferred", killed)
    asyncio.run(t.on_kill())
    assert order == ["connect", "state read"] and [argv(c) for c in replay.calls] == [(rc.slurm_command("scancel"), "21")]


def test_non_deferrable_waits_in_the_worker(training_dir):
    replay = ReplayHeadNode(
        squeue=[recorded("squeue_none")], mkdir=[OK], sbatch=[CommandResult(0, "3\n", "")],
        scontrol=[named(recorded("scontrol_completed"), TRAIN_NAME)], read=[log_chunk(0, b"")],
    )
    op = operator(replay, training_dir, deferrable=False)  # the worker polls the same hook
    result = op.execute(context())
    assert result["state"] == "COMPLETED" and result["job_id"] == "3"


@pytest.mark.parametrize(
    "map_index, states, expected",
    [
        (-1, {"r1": {"train": "deferred"}}, True),   # trigger moved to another triggerer: keep the job
        (-1, {"r1": {"train": "failed"}}, False),     # user marked it failed: cancel
        (-1, {"r1": {"train": None}}, False),         # cleared
        (2, {"r1": {"train_2": "deferred"}}, True),   # mapped instances are keyed task_id_mapindex
        (2, {"r1": {"train": "deferred"}}, False),
    ],
)
def test_on_kill_guard_reads_the_task_state(monkeypatch, map_index, states, expected):
    from airflow.sdk.execution_time import task_runner

    seen = {}

    def fake_get_task_states(**kwargs):
        seen.update(kwargs)
        return states

    monkeypatch.setattr(task_runner.RuntimeTaskInstance, "get_task_states", staticmethod(fake_get_task_states))
    ti = SimpleNamespace(dag_id="d", run_id="r1", task_id="train", map_index=map_index)
    assert asyncio.run(slurm_trigger_module.task_is_still_deferred(ti)) is expected
    assert seen == {"dag_id": "d", "task_ids": ["train"], "run_ids": ["r1"], "map_index": map_index}


def test_on_kill_guard_treats_unknown_state_as_a_real_kill(monkeypatch):
    from airflow.sdk.execution_time import task_runner

    def broken(**kwargs):
        raise RuntimeError("no supervisor comms")

    monkeypatch.setattr(task_runner.RuntimeTaskInstance, "get_task_states", staticmethod(broken))
    ti = SimpleNamespace(dag_id="d", run_id="r1", task_id="train", map_index=-1)
    assert asyncio.run(slurm_trigger_module.task_is_still_deferred(ti)) is False
    assert asyncio.run(slurm_trigger_module.task_is_still_deferred(None)) is False


def test_on_kill_guard_takes_a_hanging_state_read_as_a_real_kill(monkeypatch):
    """The read has hung past the triggerer's 30 s on_kill limit: bounded, the job is still cancelled."""
    import time

    from airflow.sdk.execution_time import task_runner

    def hanging(**kwargs):
        time.sleep(1)  # far past the bound below (asyncio.run waits for the thread at exit)
        return {"r1": {"train": "deferred"}}

    monkeypatch.setattr(task_runner.RuntimeTaskInstance, "get_task_states", staticmethod(hanging))
    ti = SimpleNamespace(dag_id="d", run_id="r1", task_id="train", map_index=-1)
    assert asyncio.run(slurm_trigger_module.task_is_still_deferred(ti, timeout=0.05)) is False
