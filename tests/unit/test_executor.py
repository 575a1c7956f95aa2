"""The local deployment's executor (ultracluster.executor): its workers fork with what the DAG files
and their tasks import, so a task's parse of its DAG file imports nothing more. Each DAG file is
parsed in a process forked after the preload, as the Task SDK's supervisor forks a task from a
LocalExecutor worker. The executor itself runs under the real scheduler in every end-to-end test."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_FORKED_PARSES = r"""
import glob, importlib.util, json, os, sys
import airflow.sdk.execution_time.supervisor, airflow.sdk.execution_time.task_runner  # a worker has these
from ultracluster.executor import preload
preload()
found = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.py"))):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the task process: parse the DAG file, report what it imported
        before = set(sys.modules)
        spec = importlib.util.spec_from_file_location("dag_file", path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        os.write(write, json.dumps(sorted(set(sys.modules) - before)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        found[os.path.basename(path)] = json.loads(pipe.read() or "null")
    os.waitpid(pid, 0)
print(json.dumps({"parses": found, "ssh": ["paramiko" in sys.modules, "airflow.providers.ssh.hooks.ssh" in sys.modules],
                  "plot": "matplotlib" in sys.modules}))
"""


def test_a_task_parses_its_dag_file_without_importing_anything_new():
    env = {**os.environ, "PYTHONPATH": str(REPO / "plugins"), "ULTRACLUSTER_PROFILE": "local"}
    done = subprocess.run([sys.executable, "-c", _FORKED_PARSES, str(REPO / "dags")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["parses"]) >= 6, result
    assert {name: new for name, new in result["parses"].items() if new} == {}
    assert result["ssh"] == [True, True]  # the SSH tasks' client stack, imported when they run
    assert result["plot"] is False  # only the report plots: not every worker carries matplotlib


def test_the_preload_comes_before_the_workers_fork(monkeypatch):
    """start() imports PRELOAD, then LocalExecutor.start forks the workers."""
    from airflow.executors.local_executor import LocalExecutor

    from ultracluster import executor

    calls = []
    monkeypatch.setattr(executor, "preload", lambda: calls.append("preload"))
    monkeypatch.setattr(LocalExecutor, "start", lambda self: calls.append("fork the workers"))
    executor.PreloadedLocalExecutor.start(object.__new__(executor.PreloadedLocalExecutor))
    assert calls == ["preload", "fork the workers"]


def _started(monkeypatch):
    """The executor started with its real queues; the test plays its workers (``_run_worker``): it takes
    the workloads off ``activity_queue`` and puts each one's end on ``result_queue``."""
    from airflow.executors.local_executor import LocalExecutor

    from ultracluster import executor

    monkeypatch.setattr(executor, "preload", lambda: None)
    monkeypatch.setattr(LocalExecutor, "_spawn_workers_with_gc_freeze", lambda self, n: None)
    monkeypatch.setattr(LocalExecutor, "_check_workers", lambda self: None)
    started = executor.PreloadedLocalExecutor(parallelism=2)
    started.start()
    return started


def _workload(key):
    """What trigger_tasks and _process_workloads read of an ExecuteTask workload."""
    from types import SimpleNamespace

    return SimpleNamespace(key=key, ti=SimpleNamespace(priority_weight=1))


def _send(executor, workload) -> None:
    executor.queued_tasks[workload.key] = workload
    executor.trigger_tasks(open_slots=2)
    assert executor.activity_queue.get().key == workload.key  # a worker took it


def _ends(executor, *results) -> dict:
    for key, state in results:
        executor.result_queue.put((key, state, None))
    executor.sync()
    return executor.get_event_buffer()


def test_a_deferral_exits_success_is_dropped_once_its_resume_runs(monkeypatch):
    """apache/airflow#72716: the trigger fired and the resume was sent before the deferring process's
    exit was read. Reported, that success fails the running resume ("state mismatch"); it is dropped,
    and the resume's own end is reported."""
    from airflow.models.taskinstancekey import TaskInstanceKey
    from airflow.utils.state import TaskInstanceState

    executor = _started(monkeypatch)
    key = TaskInstanceKey("trn1_bert_pretrain", "parallel_compile", "run", 1, -1)
    _send(executor, _workload(key))  # the try that defers
    _send(executor, _workload(key))  # its resume: the same key
    assert _ends(executor, (key, TaskInstanceState.SUCCESS)) == {}
    assert _ends(executor, (key, TaskInstanceState.SUCCESS)) == {key: (TaskInstanceState.SUCCESS, None)}
    assert not executor.in_flight


def test_every_other_end_is_reported(monkeypatch):
    """One workload per key: its end, success or failure. A failure beside a later workload of its
    key too: a failure is never a deferral's exit."""
    from airflow.models.taskinstancekey import TaskInstanceKey
    from airflow.utils.state import TaskInstanceState

    executor = _started(monkeypatch)
    one = TaskInstanceKey("trn1_bert_pretrain", "train", "run", 1, -1)
    two = TaskInstanceKey("trn1_bert_pretrain", "train", "run", 2, -1)
    _send(executor, _workload(one))
    _send(executor, _workload(two))
    assert _ends(executor, (one, TaskInstanceState.SUCCESS), (two, TaskInstanceState.FAILED)) == {
        one: (TaskInstanceState.SUCCESS, None), two: (TaskInstanceState.FAILED, None)}
    _send(executor, _workload(one))
    _send(executor, _workload(one))
    assert _ends(executor, (one, TaskInstanceState.FAILED)) == {one: (TaskInstanceState.FAILED, None)}
    assert _ends(executor, (one, TaskInstanceState.SUCCESS)) == {one: (TaskInstanceState.SUCCESS, None)}
    assert not executor.in_flight
