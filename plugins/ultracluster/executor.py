"""The local deployment's executor: Airflow's LocalExecutor, its workers forked with the DAGs' modules loaded.

Every task runs in a process that the Task SDK's supervisor forks from a LocalExecutor worker, and
that process first parses its DAG file. The pipeline's DAG file imports the amazon provider, boto3
and this package, and its SSH tasks then import paramiko and the ssh provider: about 1.5 s of CPU
on the local 2-core machine, paid again by each of the run's 15 tasks (bench/pipeline.py, benchmark
2), where a no-op task's parse takes 30 ms. Imported once in the scheduler, before it forks its
workers, they are inherited by every task, and so are the AWS service models the hooks' sessions
share (``hooks.aws_session``). ``AIRFLOW__CORE__EXECUTOR`` names this class in
scripts/env.sh; Airflow's own LocalExecutor runs the same tasks, only slower to start.

As with Airflow plugins, a change to this package's code reaches the tasks after the scheduler
restarts (``make down && make up``); the DAG files themselves are parsed afresh by every task.
"""
from __future__ import annotations

import importlib

from airflow.executors.local_executor import LocalExecutor

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

    def start(self) -> None:
        preload()
        super().start()
