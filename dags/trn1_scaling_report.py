"""How BERT-Large training time and cost scale with Trn1 nodes: the report of a scaling sweep.

Runs on every results event of trn1_bert_pretrain (its collect_results); the event's extra names the
run's sweep (null outside sweeps: the run is skipped). Trigger it by hand with ``sweep_id`` to
report a sweep at any time; ``partial`` reports before every point has ended.

Writes report.md, report.html, report.json and throughput.png to
``<artifacts_s3_uri>/reports/<source_dag_id>/<sweep_id>/`` and emits an event of
``trn1_bert_pretrain_scaling_report`` (docs/report.md).

Parse cost: airflow.sdk and stdlib-only ultracluster modules; boto3 and matplotlib load in the task.
"""
from __future__ import annotations

from airflow.sdk import DAG, Asset, Param

from ultracluster.operators.scaling_report import DEFAULT_SOURCE_DAG_ID, ScalingReportOperator
from ultracluster.run.profiles import load_profile
from ultracluster.run.s3 import S3_URI_PATTERN, profile_sse
from ultracluster.run.sweep import SWEEP_ID_PATTERN

DAG_ID = "trn1_scaling_report"
PROFILE = load_profile()

# The pipeline's Assets: named, without a URI (a URI scheme loads every provider's normaliser at parse).
RESULTS_ASSET = Asset(name=f"{DEFAULT_SOURCE_DAG_ID}_results")
REPORT_ASSET = Asset(name=f"{DEFAULT_SOURCE_DAG_ID}_scaling_report")

PARAMS = {
    "sweep_id": Param(
        None, type=["null", "string"], pattern=SWEEP_ID_PATTERN, title="Sweep id",
        description="The sweep to report (the 'id' of the pipeline's sweep param). Empty: the sweep(s) of "
                    "the results events that triggered this run."),
    "partial": Param(
        False, type="boolean", title="Partial report",
        description="Report even when some points have not ended (missing, queued or running points are "
                    "marked). Off: the run skips until every point has succeeded or failed."),
    "source_dag_id": Param(
        DEFAULT_SOURCE_DAG_ID, type="string", pattern=r"^[A-Za-z0-9_.-]+$", title="Pipeline DAG",
        description="The DAG whose sweep runs are reported (its sweep index and its runs' XComs)."),
    "artifacts_s3_uri": Param(
        PROFILE["artifacts_s3_uri"], type="string", pattern=S3_URI_PATTERN, title="Artifacts prefix",
        description="The pipeline's artifacts prefix: the sweep index is read from <prefix>/sweeps/ and "
                    "the report written to <prefix>/reports/."),
}

with DAG(
    dag_id=DAG_ID,
    description="Scaling report of a trn1_bert_pretrain sweep: throughput, efficiency, time and cost per node count",
    schedule=RESULTS_ASSET,
    # Reading and writing a few S3 objects costs nothing; paused, it would miss the pipeline's events.
    is_paused_upon_creation=False,
    # One at a time: two runs for the same sweep would write the same report.
    max_active_runs=1,
    params=PARAMS,
    tags=["ultracluster", "trn1", "bert", "report"],
    doc_md=__doc__,
) as dag:
    ScalingReportOperator(
        task_id="build_report",
        aws_conn_id="aws_default",
        poll_interval=PROFILE["cluster_poll_interval_s"],
        s3_encryption=profile_sse(PROFILE),  # of the report's files (docs/operations.md, "Encryption")
        outlets=[REPORT_ASSET],
    )
