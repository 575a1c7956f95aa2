"""render_config: the ParallelCluster v3 YAML from include/cluster/cluster-config.yaml.j2.

Rendered, checked against include/cluster/cluster-config.schema.json and the cross-field rules,
then put through ``pcluster create-cluster --dryrun true`` before it is uploaded: ParallelCluster's
own validators (schema, subnets, instance types, key pair, AMI, the S3 objects the config names, FSx,
EFA, placement group) with nothing created. The dry run needs the run's subnets, so it runs here,
after create_vpc, not in preflight. A refused config fails the task at once (the same config fails
again on every retry), each validator message logged; throttling or a failed AWS call retries.
"""
from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import yaml
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from ultracluster.hooks.artifacts import ArtifactsS3Hook
from ultracluster.hooks.parallelcluster import ParallelClusterHook
from ultracluster.links import ClusterConfigLink
from ultracluster.operators.existing_cluster import step_on_existing_cluster
from ultracluster.parsers.pcluster import (
    ClusterAlreadyExistsError,
    ClusterValidationError,
    PclusterError,
    config_refused,
)
from ultracluster.run.form import (
    COMPUTE_ROOT_VOLUME_GIB,
    DEFAULT_RESOURCE_TTL_HOURS,
    EFA_INSTANCE_TYPES,
    LOCAL_STORAGE_MOUNT_DIR,
    TRAINING_QUEUE,
)
from ultracluster.run import capacity as run_capacity
from ultracluster.run import existing_cluster as byo
from ultracluster.run.names import cluster_name_for, compute_resource_name, run_artifacts_location
from ultracluster.run.neuron_versions import render_on_node_configured
from ultracluster.run import node_iam
from ultracluster.run.errors import ConfigValidationError, problem_list
from ultracluster.run.profiles import include_dir
from ultracluster.run.s3 import check_sse
from ultracluster.run.ssh_access import allowed_ips, flag
from ultracluster.run.tags import NODES_TAG, run_tags, s3_tagging

if TYPE_CHECKING:
    from airflow.sdk import Context


def _include(*parts: str) -> str:
    return str(include_dir().joinpath(*parts))


def build_queues(
    instance_type: str, min_nodes: int, max_nodes: int, extra_queues: list[dict] | None,
    capacity: Mapping[str, Any] | None = None, custom_ami: str | None = None,
) -> list[dict]:
    """Template context for Scheduling.SlurmQueues: the training queue first, then extra queues.
    ``capacity``: the training queue's ``capacity_type`` and reservation params (run.capacity); extra
    queues are On-Demand. ``custom_ami``: the training queue's node image (Image.CustomAmi); the other
    queues and the head node keep ParallelCluster's own image."""
    training = {"name": TRAINING_QUEUE, "instance_type": instance_type, "min_nodes": min_nodes, "max_nodes": max_nodes,
                "capacity_type": run_capacity.capacity_type(capacity or {}),
                "reservation": run_capacity.reservation_target(capacity or {}), "custom_ami": custom_ami or None}
    queues = [training] + [dict(q) for q in extra_queues or []]
    for queue in queues:
        queue.setdefault("custom_ami", None)
        queue.setdefault("min_nodes", 0)
        queue.setdefault("capacity_type", run_capacity.ONDEMAND)
        queue.setdefault("reservation", None)
        queue["compute_resource"] = compute_resource_name(queue["instance_type"])
        queue["efa"] = queue["instance_type"] in EFA_INSTANCE_TYPES
        # Placement groups pay off (and are supported by ParallelCluster with EFA) on the big types.
        queue["placement_group"] = run_capacity.placement_group(queue["efa"], queue["capacity_type"],
                                                                queue["reservation"])
    return queues


def render_cluster_config(template_path: str, context: dict[str, Any]) -> str:
    import jinja2  # heavy: never at parse time (docs/architecture.md, "Imports")

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(template_path).parent)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    return env.get_template(Path(template_path).name).render(**context)


def validate_cluster_config(yaml_text: str, schema_path: str) -> dict:
    """Parse the YAML and check it against cluster-config.schema.json plus cross-field rules."""
    try:
        document = yaml.safe_load(yaml_text)
    except yaml.YAMLError as err:
        raise ConfigValidationError(f"Rendered cluster config is not valid YAML: {err}") from err
    schema = json.loads(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    problems = [f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}" for e in errors]
    for queue in (document or {}).get("Scheduling", {}).get("SlurmQueues", []) or []:
        for resource in queue.get("ComputeResources", []) or []:
            if resource.get("MinCount", 0) > resource.get("MaxCount", 0):
                problems.append(f"queue {queue.get('Name')}/{resource.get('Name')}: MinCount > MaxCount")
            if resource.get("Efa", {}).get("Enabled") and resource.get("InstanceType") not in EFA_INSTANCE_TYPES:
                problems.append(f"queue {queue.get('Name')}: {resource.get('InstanceType')} has no EFA")
    if problems:
        raise ConfigValidationError(problem_list("Cluster config failed validation", problems))
    return document


def dryrun_cluster_config(
    hook: ParallelClusterHook,
    cluster_name: str,
    config_text: str,
    *,
    suppress_validators: list[str] | None,
    log: Any,
) -> list[dict]:
    """Dry-run ``config_text``; returns pcluster's validationMessages (warnings, infos) when it passes."""
    with tempfile.TemporaryDirectory(prefix="uc-dryrun-") as directory:
        path = Path(directory) / "cluster-config.yaml"
        path.write_text(config_text)
        try:
            result = hook.create_cluster(cluster_name, str(path), suppress_validators=suppress_validators, dryrun=True)
        except ClusterAlreadyExistsError:
            # A cleared or re-run render_config after pcluster_create: pcluster refuses any create of an
            # existing name, dry or not. Its config was checked when it was created; pcluster_create
            # reattaches only to a cluster of this run.
            log.warning("Cluster %s exists already: the dry run is skipped (pcluster_create checks its owner)",
                        cluster_name)
            return []
        except PclusterError as err:
            if not config_refused(err):
                raise
            errors = err.configuration_validation_errors if isinstance(err, ClusterValidationError) else []
            for entry in errors:
                log.error("pcluster dry run: %s %s: %s", entry.get("level"), entry.get("type"), entry.get("message"))
            raise AirflowFailException(
                f"pcluster create-cluster --dryrun true refused the cluster config of {cluster_name}: {err}"
            ) from err
    messages = list(result.get("validationMessages") or [])
    for entry in messages:
        log.info("pcluster dry run: %s %s: %s", entry.get("level"), entry.get("type"), entry.get("message"))
    log.info("pcluster dry run passed: %s", result.get("message", ""))
    return messages


class RenderClusterConfigOperator(BaseOperator):
    """
    Render, validate and upload the ParallelCluster config; nothing is created on failure. The config
    passes ``pcluster create-cluster --dryrun true`` (``pcluster_conn_id``) before it is uploaded.

    ``custom_ami`` is the training queue's node image (preflight's plan: the run's, else the profile's
    node_image_parameter); ``install_neuron_at_boot`` renders the node script's opt-in.

    Returns ``{"cluster_name", "config_s3_uri", "config_s3_key", "bucket", "on_node_configured_s3_uri",
    "queues", "training_queue"}``. Skips when the run uses an existing cluster (``existing_cluster_name``).
    """

    template_fields: Sequence[str] = (
        "network", "cluster_name", "region_name", "key_name", "image_os", "head_node_instance_type", "instance_type",
        "min_nodes", "max_nodes", "extra_queues", "shared_storage_mount_dir", "fsx_storage_capacity_gib",
        "artifacts_s3_uri", "extra_tags",
        "custom_ami", "log_retention_days", "resource_ttl_hours", "capacity_type", "capacity_reservation_id",
        "capacity_reservation_resource_group_arn", "ssh_allowed_cidr", "allow_world_ssh", "existing_cluster_name",
        "install_neuron_at_boot",
    )
    operator_extra_links = (ClusterConfigLink(),)
    ui_color = "#d9e8f5"

    def __init__(
        self,
        *,
        network: dict,
        cluster_name: str | None,
        region_name: str,
        key_name: str,
        head_node_instance_type: str,
        instance_type: str,
        min_nodes: int,
        max_nodes: int,
        artifacts_s3_uri: str,
        extra_queues: list[dict] | None = None,
        shared_storage_mount_dir: str = "/fsx",
        fsx_storage_capacity_gib: int = 1200,
        extra_tags: dict[str, str] | None = None,
        image_os: str = "ubuntu2204",
        custom_ami: str | None = None,
        log_retention_days: int = 14,
        template_path: str | None = None,
        schema_path: str | None = None,
        on_node_configured_path: str | None = None,
        aws_conn_id: str | None = "aws_default",
        pcluster_conn_id: str | None = "pcluster_default",
        suppress_validators: list[str] | None = None,
        resource_ttl_hours: Any = DEFAULT_RESOURCE_TTL_HOURS,
        s3_encryption: Mapping[str, str] | None = None,
        capacity_type: str = run_capacity.ONDEMAND,
        capacity_reservation_id: str | None = None,
        capacity_reservation_resource_group_arn: str | None = None,
        ssh_allowed_cidr: str | None = None,
        allow_world_ssh: Any = False,
        permissions_boundary_arn: str | None = None,
        node_kms_policy_arn: str | None = None,
        existing_cluster_name: str | None = None,
        install_neuron_at_boot: Any = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.existing_cluster_name = existing_cluster_name
        self.install_neuron_at_boot = install_neuron_at_boot  # the profile's opt-in, through the plan
        # The training queue's capacity (run.capacity) and who may reach the head node's SSH
        # (run.ssh_access: no value is refused unless allow_world_ssh).
        self.capacity_type = capacity_type
        self.capacity_reservation_id = capacity_reservation_id
        self.capacity_reservation_resource_group_arn = capacity_reservation_resource_group_arn
        self.ssh_allowed_cidr = ssh_allowed_cidr
        self.allow_world_ssh = allow_world_ssh
        # Iam.PermissionsBoundary of every role pcluster creates (docs/operations.md, "Least privilege").
        self.permissions_boundary_arn = permissions_boundary_arn or None
        # The node roles' kms:Decrypt with a customer managed key (run.node_iam).
        self.node_kms_policy_arn = node_kms_policy_arn or None
        self.s3_encryption = check_sse(s3_encryption)  # both uploads (docs/operations.md, "Encryption")
        self.resource_ttl_hours = resource_ttl_hours  # the cluster's and the script's expires-at
        self.network = network
        self.cluster_name = cluster_name
        self.region_name = region_name
        self.key_name = key_name
        self.head_node_instance_type = head_node_instance_type
        self.instance_type = instance_type
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.artifacts_s3_uri = artifacts_s3_uri
        self.extra_queues = extra_queues
        self.shared_storage_mount_dir = shared_storage_mount_dir
        self.fsx_storage_capacity_gib = fsx_storage_capacity_gib
        self.extra_tags = extra_tags
        self.image_os = image_os
        self.custom_ami = custom_ami
        self.log_retention_days = log_retention_days
        self.template_path = template_path
        self.schema_path = schema_path
        self.on_node_configured_path = on_node_configured_path
        self.aws_conn_id = aws_conn_id
        self.pcluster_conn_id = pcluster_conn_id  # None: no dry run (tests of the rendering alone)
        self.suppress_validators = suppress_validators  # as pcluster_create's, so both judge alike

    def build_context(self, context: Context, on_node_configured_s3_uri: str) -> dict[str, Any]:
        capacity = {"capacity_type": self.capacity_type or None, "capacity_reservation_id": self.capacity_reservation_id
                    or None, "capacity_reservation_resource_group_arn": self.capacity_reservation_resource_group_arn
                    or None, "min_nodes": int(self.min_nodes), "max_nodes": int(self.max_nodes)}
        problems = run_capacity.plan_capacity_problems(capacity)
        problems += node_iam.iam_problems(self.s3_encryption, self.node_kms_policy_arn, self.permissions_boundary_arn)
        try:
            ssh_allowed_ips = allowed_ips(self.ssh_allowed_cidr, flag(self.allow_world_ssh))
        except ValueError as err:
            problems.append(str(err))
        if problems:   # preflight refuses these first; a direct use of the operator must not render them
            raise ConfigValidationError(problem_list("Cluster config not rendered", problems))
        queues = build_queues(self.instance_type, int(self.min_nodes), int(self.max_nodes), self.extra_queues, capacity,
                              self.custom_ami)
        # The most nodes the cluster can hold: what the deployment's node cap counts (tags.NODES_TAG).
        nodes = sum(int(q["max_nodes"]) for q in queues)
        tags = {**(self.extra_tags or {}), **run_tags(context, self.resource_ttl_hours), NODES_TAG: nodes}
        network = self.network or {}
        policies = node_iam.additional_policies(self.region_name, self.s3_encryption, self.node_kms_policy_arn)
        return {
            "region": self.region_name,
            "image_os": self.image_os,
            "log_retention_days": int(self.log_retention_days),
            "compute_root_volume_gib": COMPUTE_ROOT_VOLUME_GIB,
            "ephemeral_mount_dir": LOCAL_STORAGE_MOUNT_DIR,
            "cluster_name": cluster_name_for(context["run_id"], self.cluster_name),
            "head_node_instance_type": self.head_node_instance_type,
            "public_subnet_id": network.get("public_subnet_id"),
            "private_subnet_id": network.get("private_subnet_id"),
            "security_group_id": network.get("security_group_id"),
            "key_name": self.key_name,
            "ssh_allowed_ips": ssh_allowed_ips,
            "on_node_configured_s3_uri": on_node_configured_s3_uri,
            # The nodes read the run's prefix (its node script) and nothing else of S3 (run.node_iam).
            "s3_access": node_iam.s3_access(on_node_configured_s3_uri),
            "head_node_policies": policies["head_node"],
            "compute_policies": policies["compute"],
            "queues": queues,
            "mount_dir": self.shared_storage_mount_dir,
            "fsx_storage_capacity_gib": int(self.fsx_storage_capacity_gib),
            "tags": [{"key": k, "value": str(v)} for k, v in tags.items()],
            "permissions_boundary": self.permissions_boundary_arn,
        }

    def _dryrun(self, cluster_name: str, rendered: str) -> list[dict]:
        hook = ParallelClusterHook(self.pcluster_conn_id, region_name=self.region_name or None)
        return dryrun_cluster_config(hook, cluster_name, rendered, suppress_validators=self.suppress_validators,
                                     log=self.log)

    def execute(self, context: Context) -> dict:
        step_on_existing_cluster(self, byo.CONFIG)
        bucket, run_prefix = run_artifacts_location(self.artifacts_s3_uri, context["dag"].dag_id, context["run_id"])
        script_key = f"{run_prefix}/on_node_configured.sh"
        config_key = f"{run_prefix}/cluster-config.yaml"
        template_context = self.build_context(context, f"s3://{bucket}/{script_key}")
        rendered = render_cluster_config(
            self.template_path or _include("cluster", "cluster-config.yaml.j2"), template_context
        )
        validate_cluster_config(rendered, self.schema_path or _include("cluster", "cluster-config.schema.json"))
        self.log.info("Cluster config for %s:\n%s", template_context["cluster_name"], rendered)
        s3 = ArtifactsS3Hook(aws_conn_id=self.aws_conn_id, sse=self.s3_encryption)
        # The script is the run's S3 scratch (needed only while the cluster boots nodes): tagged
        # so that the reaper can delete it once the run has ended.
        scratch = ArtifactsS3Hook(aws_conn_id=self.aws_conn_id, sse=self.s3_encryption,
                                  extra_args={"Tagging": s3_tagging(run_tags(context, self.resource_ttl_hours))})
        # Only the script reaches the nodes: it goes up with the pinned Neuron versions rendered in.
        scratch.load_string(
            render_on_node_configured(self.on_node_configured_path or _include("cluster", "on_node_configured.sh"),
                                      install_at_boot=flag(self.install_neuron_at_boot)),
            key=script_key, bucket_name=bucket, replace=True,
        )
        if self.pcluster_conn_id:
            # After the script's upload: pcluster checks that the S3 objects the config names exist.
            self._dryrun(template_context["cluster_name"], rendered)
        s3.load_string(rendered, key=config_key, bucket_name=bucket, replace=True)
        ClusterConfigLink.persist(context=context, region_name=self.region_name, bucket=bucket, key=config_key)
        return {
            "cluster_name": template_context["cluster_name"],
            "bucket": bucket,
            "config_s3_key": config_key,
            "config_s3_uri": f"s3://{bucket}/{config_key}",
            "on_node_configured_s3_uri": f"s3://{bucket}/{script_key}",
            "queues": [q["name"] for q in template_context["queues"]],
            "training_queue": TRAINING_QUEUE,
            "nodes": sum(int(q["max_nodes"]) for q in template_context["queues"]),
        }
