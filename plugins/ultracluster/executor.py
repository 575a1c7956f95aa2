"""The local deployment's executor: Airflow's LocalExecutor, its workers forked with the DAGs' modules loaded.

Every task runs in a process that the Task SDK's supervisor forks from a LocalExecutor worker, and
that process first parses its DAG file. The pipeline's DAG file imports the amazon provider, boto3
and this package, and its SSH tasks then import paramiko and the ssh provider: about 1.5 s of CPU
on the local 2-core machine, paid again by each of the run's 15 tasks (bench/pipeline.py, benchmark
2), where a no-op task's parse takes 30 ms. Imported once in the scheduler, before it forks its
workers, they are inherited by every task, and so are the AWS service models the hooks' sessions
share (``hooks.aws_session``). ``AIRFLOW__CORE__EXECUTOR`` names this class in
scripts/env.sh; Airflow's own LocalExecutor runs the same tasks, only slower to start.

It also drops the stale success of a deferral's exit (``change_state``): Airflow 3.3 fails a task
instance whose trigger fired and whose resumed attempt is already running when that exit's success
is read (apache/airflow#72716, open; its guard covers a task instance back in ``scheduled`` only).

As with Airflow plugins, a change to this package's code reaches the tasks after the scheduler
restarts (``make down && make up``); the DAG files themselves are parsed afresh by every task.
"""
from __future__ import annotations

import importlib
from collections import Counter
from typing import Any

from airflow.executors.local_executor import LocalExecutor
from airflow.models.taskinstancekey import TaskInstanceKey
from airflow.utils.state import TaskInstanceState

from ultracluster.hooks import aws_session

# What the DAG files in dags/ import, and what their tasks import when they run (the SSH client
# stack: paramiko, the ssh provider's hook). tests/unit/test_executor.py checks that a DAG file's
# parse then imports nothing more. Not matplotlib: only the report task plots.
PRELOAD = (
    "airflow.providers.amazon.aws.hooks.cloud_formation",
    "airflow.providers.amazon.aws.hooks.ec2",
    "airflow.providers.amazon.aws.hooks.s3",
    "airflow.providers.amazon.aws.operators.base_aws",
    "airflow.providers.amazon.aws.triggers.base",
    "airflow.providers.ssh.hooks.ssh",
    "airflow.providers.standard.decorators.python",
    "airflow.providers.standard.triggers.temporal",
    "airflow.sdk.definitions.decorators",
    "airflow.sdk.definitions.timetables.interval",
    "airflow.sdk.definitions.timetables.trigger",
    "paramiko",
    "ultracluster.cluster_tasks",
    "ultracluster.hooks.dag_runs",
    "ultracluster.notifications",
    "ultracluster.operators.checkpoint",
    "ultracluster.operators.compile_cache",
    "ultracluster.operators.dataset",
    "ultracluster.operators.failure_artifacts",
    "ultracluster.operators.node_image",
    "ultracluster.operators.node_image_records",
    "ultracluster.operators.results",
    "ultracluster.operators.retry_policy",
    "ultracluster.operators.scaling_report",
    "ultracluster.operators.slurm",
    "ultracluster.operators.sweep_network",
    "ultracluster.operators.vpc",
    "ultracluster.params",
    "ultracluster.reaper",
    "ultracluster.sensors.fleet",
)


def preload() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    # The AWS service models too, parsed once here for every task's hooks (hooks.aws_session).
    aws_session.warm_up()


class PreloadedLocalExecutor(LocalExecutor):
    """LocalExecutor whose workers (forked in ``start``) already hold ``PRELOAD``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Task workloads sent to the workers and not yet ended, per task instance key. A resume after
        # a deferral has the key of the try that deferred, so two can be in flight at once.
        self.in_flight: Counter[TaskInstanceKey] = Counter()

    def start(self) -> None:
        preload()
        super().start()

    def _process_workloads(self, workload_list: Any) -> None:
        self.in_flight.update(w.key for w in workload_list if isinstance(w.key, TaskInstanceKey))
        super()._process_workloads(workload_list)

    def change_state(self, key: Any, state: Any, info: Any = None, remove_running: bool = True) -> None:
        """A worker's end of a workload. A success while a later workload of the same key is in flight is
        the exit of the try's deferral, the resume already sent: the scheduler would read it as the
        resumed attempt killed externally (apache/airflow#72716), so it is dropped. A failure never is."""
        if isinstance(key, TaskInstanceKey) and state in (TaskInstanceState.SUCCESS, TaskInstanceState.FAILED):
            stale = self.in_flight[key] > 1 and state == TaskInstanceState.SUCCESS
            self.in_flight[key] -= 1
            if self.in_flight[key] <= 0:
                del self.in_flight[key]
            if stale:
                self.log.info("Dropped the success of %s's deferral exit: its resume is already running", key)
                return
        super().change_state(key, state, info, remove_running)
