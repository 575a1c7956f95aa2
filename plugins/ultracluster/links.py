"""Operator extra links: the AWS console pages of what a task made (stack, cluster config, results).

Same pattern as the amazon provider's BaseAwsLink (values persisted to XCom under the link's key,
formatted on display), without importing botocore: the DAG file imports this module at parse time.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

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
        from airflow.sdk.execution_time.xcom import XCom

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

