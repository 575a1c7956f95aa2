"""Test-only cluster policy of the end-to-end Airflow (tests/e2e/conftest.py copies this file into that
deployment's AIRFLOW_HOME/config, which Airflow puts on sys.path). Never part of a real deployment.

It injects the faults tests/e2e/test_fault_matrix.py asks for, per run: a run is hit only when
``$UC_E2E_FAULT_DIR/<run id>.json`` exists, ``{"<task id>": "<mode>"}`` with modes
    fail                deterministic failure before execute (AirflowFailException, no retry)
    fail_first_try      a transient failure on try 1 only; the retry runs the real task
    kill_before_defer   on try 1, SIGKILL the task process after it submitted its work, before it
                        defers (the retry must reattach)
    stale_defer_exit    on try 1, the process of the first deferral exits only once the resume runs,
                        and the resume holds on 4 s: the deferral's exit success is read while the
                        resumed attempt is running (apache/airflow#72716; ultracluster.executor)
It also shortens retry delays and lifts the DAG's max_active_runs, so that the matrix's runs go
concurrently and a retry does not wait a minute (env UC_E2E_RETRY_DELAY_S, UC_E2E_MAX_ACTIVE_RUNS).
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

FAULT_DIR_ENV = "UC_E2E_FAULT_DIR"
_current: dict = {}  # one task per process: the context of the task this process runs


def _fault(context) -> str | None:
    fault_dir = os.environ.get(FAULT_DIR_ENV)
    if not fault_dir:
        return None
    path = Path(fault_dir) / f"{context['run_id']}.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text()).get(context["ti"].task_id)


def _marker(context, name: str) -> Path:
    return Path(os.environ[FAULT_DIR_ENV]) / f"{context['run_id']}.{context['ti'].task_id}.{name}"


def _await_resume(resumed: Path) -> None:
    """At the deferring process's exit: wait for the resume (less than task_success_overtime's 20 s)."""
    deadline = time.monotonic() + 15
    while not resumed.exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def _pre_execute(context) -> None:
    _current["context"] = context
    fault = _fault(context)
    try_number = context["ti"].try_number
    if fault == "stale_defer_exit" and _marker(context, "deferred").exists() \
            and not _marker(context, "resumed").exists():  # the resume of the slowed deferral
        _marker(context, "resumed").touch()
        print("UC_E2E injected fault: the resume holds on while the deferral's process exits", flush=True)
        time.sleep(4)
    if fault == "fail":
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(f"UC_E2E injected fault: {context['ti'].task_id} fails")
    if fault == "fail_first_try" and try_number == 1:
        from airflow.sdk.exceptions import AirflowException

        raise AirflowException(f"UC_E2E injected fault: {context['ti'].task_id} fails on try 1")


def _wrap_defer(task) -> None:
    defer = task.defer

    def defer_or_die(**kwargs):
        context = _current.get("context")
        fault = _fault(context) if context is not None and context["ti"].try_number == 1 else None
        if fault == "kill_before_defer":
            print(f"UC_E2E injected fault: SIGKILL {os.getpid()} before {context['ti'].task_id} defers", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if fault == "stale_defer_exit" and not _marker(context, "deferred").exists():
            _marker(context, "deferred").touch()
            atexit.register(_await_resume, _marker(context, "resumed"))
        return defer(**kwargs)

    task.defer = defer_or_die


def task_policy(task) -> None:
    if os.environ.get("UC_E2E_RETRY_DELAY_S"):
        task.retry_delay = timedelta(seconds=int(os.environ["UC_E2E_RETRY_DELAY_S"]))
    if task.dag_id != "trn1_bert_pretrain" or not os.environ.get(FAULT_DIR_ENV):
        return
    if task._pre_execute_hook is not None:  # the DAG's own hook: not overridden here
        return
    task._pre_execute_hook = _pre_execute
    _wrap_defer(task)


def dag_policy(dag) -> None:
    if os.environ.get("UC_E2E_MAX_ACTIVE_RUNS") and dag.dag_id == "trn1_bert_pretrain":
        dag.max_active_runs = int(os.environ["UC_E2E_MAX_ACTIVE_RUNS"])
