"""The orphan reaper: deletes what the pipeline created once its run has ended, or once its expiry
has passed and its run cannot be found (docs/operations.md, Reaper).

classify.py holds the rules, reaper.py the scan and the verified deletes. The run's state comes
from a small callable (classify.RunState): the Task SDK in the maintenance DAG
(``hooks.dag_runs.get_dagrun_state``), the REST API in the CLI (``cli.reap.api_run_state``).
"""
from __future__ import annotations

from typing import Any

from airflow.providers.amazon.aws.hooks.s3 import S3Hook

from ultracluster.hooks.network_stack import NetworkStackHook
from ultracluster.hooks.parallelcluster import ParallelClusterHook
from ultracluster.reaper.classify import RunState, Verdict, judge
from ultracluster.reaper.reaper import Reaper

__all__ = ["Reaper", "RunState", "Verdict", "build_reaper", "judge"]


def build_reaper(run_state: RunState, *, aws_conn_id: str | None = "aws_default",
                 pcluster_conn_id: str = "pcluster_default", region_name: str | None = None,
                 artifacts_s3_uri: str | None = None, **options: Any) -> Reaper:
    """A Reaper on the deployment's connections (the same ones the pipeline uses)."""
    return Reaper(
        pcluster=ParallelClusterHook(pcluster_conn_id, region_name=region_name or None),
        stacks=NetworkStackHook(aws_conn_id=aws_conn_id, region_name=region_name or None),
        s3=S3Hook(aws_conn_id=aws_conn_id) if artifacts_s3_uri else None,
        artifacts_s3_uri=artifacts_s3_uri or None, run_state=run_state, **options)
