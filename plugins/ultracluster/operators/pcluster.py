"""pcluster_create: a ParallelCluster created through ParallelClusterHook (delete_cluster: pcluster_delete.py).

A cluster belongs to the run whose id is in its ``ultracluster:run-id`` tag (render_config puts it in
the config's Tags). Retries reattach to that cluster instead of creating a second one, and deletes
only ever touch a cluster of this run.
"""
from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.providers.amazon.aws.hooks.s3 import S3Hook
from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from ultracluster.hooks.cluster_instances import ClusterInstancesHook
from ultracluster.hooks.parallelcluster import ParallelClusterHook
from ultracluster.links import ParallelClusterStackLink
from ultracluster.operators.admission import describe_held, nodes_held
from ultracluster.operators.create_failure import log_create_failure
from ultracluster.operators.existing_cluster import (
    adopt_cluster,
    step_on_existing_cluster,
)
from ultracluster.parsers.pcluster import (
    ClusterAlreadyExistsError,
    ClusterNotFoundError,
    ClusterValidationError,
    PclusterError,
    failures,
    is_config_failure,
    public_description,
    region_from_arn,
)
from ultracluster.run import existing_cluster as byo
from ultracluster.run.events import deterministic
from ultracluster.run.returns import cluster_created
from ultracluster.run.states import (
    CREATE_COMPLETE,
    CREATE_FAILED,
    CREATE_IN_PROGRESS,
    DELETE_IN_PROGRESS,
    UPDATE_COMPLETE,
)
from ultracluster.run.tags import cluster_owner
from ultracluster.triggers.pcluster import ClusterStatusTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

def status_trigger(op: Any, waiter_name: str, **extra: Any) -> ClusterStatusTrigger:
    """A wait of a cluster operator (``op``: pcluster_create's or delete_cluster's) on its cluster."""
    return ClusterStatusTrigger(
        cluster_name=op.cluster_name, waiter_name=waiter_name, pcluster_conn_id=op.pcluster_conn_id,
        region_name=op.region_name or None, poll_interval=op.poll_interval, max_attempts=op.max_attempts, **extra)


class CreateClusterOperator(BaseOperator):
    """
    Create this run's cluster from the config render_config uploaded, and wait for CREATE_COMPLETE.

    On CREATE_FAILED (or a timeout) the failures are logged and the cluster is deleted here, and
    the task fails only once it is gone: a teardown does not run when its setup failed, so nobody
    else would, and delete_vpc must not start while the cluster still holds the network.

    :param cluster_config: render_config's return value (``cluster_name``, ``bucket``, ``config_s3_key``,
        ``nodes``).
    :param max_live_nodes: the deployment's cap on nodes alive at once, across every run (an account
        derives it from its Trn1 vCPU quota); None: no cap. The cluster's ``nodes`` (its queues'
        MaxCount) must fit beside those of every other tagged cluster in the region, or the task
        waits (deferred) without creating anything. Run the task in a one-slot pool so that two
        runs never check and create at the same time.
    :param max_admission_wait: seconds to wait for room under the cap before failing (None: forever).
    :param existing_cluster_name: the run uses this cluster, which it did not create
        (``run.existing_cluster``): the task checks it is still usable and returns it, creating,
        changing and waiting for nothing (``existing`` True in the result).
    On a first try it creates at once (create-cluster refuses a name taken, and the task then reattaches
    only to this run's cluster); a retry first looks for the cluster an earlier try created.
    Returns ``run.returns.cluster_created``.
    """
    template_fields: Sequence[str] = ("cluster_config", "suppress_validators", "region_name", "existing_cluster_name")
    operator_extra_links = (ParallelClusterStackLink(),)
    ui_color = "#ffd39b"

    def __init__(
        self,
        *,
        cluster_config: dict,
        pcluster_conn_id: str = "pcluster_default",
        region_name: str | None = None,
        aws_conn_id: str | None = "aws_default",
        rollback_on_failure: bool = False,
        suppress_validators: list[str] | None = None,
        poll_interval: float = 30,
        max_attempts: int = 240,
        max_live_nodes: int | None = None,
        max_admission_wait: float | None = 24 * 3600,
        existing_cluster_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.existing_cluster_name = existing_cluster_name
        self.max_live_nodes = max_live_nodes
        self.max_admission_wait = max_admission_wait
        self._waiting_since: float | None = None
        self.cluster_config = cluster_config
        self.pcluster_conn_id = pcluster_conn_id
        self.region_name = region_name
        self.aws_conn_id = aws_conn_id
        self.rollback_on_failure = rollback_on_failure
        self.suppress_validators = suppress_validators
        self.poll_interval = poll_interval
        self.max_attempts = max_attempts

    @property
    def cluster_name(self) -> str:
        return self.cluster_config["cluster_name"]

    def hook(self):
        return ParallelClusterHook(self.pcluster_conn_id, region_name=self.region_name or None)

    def execute(self, context: Context) -> dict:
        hook = self.hook()
        if step_on_existing_cluster(self, byo.CREATE).action == byo.ADOPT:
            return adopt_cluster(context, hook, byo.named(self.existing_cluster_name))
        description = None
        if context["ti"].try_number > 1:  # an earlier try may have created it: reattach, never create twice
            try:
                description = self._own(context, hook.describe_cluster(self.cluster_name))
            except ClusterNotFoundError:
                pass
        if description is None:
            self._admit(hook)  # defers while the node cap is full
            try:
                # create-cluster's answer is the new cluster's (status, stack, region): the wait starts
                # from it, with this run's tags (render_config's), without a describe-cluster first.
                description = self._create(hook)
            except ClusterAlreadyExistsError:
                # Another run's, or an earlier try's: reattach only to this run's.
                description = self._own(context, hook.describe_cluster(self.cluster_name))
            if not description.get("clusterStatus"):
                description = self._own(context, hook.describe_cluster(self.cluster_name))
        return self._continue(context, hook, description)

    def _own(self, context: Context, description: dict) -> dict:
        """The description of this run's cluster; one of another run (a name taken) is never adopted."""
        owner = cluster_owner(description)
        if owner != context["run_id"]:
            raise ClusterAlreadyExistsError(f"Cluster {self.cluster_name} exists and belongs to run {owner!r}, "
                                            f"not {context['run_id']!r}; choose another cluster_name")
        self.log.info("Cluster %s of this run exists (%s): reattaching", self.cluster_name,
                      description.get("clusterStatus"))
        return description

    def _admit(self, hook) -> None:
        """Return when this cluster fits under the node cap; defer and look again when it does not
        (operators/_admission.py says what each cluster counts)."""
        if not self.max_live_nodes:
            return
        mine = int(self.cluster_config.get("nodes") or 0)
        if mine > self.max_live_nodes:
            raise AirflowFailException(f"Cluster {self.cluster_name} can hold {mine} nodes, more than the "
                                       f"deployment's cap of {self.max_live_nodes} nodes alive at once")
        ec2 = ClusterInstancesHook(aws_conn_id=self.aws_conn_id, region_name=self.region_name or None)
        held = nodes_held(hook, ec2.describe_instances, exclude=self.cluster_name)
        used = sum(nodes for nodes, _ in held.values())
        if used + mine <= self.max_live_nodes:
            self.log.info("Node cap: %d of %d nodes held (%s); this cluster's %d fit",
                          used, self.max_live_nodes, describe_held(held), mine)
            return
        since = self._waiting_since or time.time()
        waited = time.time() - since
        if self.max_admission_wait is not None and waited >= self.max_admission_wait:
            # Nothing was created: failing costs nothing, and waiting on would hide a stuck cluster.
            raise AirflowFailException(
                f"Node cap: waited {waited / 3600:.1f} h for room for {mine} node(s) under the cap of "
                f"{self.max_live_nodes}; still held: {describe_held(held)}. Delete what is stuck or raise "
                "max_live_nodes")
        self.log.info("Node cap: %d of %d nodes held (%s); waiting for room for %d before creating %s",
                      used, self.max_live_nodes, describe_held(held), mine, self.cluster_name)
        self.defer(trigger=TimeDeltaTrigger(timedelta(seconds=self.poll_interval)), method_name="admission_retry",
                   kwargs={"waiting_since": since})

    def admission_retry(self, context: Context, event: Any = None, waiting_since: float | None = None) -> dict:
        self._waiting_since = waiting_since
        return self.execute(context)

    def _create(self, hook) -> dict:
        """create-cluster with the config from S3; returns its answer's ``cluster``."""
        config_yaml = S3Hook(aws_conn_id=self.aws_conn_id).read_key(
            self.cluster_config["config_s3_key"], self.cluster_config["bucket"]
        )
        with tempfile.TemporaryDirectory(prefix="ultracluster-") as tmp:
            config_path = os.path.join(tmp, "cluster-config.yaml")
            with open(config_path, "w") as handle:
                handle.write(config_yaml)
            try:
                result = hook.create_cluster(
                    self.cluster_name, config_path,
                    rollback_on_failure=self.rollback_on_failure,
                    suppress_validators=self.suppress_validators,
                )
            except ClusterValidationError as err:
                for item in err.configuration_validation_errors:
                    self.log.error("Validation %s %s: %s", item.get("level"), item.get("type"), item.get("message"))
                raise
        for message in result.get("validationMessages") or []:
            self.log.warning("Validation %s %s: %s", message.get("level"), message.get("type"), message.get("message"))
        self.log.info("create-cluster accepted %s", self.cluster_name)
        return dict(result.get("cluster") or {})

    def _continue(self, context: Context, hook, description: dict) -> dict:
        """Act on the cluster's current status: done, wait, or clean up and fail."""
        status = description.get("clusterStatus")
        ParallelClusterStackLink.persist(
            context=context,
            region_name=description.get("region") or region_from_arn(description.get("cloudformationStackArn")),
            stack_name=description.get("cloudformationStackArn") or self.cluster_name,
        )
        if status in (CREATE_COMPLETE, UPDATE_COMPLETE):
            return self._result(description)
        if status == CREATE_IN_PROGRESS:
            # CREATE_COMPLETE ends the task in the triggerer (the same _result); a failure resumes it here.
            self.defer(
                trigger=status_trigger(self, "ClusterCreateComplete", owner_run_id=context["run_id"],
                                       delete_on_kill=True, end_task=True,
                                       config_s3_uri=self.cluster_config.get("config_s3_uri")),
                method_name="execute_complete",
            )
        if status == CREATE_FAILED:
            self._fail_and_delete(hook, description, "cluster creation failed")
        if status == DELETE_IN_PROGRESS:
            # A killed earlier try deleted its cluster (ClusterStatusTrigger.on_kill): wait, then create.
            self.log.info("Cluster %s of this run is being deleted: waiting to create it again", self.cluster_name)
            self.defer(trigger=status_trigger(self, "ClusterDeleteComplete"), method_name="create_after_delete")
        raise RuntimeError(f"Cluster {self.cluster_name} is {status}; it needs attention before a new create")

    def create_after_delete(self, context: Context, event: dict[str, Any]) -> dict:
        if event.get("status") != "success":
            raise RuntimeError(f"Cluster {self.cluster_name} did not finish deleting: {event.get('message')}")
        return self.execute(context)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict:
        if event.get("status") == "success":
            return self._result(event.get("description") or {})
        if deterministic(event):  # AWS denied the wait's describe: so would it again; the teardown still runs
            raise AirflowFailException(f"Cluster {self.cluster_name}: {event.get('message')}")
        hook = self.hook()

        try:
            description = hook.describe_cluster(self.cluster_name)
        except PclusterError:
            description = {"failures": event.get("failures") or []}
        self._fail_and_delete(hook, description, event.get("message") or str(event.get("status")))
        raise AssertionError("unreachable")

    def _fail_and_delete(self, hook, description: dict, reason: str) -> None:
        """Log the failures, the failed stack events and the bootstrap log tail (_create_failure), delete
        the cluster, and fail once it is gone (fail_after_delete); a config-caused failure is not retried."""
        found = failures(description)
        for failure in found:
            self.log.error("%s: %s", failure.get("failureCode"), failure.get("failureReason"))
        log_create_failure(self.log, hook, self.cluster_name, found)
        summary = "; ".join(f"{f.get('failureCode')}: {f.get('failureReason')}" for f in found)
        message = f"Cluster {self.cluster_name}: {reason}. {summary}".strip()
        deterministic = is_config_failure(found)
        if description.get("clusterStatus") != DELETE_IN_PROGRESS:
            try:
                hook.delete_cluster(self.cluster_name)
            except ClusterNotFoundError:
                self._raise_failure(f"{message} (it is already gone)", deterministic)
        self.log.info("Deleting cluster %s; the task fails once it is gone", self.cluster_name)
        self.defer(
            trigger=status_trigger(self, "ClusterDeleteComplete"),
            method_name="fail_after_delete",
            kwargs={"failure": message, "deterministic": deterministic},
        )

    @staticmethod
    def _raise_failure(message: str, deterministic: bool) -> None:
        """A failure the configuration causes fails the task without retries: a new create fails the same way."""
        if deterministic:
            raise AirflowFailException(f"{message}; not retried: the cluster configuration causes it")
        raise RuntimeError(message)

    def fail_after_delete(self, context: Context, event: dict[str, Any], failure: str = "",
                          deterministic: bool = False) -> None:
        """Resume after the clean-up wait: always fails, with the original failure."""
        if event.get("status") == "success":
            self._raise_failure(f"{failure} (the cluster was deleted)", deterministic)
        arn = (event.get("description") or {}).get("cloudformationStackArn")
        raise RuntimeError(
            f"{failure} (deleting it failed too: {event.get('message')}"
            + (f"; inspect stack {arn}" if arn else "") + ")"
        )

    def _result(self, description: dict) -> dict:
        public = public_description(description)
        self.log.info("Cluster %s is %s", self.cluster_name, public.get("clusterStatus"))
        return cluster_created(self.cluster_name, public, self.cluster_config.get("config_s3_uri"))

    def on_kill(self) -> None:
        # The wait runs in the triggerer (ClusterStatusTrigger.on_kill deletes there); nothing runs here.
        self.log.info("pcluster_create killed; a deferred wait deletes the cluster from its trigger")
