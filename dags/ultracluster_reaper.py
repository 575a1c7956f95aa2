"""Hourly maintenance: delete the pipeline's orphans (docs/operations.md, Reaper).

An orphan carries ``ultracluster:created-by`` and either its run has ended, or its
``ultracluster:expires-at`` has passed and its run cannot be found: a cluster, a network stack, or
a run's S3 scratch. Each delete is verified; a stack or cluster that stays after the retries fails
the run. Findings are sent through ``ultracluster.notifications.notify``. A live (queued or
running) run's resources and unmarked ones are never touched.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param, task

from ultracluster.hooks.dag_runs import get_dagrun_state
from ultracluster.notifications import notify
from ultracluster.reaper import build_reaper
from ultracluster.run.profiles import load_profile
from ultracluster.run.s3 import S3_URI_PATTERN

DAG_ID = "ultracluster_reaper"
PROFILE = load_profile()
AWS_CONN_ID = "aws_default"
PCLUSTER_CONN_ID = "pcluster_default"
POLL_S = PROFILE["cluster_poll_interval_s"]

PARAMS = {
    "region": Param(PROFILE["region"], type="string", minLength=1, title="Region",
                    description="The region whose clusters and stacks are scanned."),
    "artifacts_s3_uri": Param(
        PROFILE["artifacts_s3_uri"], type=["null", "string"], pattern=S3_URI_PATTERN, title="Artifacts in S3",
        description="The pipeline's artifacts_s3_uri: runs' scratch under it is scanned. Empty: no S3 scan."),
    "dry_run": Param(False, type="boolean", title="Dry run",
                     description="List what would be deleted and why; delete nothing."),
}

with DAG(
    dag_id=DAG_ID,
    description="Deletes clusters, network stacks and S3 scratch of ended or vanished ultracluster runs",
    schedule="@hourly",
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=PARAMS,
    # The next hourly pass is the retry; a stack that keeps failing fails every pass (and notifies).
    default_args={"retries": 0, "execution_timeout": timedelta(hours=2)},
    tags=["ultracluster", "maintenance"],
    doc_md=__doc__,
) as dag:

    @task
    def reap(params: dict | None = None) -> dict:
        params = params or {}
        reaper = build_reaper(get_dagrun_state, aws_conn_id=AWS_CONN_ID, pcluster_conn_id=PCLUSTER_CONN_ID,
                              region_name=params.get("region"), artifacts_s3_uri=params.get("artifacts_s3_uri"),
                              poll_s=POLL_S, retry_delay_s=4 * POLL_S)
        result = reaper.reap(dry_run=bool(params.get("dry_run")))
        summary = result.summary()
        if result.orphans or result.left:
            lines = [f"deleted: {line}" for line in summary["deleted"]]
            lines += [f"would delete: {v.line()}" for v in result.orphans if params.get("dry_run")]
            lines += [f"NOT deleted: {what}: {'; '.join(why[:5])}" for what, why in result.left.items()]
            notify(f"ultracluster reaper: {len(result.orphans)} orphan(s), {len(result.left)} left",
                   "\n".join(lines))
        if result.left:
            raise RuntimeError("The reaper could not delete: " + " | ".join(
                f"{what}: {'; '.join(why[:5])}" for what, why in result.left.items()))
        return summary

    reap()
