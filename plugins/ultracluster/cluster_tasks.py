"""The cluster tasks two DAGs share: preflight, create_vpc, render_config, pcluster_create,
delete_cluster and delete_vpc, as trn1_bert_pretrain (a run's own cluster) and trn1_sweep_cluster (a
sweep's shared cluster, ``run.shared_cluster``) make them. Each function builds one task inside the
DAG being defined; the step's code is its operator's module, imported here by name.

Templates read the run's plan (preflight's XCom) through the DAG's macros: a DAG using these tasks
passes ``MACROS`` as its ``user_defined_macros``.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from ultracluster.operators.cluster_config import RenderClusterConfigOperator
from ultracluster.operators.pcluster import CreateClusterOperator
from ultracluster.operators.pcluster_delete import DeleteClusterOperator
from ultracluster.operators.preflight import PreflightOperator
from ultracluster.operators.vpc import CreateVpcStackOperator, DeleteVpcStackOperator
from ultracluster.run.names import cluster_name_for, safe_run_id, vpc_stack_name_for
from ultracluster.run.plan import cluster_of, plan_of
from ultracluster.run.s3 import profile_sse

AWS_CONN_ID = "aws_default"
PCLUSTER_CONN_ID = "pcluster_default"
SSH_CONN_ID = "ultracluster_head_node"
ADMISSION_POOL = "ultracluster_cluster_admission"
SCHEDULE_PERIOD = timedelta(days=7)

MACROS = {
    "safe_run_id": safe_run_id,
    "cluster_name_for": cluster_name_for,
    "vpc_stack_name_for": vpc_stack_name_for,
    "plan": plan_of,  # the params with the run's sweep point applied (preflight's XCom)
    "run_cluster": cluster_of,
}
# The cluster the run trains on: the existing one it was given, else the one render_config named.
CLUSTER_NAME = "{{ run_cluster(ti) }}"
# Set: the run uses this cluster, which it did not create (run/existing_cluster.py); None: it creates one.
EXISTING_CLUSTER = "{{ plan(ti).existing_cluster_name }}"


def max_live_nodes(profile: dict[str, Any]) -> int | None:
    """The deployment's cap on Trn1 nodes alive at once, across every run (None: none). pcluster_create
    checks it in a one-slot pool, so that two runs never check and create at the same time."""
    return int(profile["max_live_nodes"]) if profile.get("max_live_nodes") not in (None, "") else None


def preflight(profile: dict[str, Any], *, trains: bool = True) -> PreflightOperator:
    """``trains=False``: the holder of a sweep's shared cluster, which trains nothing (its plan is
    ``run.shared_cluster.holder_plan``; training-only rules are the points' own)."""
    return PreflightOperator(
        task_id="preflight",
        trains=trains,
        schedule_period=SCHEDULE_PERIOD,
        artifacts_s3_uri="{{ params.artifacts_s3_uri }}",
        max_cost_usd="{{ params.max_cost_usd }}",
        aws_conn_id=AWS_CONN_ID,
        s3_encryption=profile_sse(profile),
        # A compute node's boot against the bootstrap timeout (production; local nodes boot in seconds).
        estimate_boot_time=profile.get("estimate_boot_time") is True,
        # A capacity reservation must start before the fleet wait gives up on the nodes.
        reservation_lead_s=profile["fleet_timeout_s"],
        # Where this deployment's workers reach head nodes from: a run's ssh_allowed_cidr, if empty.
        default_ssh_allowed_cidr=profile.get("head_node_ssh_cidr") or None,
        # The cluster roles' boundary (required unless the profile says otherwise: the local one) and the
        # nodes' kms:Decrypt policy (docs/operations.md, "Least privilege").
        permissions_boundary_arn=profile.get("permissions_boundary_arn") or None,
        require_permissions_boundary=profile.get("require_permissions_boundary", True) is not False,
        node_kms_policy_arn=profile.get("node_kms_policy_arn") or None,
        pcluster_conn_id=PCLUSTER_CONN_ID,  # where an existing cluster is checked
        # The compute nodes' image: the run's custom_ami, else what trn1_build_image recorded here; none
        # only where the deployment installs Neuron at boot.
        node_image_parameter=profile.get("node_image_parameter") or None,
        install_neuron_at_boot=profile.get("install_neuron_at_boot") is True,
    )


def create_vpc(profile: dict[str, Any]) -> CreateVpcStackOperator:
    return CreateVpcStackOperator(
        task_id="create_vpc",
        stack_name="{{ vpc_stack_name_for(run_id) }}",
        availability_zone_id="{{ params.availability_zone_id }}",
        existing_network={
            "vpc_id": "{{ params.existing_vpc_id }}",
            "public_subnet_id": "{{ params.existing_public_subnet_id }}",
            "private_subnet_id": "{{ params.existing_private_subnet_id }}",
            "security_group_id": "{{ params.existing_security_group_id }}",
        },
        tags="{{ params.extra_tags }}",
        resource_ttl_hours="{{ params.resource_ttl_hours }}",
        existing_cluster_name=EXISTING_CLUSTER,
        aws_conn_id=AWS_CONN_ID,
        region_name="{{ params.region }}",
        waiter_delay=profile["cluster_poll_interval_s"],
    )


def render_config(profile: dict[str, Any], network: Any) -> RenderClusterConfigOperator:
    return RenderClusterConfigOperator(
        task_id="render_config",
        network=network,
        cluster_name="{{ plan(ti).cluster_name }}",  # the params', or the sweep's shared cluster
        region_name="{{ params.region }}",
        key_name="{{ params.key_name }}",
        image_os="{{ params.image_os }}",
        custom_ami="{{ plan(ti).custom_ami }}",  # the node image preflight checked
        install_neuron_at_boot="{{ plan(ti).install_neuron_at_boot }}",
        log_retention_days="{{ params.log_retention_days }}",
        head_node_instance_type="{{ params.head_node_instance_type }}",
        instance_type="{{ params.instance_type }}",
        min_nodes="{{ plan(ti).min_nodes }}",
        max_nodes="{{ plan(ti).max_nodes }}",
        extra_queues="{{ params.extra_queues }}",
        capacity_type="{{ params.capacity_type }}",
        capacity_reservation_id="{{ params.capacity_reservation_id }}",
        capacity_reservation_resource_group_arn="{{ params.capacity_reservation_resource_group_arn }}",
        ssh_allowed_cidr="{{ plan(ti).ssh_allowed_cidr }}",  # the run's, else the deployment's
        allow_world_ssh="{{ params.allow_world_ssh }}",
        shared_storage_mount_dir="{{ params.shared_storage_mount_dir }}",
        fsx_storage_capacity_gib="{{ params.fsx_storage_capacity_gib }}",
        artifacts_s3_uri="{{ params.artifacts_s3_uri }}",
        extra_tags="{{ params.extra_tags }}",
        resource_ttl_hours="{{ params.resource_ttl_hours }}",
        aws_conn_id=AWS_CONN_ID,
        s3_encryption=profile_sse(profile),
        permissions_boundary_arn=profile.get("permissions_boundary_arn") or None,
        # With a customer managed KMS key: the managed policy that lets the nodes decrypt (run.node_iam).
        node_kms_policy_arn=profile.get("node_kms_policy_arn") or None,
        # `pcluster create-cluster --dryrun true` on the rendered config before it is uploaded.
        pcluster_conn_id=PCLUSTER_CONN_ID,
        existing_cluster_name=EXISTING_CLUSTER,
    )


def pcluster_create(profile: dict[str, Any], cluster_config: Any) -> CreateClusterOperator:
    cap = max_live_nodes(profile)
    return CreateClusterOperator(
        task_id="pcluster_create",
        cluster_config=cluster_config,
        pcluster_conn_id=PCLUSTER_CONN_ID,
        region_name="{{ params.region }}",
        aws_conn_id=AWS_CONN_ID,
        poll_interval=profile["cluster_poll_interval_s"],
        max_live_nodes=cap,
        existing_cluster_name=EXISTING_CLUSTER,
        # Runs after a skipped render_config (an existing cluster) to adopt that cluster. A setup may
        # not skip: Airflow would skip every task between it and its teardowns.
        trigger_rule="none_failed",
        **({"pool": ADMISSION_POOL} if cap else {}),
    )


def delete_cluster(profile: dict[str, Any], results_uri: str) -> DeleteClusterOperator:
    """``results_uri``: where the bill goes beside the results (usage.json)."""
    return DeleteClusterOperator(
        task_id="delete_cluster",
        cluster_name=CLUSTER_NAME,
        pcluster_conn_id=PCLUSTER_CONN_ID,
        region_name="{{ params.region }}",
        poll_interval=profile["cluster_poll_interval_s"],
        # Bills the cluster from EC2 once it is gone.
        aws_conn_id=AWS_CONN_ID,
        results_uri=results_uri,
        fsx_storage_capacity_gib="{{ params.fsx_storage_capacity_gib }}",
        s3_encryption=profile_sse(profile),
        existing_cluster_name=EXISTING_CLUSTER,  # skips: the run never deletes a cluster it did not create
        cluster="{{ ti.xcom_pull(task_ids='pcluster_create') }}",  # this run's: deleted without a describe first
    )


def delete_vpc(profile: dict[str, Any], vpc: Any) -> DeleteVpcStackOperator:
    return DeleteVpcStackOperator(
        task_id="delete_vpc",
        vpc=vpc,
        stack_name="{{ vpc_stack_name_for(run_id) }}",
        # delete_cluster's name, checked gone before the network goes. None (no cluster was ever
        # named) when render_config did not run: CLUSTER_NAME would render Undefined there.
        cluster_name="{{ (ti.xcom_pull(task_ids='render_config') or {}).get('cluster_name') }}",
        cluster_deleted="{{ ti.xcom_pull(task_ids='delete_cluster') }}",  # gone there: not described again
        pcluster_conn_id=PCLUSTER_CONN_ID,
        aws_conn_id=AWS_CONN_ID,
        region_name="{{ params.region }}",
        waiter_delay=profile["cluster_poll_interval_s"],
        existing_cluster_name=EXISTING_CLUSTER,
    )
