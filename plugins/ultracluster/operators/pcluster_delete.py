"""delete_cluster: the teardown of pcluster_create, then what the cluster cost, from EC2."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from ultracluster.hooks.parallelcluster import ParallelClusterHook
from ultracluster.hooks.usage import record_usage
from ultracluster.links import ParallelClusterStackLink
from ultracluster.operators.existing_cluster import step_on_existing_cluster
from ultracluster.operators.pcluster import status_trigger
from ultracluster.parsers.pcluster import ClusterNotFoundError, region_from_arn
from ultracluster.run import existing_cluster as byo
from ultracluster.run.clock import utc_now
from ultracluster.run.events import deterministic
from ultracluster.run.returns import cluster_deleted, created_description
from ultracluster.run.s3 import check_sse
from ultracluster.run.states import DELETE_IN_PROGRESS
from ultracluster.run.tags import cluster_owner

if TYPE_CHECKING:
    from airflow.sdk import Context


class DeleteClusterOperator(BaseOperator):
    """
    Teardown of pcluster_create: delete this run's cluster and wait (deferrably) until it is gone.

    Gone already counts as success. DELETE_FAILED is retried with delete-cluster up to
    ``max_delete_attempts`` times; a cluster not tagged with this run is never touched.

    Once deleted, it bills the run from EC2: each instance tagged with the cluster, from its launch
    to its termination (``cost.instance_usage``), into the XCom's ``usage`` and, when the run's
    results were collected (``results_uri``), into ``usage.json`` and results.json's ``usage``.

    :param aws_conn_id: EC2 (describe-instances) and S3.
    :param results_uri: the run's results folder (collect_results' ``artifacts_uri``); None: XCom only.
    :param fsx_storage_capacity_gib: FSx for Lustre billed over the head node's life; None: no FSx.
    :param s3_encryption: server-side encryption of usage.json and results.json (``s3_encryption.sse_args``).
    :param existing_cluster_name: the run used this cluster, which it did not create: the task skips
        (collect_results billed the run from its Slurm jobs).
    :param cluster: pcluster_create's return (``run.returns.cluster_created``): the cluster it created or
        reattached to is this run's, so a first try deletes it without describing it first.
    """
    template_fields: Sequence[str] = ("cluster_name", "region_name", "results_uri", "fsx_storage_capacity_gib",
                                      "existing_cluster_name", "cluster")
    operator_extra_links = (ParallelClusterStackLink(),)
    ui_color = "#ffd39b"

    def __init__(
        self,
        *,
        cluster_name: str,
        pcluster_conn_id: str = "pcluster_default",
        aws_conn_id: str | None = "aws_default",
        region_name: str | None = None,
        results_uri: str | None = None,
        fsx_storage_capacity_gib: Any = None,
        poll_interval: float = 30,
        max_attempts: int = 120,
        max_delete_attempts: int = 3,
        s3_encryption: Mapping[str, str] | None = None,
        existing_cluster_name: str | None = None,
        cluster: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.cluster = cluster
        self.existing_cluster_name = existing_cluster_name
        self.s3_encryption = check_sse(s3_encryption)
        self.cluster_name = cluster_name
        self.aws_conn_id = aws_conn_id
        self.results_uri = results_uri
        self.fsx_storage_capacity_gib = fsx_storage_capacity_gib
        self.pcluster_conn_id = pcluster_conn_id
        self.region_name = region_name
        self.poll_interval = poll_interval
        self.max_attempts = max_attempts
        self.max_delete_attempts = max_delete_attempts

    def hook(self):
        return ParallelClusterHook(self.pcluster_conn_id, region_name=self.region_name or None)

    def execute(self, context: Context) -> dict:
        step_on_existing_cluster(self, byo.DELETE_CLUSTER)
        return self._delete(context, delete_attempt=1)

    def _delete(self, context: Context, delete_attempt: int) -> dict:
        hook = self.hook()
        if not self.cluster_name:
            self.log.info("No cluster name: nothing to delete")
            return {"cluster_name": None, "deleted": False}
        # pcluster_create's answer on a first delete of a first try: the cluster it returned is this run's.
        description = (created_description(self.cluster, self.cluster_name, context["ti"].try_number)
                       if delete_attempt == 1 else None)
        if description is None:
            try:
                description = hook.describe_cluster(self.cluster_name)
            except ClusterNotFoundError:
                self.log.info("Cluster %s does not exist: nothing to delete", self.cluster_name)
                return self._gone()
            owner = cluster_owner(description)
            if owner != context["run_id"]:
                self.log.warning("Cluster %s belongs to run %r, not this one: left alone", self.cluster_name, owner)
                return {"cluster_name": self.cluster_name, "deleted": False}
        ParallelClusterStackLink.persist(
            context=context,
            region_name=description.get("region") or region_from_arn(description.get("cloudformationStackArn")),
            stack_name=description.get("cloudformationStackArn") or self.cluster_name,
        )
        if description.get("clusterStatus") != DELETE_IN_PROGRESS:
            try:
                hook.delete_cluster(self.cluster_name)
            except ClusterNotFoundError:
                return self._gone()
            self.log.info("delete-cluster %s started (attempt %d)", self.cluster_name, delete_attempt)
        # Gone ends the task in the triggerer, billed there (hooks.usage); a failure resumes it here.
        self.defer(
            trigger=status_trigger(self, "ClusterDeleteComplete", end_task=True, bill=self._bill()),
            method_name="execute_complete",
            kwargs={"delete_attempt": delete_attempt},
        )
        raise AssertionError("unreachable")

    def _bill(self) -> dict[str, Any]:
        """What ``hooks.usage`` bills the cluster with."""
        return {"cluster_name": self.cluster_name, "aws_conn_id": self.aws_conn_id, "region_name": self.region_name,
                "results_uri": self.results_uri, "fsx_storage_capacity_gib": self.fsx_storage_capacity_gib,
                "s3_encryption": dict(self.s3_encryption)}

    def _gone(self) -> dict:
        """The cluster is gone already (an earlier try deleted it: a retry reattaches). Its name is
        this run's (render_config's), so its instances, still listed by EC2, are this run's bill."""
        usage = record_usage(self.log, self._bill(), utc_now())
        return cluster_deleted(self.cluster_name, (usage or {}).get("ended_at"), usage)

    def execute_complete(self, context: Context, event: dict[str, Any], delete_attempt: int = 1) -> dict:
        if event.get("status") == "success":
            deleted_at = utc_now()
            self.log.info("Cluster %s deleted", self.cluster_name)
            return cluster_deleted(self.cluster_name, deleted_at, record_usage(self.log, self._bill(), deleted_at))
        self.log.error("Deleting cluster %s: %s", self.cluster_name, event.get("message"))
        for failure in event.get("failures") or []:
            self.log.error("%s: %s", failure.get("failureCode"), failure.get("failureReason"))
        if deterministic(event):
            raise AirflowFailException(f"Cluster {self.cluster_name} not deleted: {event.get('message')}")
        if event.get("reason") == "cluster_failed" and delete_attempt < self.max_delete_attempts:
            return self._delete(context, delete_attempt + 1)
        arn = (event.get("description") or {}).get("cloudformationStackArn")
        raise RuntimeError(
            f"Cluster {self.cluster_name} not deleted after {delete_attempt} attempt(s): {event.get('message')}"
            + (f"; inspect stack {arn}" if arn else "")
        )
