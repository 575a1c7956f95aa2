"""render_config: the ParallelCluster v3 YAML from include/cluster/cluster-config.yaml.j2.

Also the pipeline's cross-field checks (JSON Schema cannot compare fields) and the names derived
from a run (cluster, stack, job directory). jinja2, yaml, jsonschema and boto3 are imported inside
methods: the DAG file imports this module at parse time.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from ultracluster.links import ClusterConfigLink
from ultracluster.s3_encryption import check_sse
from ultracluster.s3_uri import split_s3_uri
from ultracluster.tags import DEFAULT_RESOURCE_TTL_HOURS, NODES_TAG, run_tags, s3_tagging

if TYPE_CHECKING:
    from airflow.sdk import Context

TRAINING_QUEUE = "compute1"
MAX_QUEUES = 50  # ParallelCluster's limit on SlurmQueues
# trn1.2xlarge has no EFA interface; the 32xlarge types have 8 (trn1) or 16 (trn1n).
EFA_INSTANCE_TYPES = frozenset({"trn1.32xlarge", "trn1n.32xlarge"})
# pcluster: starts with a letter, letters/digits/hyphens; 40 keeps room for Slurm accounting's limit.
CLUSTER_NAME_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,39}$")
QUEUE_NAME_PATTERN = re.compile(r"^[a-z][a-z0-9-]{0,24}$")
# Compute nodes' storage, as in the seed: a 1024 GiB root volume, the instance store (4 x 1.9 TB NVMe
# on trn1.32xlarge) mounted here for the jobs' scratch (the local_scratch_dir param points there).
COMPUTE_ROOT_VOLUME_GIB = 1024
LOCAL_STORAGE_MOUNT_DIR = "/local_storage"
# CloudWatch Logs retention ParallelCluster accepts (Monitoring.Logs.CloudWatch.RetentionInDays).
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1827, 3653)
AMI_ID_PATTERN = r"^ami-[0-9a-f]{8,17}$"


class ConfigValidationError(ValueError):
    """The pipeline's params or the rendered cluster configuration are invalid."""


# --- names derived from a run ------------------------------------------------------------------

def safe_run_id(run_id: str) -> str:
    """A run id usable in paths and resource names: [a-z0-9-], plus a hash so distinct ids stay distinct."""
    slug = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-") or "run"
    return f"{slug[:48].rstrip('-')}-{hashlib.sha1(run_id.encode()).hexdigest()[:8]}"


def run_artifacts_location(artifacts_s3_uri: str, dag_id: str, run_id: str, *kind: str) -> tuple[str, str]:
    """Bucket and prefix of one run's artifacts: ``<prefix>[/<kind>]/<dag_id>/<safe run id>``."""
    bucket, prefix = split_s3_uri(artifacts_s3_uri)
    return bucket, "/".join(p for p in (prefix.strip("/"), *kind, dag_id, safe_run_id(run_id)) if p)


def cluster_name_for(run_id: str, requested: str | None = None) -> str:
    """The requested cluster name, else one derived from the run id (valid for pcluster, <= 40 chars)."""
    if requested:
        if not CLUSTER_NAME_PATTERN.match(requested):
            raise ConfigValidationError(
                f"cluster_name {requested!r}: must start with a letter, hold only letters, digits and "
                "hyphens, at most 40 characters"
            )
        return requested
    slug = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-")[:27].rstrip("-") or "run"
    return f"uc-{slug}-{hashlib.sha1(run_id.encode()).hexdigest()[:8]}"


def vpc_stack_name_for(run_id: str) -> str:
    return f"uc-vpc-{safe_run_id(run_id)}"


def compute_resource_name(instance_type: str) -> str:
    """trn1.32xlarge -> trn1-32xl (ComputeResources Name: short, no dots)."""
    return instance_type.replace("xlarge", "xl").replace(".", "-")


# --- cross-field checks --------------------------------------------------------------------------

def node_count(value: Any) -> int:
    """A rendered node count (templates render strings) as an int >= 1, or a clear error."""
    try:
        count = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"num_nodes must be an integer, got {value!r}") from None
    if count < 1:
        raise ValueError(f"num_nodes must be >= 1, got {count}")
    return count


def validate_pipeline_params(params: dict[str, Any]) -> None:
    """Rules the params' JSON Schema cannot express; raises one error listing every problem."""
    problems: list[str] = []

    def value(key: str, default: Any = None) -> Any:
        return params.get(key, default)

    num_nodes, min_nodes, max_nodes = value("num_nodes"), value("min_nodes", 0), value("max_nodes")
    if isinstance(num_nodes, int) and isinstance(max_nodes, int) and num_nodes > max_nodes:
        problems.append(f"num_nodes ({num_nodes}) exceeds max_nodes ({max_nodes}), the queue's MaxCount")
    if isinstance(min_nodes, int) and isinstance(max_nodes, int) and min_nodes > max_nodes:
        problems.append(f"min_nodes ({min_nodes}) exceeds max_nodes ({max_nodes})")
    max_steps, steps_this_run = value("max_steps"), value("steps_this_run")
    if isinstance(max_steps, int) and isinstance(steps_this_run, int) and steps_this_run > max_steps:
        problems.append(f"steps_this_run ({steps_this_run}) exceeds max_steps ({max_steps})")
    grad_accum = value("grad_accum_usteps")
    if value("scaling_mode") == "strong" and isinstance(grad_accum, int) and isinstance(num_nodes, int) and num_nodes:
        # The run script divides accumulation by the node count (integer division): keep it exact.
        if grad_accum % num_nodes:
            problems.append(
                f"strong scaling divides grad_accum_usteps ({grad_accum}) by num_nodes ({num_nodes}); "
                "it must divide evenly or the global batch silently changes"
            )
    public, private = value("existing_public_subnet_id"), value("existing_private_subnet_id")
    if bool(public) != bool(private):
        problems.append("existing_public_subnet_id and existing_private_subnet_id go together")
    if (value("existing_vpc_id") or value("existing_security_group_id")) and not (public and private):
        problems.append("reusing an existing VPC needs existing_public_subnet_id and existing_private_subnet_id")
    requested = value("cluster_name")
    if requested and not CLUSTER_NAME_PATTERN.match(requested):
        problems.append(f"cluster_name {requested!r} is not a valid ParallelCluster name")
    extra_queues = value("extra_queues") or []
    names = [TRAINING_QUEUE] + [q.get("name") for q in extra_queues if isinstance(q, dict)]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        problems.append(f"queue names must be unique (compute1 is the training queue): {duplicates}")
    if len(names) > MAX_QUEUES:
        problems.append(f"at most {MAX_QUEUES} queues, got {len(names)}")
    for queue in extra_queues:
        if isinstance(queue, dict) and queue.get("min_nodes", 0) > queue.get("max_nodes", 0):
            problems.append(f"queue {queue.get('name')}: min_nodes exceeds max_nodes")
    for key in ("dataset_s3_uri", "artifacts_s3_uri", "compile_cache_s3_uri"):
        uri = value(key)
        if uri:
            try:
                split_s3_uri(uri)
            except ValueError as err:
                problems.append(f"{key}: {err}")
    if problems:
        raise ConfigValidationError("Invalid run configuration:\n- " + "\n- ".join(problems))


# --- rendering -------------------------------------------------------------------------------------

def _include(*parts: str) -> str:
    from ultracluster.profiles import include_dir

    return str(include_dir().joinpath(*parts))


def build_queues(
    instance_type: str, min_nodes: int, max_nodes: int, extra_queues: list[dict] | None
) -> list[dict]:
    """Template context for Scheduling.SlurmQueues: the training queue first, then extra queues."""
    queues = [{"name": TRAINING_QUEUE, "instance_type": instance_type, "min_nodes": min_nodes, "max_nodes": max_nodes}]
    queues += [dict(q) for q in extra_queues or []]
    for queue in queues:
        queue.setdefault("min_nodes", 0)
        queue["compute_resource"] = compute_resource_name(queue["instance_type"])
        queue["efa"] = queue["instance_type"] in EFA_INSTANCE_TYPES
        # Placement groups pay off (and are supported by ParallelCluster with EFA) on the big types.
        queue["placement_group"] = queue["efa"]
    return queues


def render_cluster_config(template_path: str, context: dict[str, Any]) -> str:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(template_path).parent)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    return env.get_template(Path(template_path).name).render(**context)


def validate_cluster_config(yaml_text: str, schema_path: str) -> dict:
    """Parse the YAML and check it against cluster-config.schema.json plus cross-field rules."""
    import json

    import jsonschema
    import yaml

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
        raise ConfigValidationError("Cluster config failed validation:\n- " + "\n- ".join(problems))
    return document


class RenderClusterConfigOperator(BaseOperator):
    """
    Render, validate and upload the ParallelCluster config; nothing is created on failure. The config
    passes ``pcluster create-cluster --dryrun true`` (``pcluster_conn_id``) before it is uploaded.

    Returns ``{"cluster_name", "config_s3_uri", "config_s3_key", "bucket", "on_node_configured_s3_uri",
    "queues", "training_queue"}``.
    """

    template_fields: Sequence[str] = (
        "network", "cluster_name", "region_name", "key_name", "image_os", "head_node_instance_type", "instance_type",
        "min_nodes", "max_nodes", "extra_queues", "shared_storage_mount_dir", "fsx_storage_capacity_gib",
        "artifacts_s3_uri", "dataset_s3_uri", "compile_cache_s3_uri", "extra_tags",
        "custom_ami", "log_retention_days", "resource_ttl_hours",
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
        dataset_s3_uri: str,
        compile_cache_s3_uri: str | None = None,
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
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
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
        self.dataset_s3_uri = dataset_s3_uri
        self.compile_cache_s3_uri = compile_cache_s3_uri
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
        buckets = {}
        for uri, write in ((self.dataset_s3_uri, False), (self.artifacts_s3_uri, True), (self.compile_cache_s3_uri, True)):
            if uri:
                bucket = split_s3_uri(uri)[0]
                buckets[bucket] = buckets.get(bucket, False) or write
        queues = build_queues(self.instance_type, int(self.min_nodes), int(self.max_nodes), self.extra_queues)
        # The most nodes the cluster can hold: what the deployment's node cap counts (tags.NODES_TAG).
        nodes = sum(int(q["max_nodes"]) for q in queues)
        tags = {**(self.extra_tags or {}), **run_tags(context, self.resource_ttl_hours), NODES_TAG: nodes}
        network = self.network or {}
        return {
            "region": self.region_name,
            "image_os": self.image_os,
            "custom_ami": self.custom_ami or None,  # null or "": ParallelCluster's own AMI
            "log_retention_days": int(self.log_retention_days),
            "compute_root_volume_gib": COMPUTE_ROOT_VOLUME_GIB,
            "ephemeral_mount_dir": LOCAL_STORAGE_MOUNT_DIR,
            "cluster_name": cluster_name_for(context["run_id"], self.cluster_name),
            "head_node_instance_type": self.head_node_instance_type,
            "public_subnet_id": network.get("public_subnet_id"),
            "private_subnet_id": network.get("private_subnet_id"),
            "security_group_id": network.get("security_group_id"),
            "key_name": self.key_name,
            "on_node_configured_s3_uri": on_node_configured_s3_uri,
            "s3_buckets": [{"name": b, "write": w} for b, w in buckets.items()],
            "queues": queues,
            "mount_dir": self.shared_storage_mount_dir,
            "fsx_storage_capacity_gib": int(self.fsx_storage_capacity_gib),
            "tags": [{"key": k, "value": str(v)} for k, v in tags.items()],
        }

    def _dryrun(self, cluster_name: str, rendered: str) -> list[dict]:
        from ultracluster.hooks.parallelcluster import ParallelClusterHook
        from ultracluster.operators._config_dryrun import dryrun_cluster_config

        hook = ParallelClusterHook(self.pcluster_conn_id, region_name=self.region_name or None)
        return dryrun_cluster_config(hook, cluster_name, rendered, suppress_validators=self.suppress_validators,
                                     log=self.log)

    def execute(self, context: Context) -> dict:
        bucket, run_prefix = run_artifacts_location(self.artifacts_s3_uri, context["dag"].dag_id, context["run_id"])
        script_key = f"{run_prefix}/on_node_configured.sh"
        config_key = f"{run_prefix}/cluster-config.yaml"
        template_context = self.build_context(context, f"s3://{bucket}/{script_key}")
        rendered = render_cluster_config(
            self.template_path or _include("cluster", "cluster-config.yaml.j2"), template_context
        )
        validate_cluster_config(rendered, self.schema_path or _include("cluster", "cluster-config.schema.json"))
        self.log.info("Cluster config for %s:\n%s", template_context["cluster_name"], rendered)

        from ultracluster.hooks.artifacts import ArtifactsS3Hook

        s3 = ArtifactsS3Hook(aws_conn_id=self.aws_conn_id, sse=self.s3_encryption)
        from ultracluster.neuron_versions import render_on_node_configured

        # The script is the run's S3 scratch (needed only while the cluster boots nodes): tagged
        # so that the reaper can delete it once the run has ended.
        scratch = ArtifactsS3Hook(aws_conn_id=self.aws_conn_id, sse=self.s3_encryption,
                                  extra_args={"Tagging": s3_tagging(run_tags(context, self.resource_ttl_hours))})
        # Only the script reaches the nodes: it goes up with the pinned Neuron versions rendered in.
        scratch.load_string(
            render_on_node_configured(self.on_node_configured_path or _include("cluster", "on_node_configured.sh")),
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
