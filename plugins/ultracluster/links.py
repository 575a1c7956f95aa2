"""Operator extra links: the AWS console pages of what a task made (stack, cluster config, results), and
the ultracluster plugin's pages (a Slurm job, a sweep's report; ui/plugin.py).

Same pattern as the amazon provider's BaseAwsLink (values persisted to XCom under the link's key,
formatted on display).
Airflow formats a link in the worker when a try ends or defers: a task persists the values before it
defers, so the link shows while it waits (docs/contracts.md, "Extra links").
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink
from airflow.sdk.configuration import conf
from airflow.sdk.execution_time.xcom import XCom

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator, Context
    from airflow.sdk.types import TaskInstanceKey

AWS_CONSOLE = "https://console.aws.amazon.com"
S3_CONSOLE = "https://s3.console.aws.amazon.com"


class _UltraClusterLink(BaseOperatorLink):
    name: ClassVar[str]
    key: ClassVar[str]
    format_str: ClassVar[str]

    def format_link(self, **values: Any) -> str:
        try:
            return self.format_str.format(**{k: quote(str(v), safe="/") for k, v in values.items()})
        except KeyError:
            return ""

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        try:
            values = XCom.get_value(key=self.key, ti_key=ti_key)
        except Exception:  # a missing link must never break the task page
            return ""
        return self.format_link(**values) if values else ""

    @classmethod
    def persist(cls, context: Context, **values: Any) -> None:
        context["ti"].xcom_push(key=cls.key, value=values)


class CloudFormationStackLink(_UltraClusterLink):
    """The stack this task created or deleted."""
    name = "CloudFormation Stack"
    key = "ultracluster_cloudformation_stack"
    format_str = AWS_CONSOLE + "/cloudformation/home?region={region_name}#/stacks/stackinfo?stackId={stack_name}"


class ClusterConfigLink(_UltraClusterLink):
    """The rendered ParallelCluster YAML in the artifacts bucket."""
    name = "Cluster Config (S3)"
    key = "ultracluster_cluster_config"
    format_str = S3_CONSOLE + "/s3/object/{bucket}?region={region_name}&prefix={key}"


class S3ResultsLink(_UltraClusterLink):
    """The run's artifacts/results prefix."""
    name = "Results (S3)"
    key = "ultracluster_s3_results"
    format_str = S3_CONSOLE + "/s3/buckets/{bucket}?region={region_name}&prefix={prefix}/"


class ParallelClusterStackLink(CloudFormationStackLink):
    """The cluster's main CloudFormation stack (pcluster's cloudformationStackArn)."""
    name = "ParallelCluster Stack"
    key = "ultracluster_pcluster_stack"


PLUGIN_PREFIX = "/ultracluster"  # the ultracluster plugin's pages (ui/plugin.py)


def airflow_base_url() -> str:
    """Airflow's ``[api] base_url`` without its trailing slash; empty when unset (root-relative hrefs)."""
    return (conf.get("api", "base_url", fallback="") or "").rstrip("/")


class _PluginPageLink(_UltraClusterLink):
    """A page of the ultracluster plugin, under Airflow's own address: every value is one path segment."""
    fields: ClassVar[tuple[str, ...]]  # the values the path needs: without one, no link

    def format_link(self, **values: Any) -> str:
        if any(values.get(field) in (None, "") for field in self.fields):
            return ""
        return airflow_base_url() + self.format_str.format(**{k: quote(str(v), safe="") for k, v in values.items()})


class SlurmJobLink(_PluginPageLink):
    """The plugin's page of the task's Slurm job: its id, state and log path on the head node.

    Values (docs/contracts.md, "Slurm job page"): ``dag_id``, ``run_id``, ``task_id``, ``job_id``,
    ``job_name``, ``log_path``, ``output_dir``, ``cluster_name``; ``state`` once the job has ended."""
    name = "Slurm Job"
    key = "ultracluster_slurm_job"
    fields = ("dag_id", "run_id", "task_id")
    format_str = PLUGIN_PREFIX + "/jobs/{dag_id}/{run_id}/{task_id}"


class SweepReportLink(_PluginPageLink):
    """The plugin's page of the scaling report of the run's sweep. Values: ``dag_id`` (the pipeline's),
    ``sweep_id``."""
    name = "Sweep Report"
    key = "ultracluster_sweep_report"
    fields = ("dag_id", "sweep_id")
    format_str = PLUGIN_PREFIX + "/reports/{dag_id}/{sweep_id}"
