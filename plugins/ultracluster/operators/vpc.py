"""create_vpc / delete_vpc: the cluster's network as a CloudFormation stack (include/cluster/vpc.yaml).

Thin: AWS calls live in NetworkStackHook, waits in CloudFormationStackTrigger (aiobotocore).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.amazon.aws.operators.base_aws import AwsBaseOperator
from airflow.providers.amazon.aws.utils.mixins import aws_template_fields
from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

from ultracluster.hooks.network_stack import NetworkStackHook
from ultracluster.hooks.parallelcluster import ParallelClusterHook
from ultracluster.links import CloudFormationStackLink
from ultracluster.operators.existing_cluster import step_on_existing_cluster
from ultracluster.parsers.pcluster import ClusterNotFoundError
from ultracluster.run import existing_cluster as byo
from ultracluster.run.form import DEFAULT_RESOURCE_TTL_HOURS
from ultracluster.run.profiles import include_dir
from ultracluster.run.returns import network_created, saw_deleted, stack_deleted, stack_outputs
from ultracluster.run.states import (
    DELETE_COMPLETE,
    DELETE_FAILED,
    DELETE_IN_PROGRESS,
    FAILED,
    GONE,
    PENDING,
    READY,
    stack_verdict,
)
from ultracluster.run.tags import DAG_ID_TAG, RUN_ID_TAG, cluster_owner, run_tags
from ultracluster.triggers.cloud_formation import CloudFormationStackTrigger
from ultracluster.triggers.pcluster import ClusterStatusTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

    from ultracluster.triggers.cloud_formation import CloudFormationStackTrigger

__all__ = ["DAG_ID_TAG", "RUN_ID_TAG", "CreateVpcStackOperator", "DeleteVpcStackOperator"]

_STACK_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,127}$")


def default_vpc_template() -> str:
    return str(include_dir() / "cluster" / "vpc.yaml")


class _NetworkStackOperator(AwsBaseOperator[NetworkStackHook]):
    """
    Deletion shared by create_vpc's clean-up and delete_vpc: delete, wait in the triggerer, and
    retry a DELETE_FAILED after a pause. On AWS a stack delete fails while its subnets or security
    group still hold network interfaces (those of just-terminated cluster instances, or Lambda and
    endpoint interfaces): EC2 releases them within minutes, and a later DeleteStack succeeds.
    Subclasses say what a deleted or undeletable stack means (``_stack_deleted``/``_stack_left``).
    """
    aws_hook_class = NetworkStackHook
    operator_extra_links = (CloudFormationStackLink(),)
    ui_color = "#f4d8a5"
    # A deletion that succeeds ends the task in the triggerer (delete_vpc); create_vpc's clean-up
    # deletes resume it to fail or to create again.
    delete_ends_task = False

    def __init__(self, *, waiter_delay: float = 15, waiter_max_attempts: int = 240, max_delete_attempts: int = 3,
                 delete_retry_delay: float = 120, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.waiter_delay = waiter_delay
        self.waiter_max_attempts = waiter_max_attempts
        self.max_delete_attempts = max_delete_attempts
        self.delete_retry_delay = delete_retry_delay

    @property
    def _hook_parameters(self) -> dict[str, Any]:
        # The DAG templates region_name from a param: an empty one means the connection's region.
        return {**super()._hook_parameters, "region_name": self.region_name or None}

    def _stack_trigger(self, stack_name: str, waiter_name: str, **kwargs: Any) -> CloudFormationStackTrigger:
        return CloudFormationStackTrigger(
            stack_name=stack_name, waiter_name=waiter_name, waiter_delay=self.waiter_delay,
            waiter_max_attempts=self.waiter_max_attempts, aws_conn_id=self.aws_conn_id,
            region_name=self.hook.region_name, verify=self.verify, botocore_config=self.botocore_config, **kwargs)

    def _delete(self, context: Context, stack_name: str, attempt: int = 1, **outcome: Any) -> Any:
        status = self.hook.get_stack_status(stack_name)
        if status in (None, DELETE_COMPLETE):
            return self._stack_deleted(context, stack_name, **outcome)
        if status != DELETE_IN_PROGRESS:
            self.log.info("Deleting stack %s (%s), attempt %d/%d", stack_name, status, attempt, self.max_delete_attempts)
            self.hook.delete_stack(stack_name)
            if self.hook.get_stack_status(stack_name) in (None, DELETE_COMPLETE):  # already gone: no wait
                return self._stack_deleted(context, stack_name, **outcome)
        self.defer(trigger=self._stack_trigger(stack_name, "stack_delete_complete", end_task=self.delete_ends_task),
                   method_name="delete_complete", kwargs={"stack_name": stack_name, "attempt": attempt, **outcome})

    def delete_complete(self, context: Context, event: dict[str, Any], stack_name: str, attempt: int,
                        **outcome: Any) -> Any:
        if event.get("status") == "success":
            return self._stack_deleted(context, stack_name, **outcome)
        reasons = self.hook.failed_resources(stack_name)
        for reason in reasons[:10]:
            self.log.error("%s", reason)
        if attempt >= self.max_delete_attempts:
            return self._stack_left(context, stack_name, reasons or [event.get("message", "")], attempt, **outcome)
        self.log.warning("Deleting stack %s failed (%s); deleting again in %s s", stack_name,
                         event.get("message"), self.delete_retry_delay)
        self.defer(trigger=TimeDeltaTrigger(timedelta(seconds=self.delete_retry_delay)), method_name="delete_again",
                   kwargs={"stack_name": stack_name, "attempt": attempt + 1, **outcome})

    def delete_again(self, context: Context, event: Any, stack_name: str, attempt: int, **outcome: Any) -> Any:
        return self._delete(context, stack_name, attempt, **outcome)

    def _persist_stack_link(self, context: Context, stack_name: str | None = None) -> None:
        CloudFormationStackLink.persist(context=context, region_name=self.hook.region_name,
                                        stack_name=stack_name or self.stack_name)

    def _stack_deleted(self, context: Context, stack_name: str, **outcome: Any) -> Any:
        raise NotImplementedError

    def _stack_left(self, context: Context, stack_name: str, reasons: list[str], attempts: int,
                    **outcome: Any) -> Any:
        raise NotImplementedError


class CreateVpcStackOperator(_NetworkStackOperator):
    """
    Create (or reattach to) this run's VPC stack, or adopt an existing network.

    Returns ``{"owned", "stack_name", "region", "vpc_id", "public_subnet_id", "private_subnet_id",
    "security_group_id", "availability_zone"}``. ``owned`` False means the network was given by
    the user: delete_vpc then leaves it alone. A create that fails is deleted before the task
    fails: a teardown does not run when its setup failed.

    :param existing_network: ``{"public_subnet_id", "private_subnet_id", ["security_group_id"]}``
        to reuse instead of creating; None creates the stack.
    :param resource_ttl_hours: the stack's ``ultracluster:expires-at`` is the run's start plus this
        (what the reaper goes by when the run is gone).
    :param existing_cluster_name: the run uses this cluster (``run.existing_cluster``): nothing is
        created, and the result says so (``owned`` False, ``existing_cluster_name``).
    """
    template_fields: Sequence[str] = aws_template_fields(
        "stack_name", "availability_zone_id", "existing_network", "tags", "resource_ttl_hours",
        "existing_cluster_name",
    )

    def __init__(self, *, stack_name: str, availability_zone_id: str, existing_network: dict | None = None,
                 tags: dict[str, str] | None = None, template_path: str | None = None,
                 resource_ttl_hours: Any = DEFAULT_RESOURCE_TTL_HOURS, existing_cluster_name: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.existing_cluster_name = existing_cluster_name
        self.stack_name = stack_name
        self.availability_zone_id = availability_zone_id
        self.existing_network = existing_network
        self.tags = tags or {}
        self.resource_ttl_hours = resource_ttl_hours
        self.template_path = template_path

    def execute(self, context: Context) -> dict:
        if step_on_existing_cluster(self, byo.NETWORK).action == byo.ADOPT:
            return {"owned": False, "stack_name": None, "region": self.hook.region_name,
                    "existing_cluster_name": byo.named(self.existing_cluster_name)}
        network = {k: v for k, v in (self.existing_network or {}).items() if v}
        if network:
            return self._adopt_existing(network)
        if not _STACK_NAME.match(self.stack_name):
            raise ValueError(f"Invalid CloudFormation stack name {self.stack_name!r}")

        status = self.hook.get_stack_status(self.stack_name)
        if status is not None:
            owner = self.hook.stack_owner(self.stack_name)
            if owner != context["run_id"]:
                raise RuntimeError(f"Stack {self.stack_name} exists but belongs to run {owner!r}, "
                                   f"not {context['run_id']!r}; refusing to adopt it")
            self.log.info("Stack %s of this run exists (%s): reattaching", self.stack_name, status)
            self._persist_stack_link(context)  # before any wait below: the link shows while it waits
        if status in (DELETE_IN_PROGRESS, DELETE_FAILED):
            # A killed earlier try deleted it (trigger on_kill): finish that delete, then create anew.
            return self._delete(context, self.stack_name, failure=None)
        if stack_verdict(status) == FAILED:
            return self._clean_up_and_fail(context, f"it failed earlier ({status})")
        if stack_verdict(status) == GONE:
            self._create(context)
            self._persist_stack_link(context)
            status = self.hook.get_stack_status(self.stack_name)
        if stack_verdict(status) == PENDING:
            # CREATE_COMPLETE ends the task in the triggerer (run.returns.network_created, as _outputs).
            self.defer(trigger=self._stack_trigger(self.stack_name, "stack_create_complete",
                                                   owner_run_id=context["run_id"], delete_on_kill=True, end_task=True),
                       method_name="execute_complete")
        if stack_verdict(status) != READY:
            return self._clean_up_and_fail(context, f"stack reached {status}")
        return self._outputs()

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict:
        if event.get("status") != "success":
            return self._clean_up_and_fail(context, event.get("message") or str(event))
        return self._outputs()

    def _create(self, context: Context) -> None:
        template = Path(self.template_path or default_vpc_template()).read_text()
        availability_zone = self.hook.describe_availability_zone(self.availability_zone_id)
        tags = {**self.tags, **run_tags(context, self.resource_ttl_hours)}
        self.log.info("Creating stack %s in %s (%s)", self.stack_name, availability_zone, self.availability_zone_id)
        self.hook.create_stack(self.stack_name, {
            "TemplateBody": template,
            "Parameters": [
                {"ParameterKey": "AvailabilityZone", "ParameterValue": availability_zone},
                {"ParameterKey": "AvailabilityZoneId", "ParameterValue": self.availability_zone_id},
            ],
            "Tags": [{"Key": str(k), "Value": str(v)} for k, v in tags.items()],
            # A failed create keeps its resources for diagnosis; this task deletes them itself.
            "OnFailure": "DO_NOTHING",
        })

    def _outputs(self) -> dict:
        result = network_created(self.stack_name, self.hook.region_name,
                                 stack_outputs(self.hook.describe_stack(self.stack_name)))
        self.log.info("Network: %s", result)
        return result

    def _clean_up_and_fail(self, context: Context, reason: str) -> dict:
        for failed in self.hook.failed_resources(self.stack_name)[:10]:
            self.log.error("%s", failed)
        # Raises from _stack_deleted/_stack_left once the deletion ends.
        return self._delete(context, self.stack_name, failure=reason)

    def _stack_deleted(self, context: Context, stack_name: str, failure: str | None = None) -> dict:
        if failure is None:  # the leftover of a killed try is gone: create the stack now
            return self.execute(context)
        raise RuntimeError(f"Creating stack {stack_name} failed: {failure}. Clean-up deleted the stack.")

    def _stack_left(self, context: Context, stack_name: str, reasons: list[str], attempts: int,
                    failure: str | None = None) -> dict:
        what = f"Creating stack {stack_name} failed: {failure}." if failure else f"Stack {stack_name} of an earlier try."
        raise RuntimeError(f"{what} Deleting it failed {attempts} times: {'; '.join(reasons)}")

    def _adopt_existing(self, network: dict) -> dict:
        """Reuse the user's subnets: check they exist and share one VPC and AZ, create nothing."""
        for key in ("public_subnet_id", "private_subnet_id"):
            if not network.get(key):
                raise ValueError(f"existing network needs {key} (got {sorted(network)})")
        subnets = self.hook.describe_subnets([network["public_subnet_id"], network["private_subnet_id"]])
        vpcs = {s["VpcId"] for s in subnets}
        zones = {s["AvailabilityZone"] for s in subnets}
        if len(vpcs) != 1 or (network.get("vpc_id") and network["vpc_id"] not in vpcs):
            wanted = f" {network['vpc_id']}" if network.get("vpc_id") else ""
            raise ValueError(f"Existing subnets must be in one VPC{wanted}; got {sorted(vpcs)}")
        if len(zones) != 1:
            raise ValueError(f"Existing subnets must be in one availability zone (placement group); got {sorted(zones)}")
        result = {
            "owned": False, "stack_name": None, "region": self.hook.region_name, "vpc_id": vpcs.pop(),
            "public_subnet_id": network["public_subnet_id"], "private_subnet_id": network["private_subnet_id"],
            "security_group_id": network.get("security_group_id"), "availability_zone": zones.pop(),
        }
        self.log.info("Reusing existing network (not owned by this run; delete_vpc leaves it): %s", result)
        return result


class DeleteVpcStackOperator(_NetworkStackOperator):
    """
    Teardown of create_vpc: check the run's cluster is gone, then delete the run's VPC stack.

    The cluster check runs even for a network the run did not create: delete_cluster's own failure
    does not decide the run state, this task does. A cluster of this run still being deleted is
    waited for (deferrably); one in any other state fails the task and the network is kept.
    Gone already counts as success. A network the run did not create (``vpc["owned"]`` False) is
    left alone.

    :param cluster_name: the run's cluster (delete_cluster's name); empty skips the check.
    :param cluster_deleted: delete_cluster's return (``run.returns.cluster_deleted``): a cluster it saw
        gone is not described again.
    :param existing_cluster_name: the run used this cluster, which it did not create: the task skips.
    """
    template_fields: Sequence[str] = aws_template_fields("vpc", "stack_name", "cluster_name", "cluster_deleted",
                                                         "existing_cluster_name")
    delete_ends_task = True

    def __init__(self, *, vpc: dict | None = None, stack_name: str | None = None, cluster_name: str | None = None,
                 pcluster_conn_id: str = "pcluster_default", waiter_max_attempts: int = 120,
                 existing_cluster_name: str | None = None, cluster_deleted: dict | None = None,
                 **kwargs: Any) -> None:
        super().__init__(waiter_max_attempts=waiter_max_attempts, **kwargs)
        self.existing_cluster_name = existing_cluster_name
        self.cluster_deleted = cluster_deleted
        self.vpc = vpc
        self.stack_name = stack_name
        self.cluster_name = cluster_name
        self.pcluster_conn_id = pcluster_conn_id

    def execute(self, context: Context) -> dict:
        step_on_existing_cluster(self, byo.DELETE_NETWORK)
        self._check_cluster_gone(context)
        return self._delete_network(context)

    def _check_cluster_gone(self, context: Context) -> None:
        """Return when the run's cluster is gone; defer while it is deleting; raise otherwise."""
        if not self.cluster_name:
            return
        if saw_deleted(self.cluster_deleted, self.cluster_name):
            self.log.info("Cluster %s is gone (delete_cluster saw it go)", self.cluster_name)
            return
        hook = ParallelClusterHook(self.pcluster_conn_id, region_name=self.region_name or None)
        try:
            description = hook.describe_cluster(self.cluster_name)
        except ClusterNotFoundError:
            self.log.info("Cluster %s is gone", self.cluster_name)
            return
        owner = cluster_owner(description)
        if owner != context["run_id"]:
            self.log.info("Cluster %s belongs to run %r, not this one: not waited for", self.cluster_name, owner)
            return
        status = description.get("clusterStatus")
        if status == DELETE_IN_PROGRESS:
            self.log.info("Cluster %s is still being deleted: waiting before the network goes", self.cluster_name)
            self.defer(trigger=ClusterStatusTrigger(
                cluster_name=self.cluster_name, waiter_name="ClusterDeleteComplete",
                pcluster_conn_id=self.pcluster_conn_id, region_name=self.region_name or None,
                poll_interval=self.waiter_delay, max_attempts=self.waiter_max_attempts,
            ), method_name="cluster_gone_complete")
        raise RuntimeError(
            f"Cluster {self.cluster_name} of this run still exists ({status}): delete_cluster did not delete it. "
            "The network is kept; delete the cluster, then clear delete_cluster and delete_vpc."
        )

    def cluster_gone_complete(self, context: Context, event: dict[str, Any]) -> dict:
        if event.get("status") != "success":
            raise RuntimeError(
                f"Cluster {self.cluster_name} of this run did not finish deleting "
                f"({event.get('cluster_status') or event.get('status')}): {event.get('message')}. The network is kept."
            )
        self.log.info("Cluster %s is gone", self.cluster_name)
        return self._delete_network(context)

    def _delete_network(self, context: Context) -> dict:
        vpc = self.vpc if isinstance(self.vpc, dict) else {}
        if vpc and not vpc.get("owned", True):
            self.log.info("Network %s was not created by this run: left alone", vpc.get("vpc_id"))
            return {"deleted": False, "stack_name": None, "reason": "not owned"}
        self._persist_stack_link(context, vpc.get("stack_name"))
        return self._delete(context, vpc.get("stack_name") or self.stack_name)

    def _stack_deleted(self, context: Context, stack_name: str) -> dict:
        self.log.info("Stack %s deleted", stack_name)
        return stack_deleted(stack_name)

    def _stack_left(self, context: Context, stack_name: str, reasons: list[str], attempts: int) -> dict:
        raise RuntimeError(f"Stack {stack_name} not deleted after {attempts} attempts: {'; '.join(reasons)}")
