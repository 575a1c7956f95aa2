"""The orphan reaper: deletes what the pipeline created once its run has ended, or once its expiry
has passed and its run cannot be found (docs/operations.md, Reaper).

classify.py holds the rules (stdlib), reap.py the scan and the verified deletes. The run's state
comes from a small callable (classify.RunState): the Task SDK in the maintenance DAG
(``report.operator.dagrun_state``), the REST API in the CLI (``cli.reap.api_run_state``).
"""
from __future__ import annotations

from typing import Any

from ultracluster.reaper.classify import ENDED, RunState, Verdict, judge

__all__ = ["ENDED", "RunState", "Verdict", "build_reaper", "judge"]


def build_reaper(run_state: RunState, *, aws_conn_id: str | None = "aws_default",
                 pcluster_conn_id: str = "pcluster_default", region_name: str | None = None,
                 artifacts_s3_uri: str | None = None, **options: Any) -> Any:
    """A Reaper on the deployment's connections (the same ones the pipeline uses)."""
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    from ultracluster.hooks.network_stack import NetworkStackHook
    from ultracluster.hooks.parallelcluster import ParallelClusterHook
    from ultracluster.reaper.reap import Reaper

    return Reaper(
        pcluster=ParallelClusterHook(pcluster_conn_id, region_name=region_name or None),
        stacks=NetworkStackHook(aws_conn_id=aws_conn_id, region_name=region_name or None),
        s3=S3Hook(aws_conn_id=aws_conn_id) if artifacts_s3_uri else None,
        artifacts_s3_uri=artifacts_s3_uri or None, run_state=run_state, **options)
