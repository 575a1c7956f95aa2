"""The trigger form of trn1_bert_pretrain: every param with its schema, title, section and default.

Defaults come from a deploy-time profile (``ultracluster.run.profiles``). Airflow's trigger form marks a
param required when its schema ``type`` does not include ``"null"``, and disables the Trigger button
while a required field is null or empty. So an optional value is declared ``["null", <type>]`` with a
null default, and the pipeline treats null (or empty) as "off". ``tests/dags/test_param_form.py``
checks every default of every profile the way the form does.

The constants behind the form (instance types, patterns, limits, sections) are ``run.form``'s.
"""
from __future__ import annotations

from typing import Any

from airflow.sdk import Param

from ultracluster.run.form import (
    ABSOLUTE_PATH_PATTERN,
    ADVANCED,
    AMI_ID_PATTERN,
    CAPACITY_RESERVATION_GROUP_ARN_PATTERN,
    CAPACITY_RESERVATION_ID_PATTERN,
    CAPACITY_TYPES,
    CLUSTER,
    CLUSTER_NAME_PATTERN,
    DATA,
    DEFAULT_RESOURCE_TTL_HOURS,
    IMAGE_OS,
    LOCAL_STORAGE_MOUNT_DIR,
    LOG_RETENTION_DAYS,
    MAX_NODES,
    MAX_QUEUES,
    NETWORK,
    QUEUE_NAME_PATTERN,
    SSH_ALLOWED_PATTERN,
    SWEEP,
    TRAINING,
    TRAINING_QUEUE,
    TRN1_INSTANCE_TYPES,
)
from ultracluster.run.lost_nodes import DEFAULT_NODE_REPLACEMENTS, MAX_NODE_REPLACEMENTS
from ultracluster.run.s3 import S3_URI_PATTERN
from ultracluster.run.sweep import SWEEP_SCHEMA


def optional(value: Any) -> Any:
    """A profile's "" (an unset ``${VAR:-}``) is the form's null: off."""
    return None if value == "" else value


# Each param's default is validated when the DAG is built, at every parse: jsonschema first checks the
# schema against its meta-schema, which is about 3x cheaper for draft-07 than for the default 2020-12.
# The params use only keywords both drafts read alike (type, enum, minimum/maximum, pattern, items,
# properties, additionalProperties, propertyNames, required).
SCHEMA_DRAFT = "http://json-schema.org/draft-07/schema#"


class _Schema(dict):
    """A param's schema, shared by the copies Airflow makes of the DAG's params for every task (it
    never changes one): a deep copy of 37 schemas per task was most of the DAG's parse."""

    def __deepcopy__(self, memo: dict) -> _Schema:
        return self


def _param(default: Any, title: str, section: str, description: str, **schema: Any) -> Param:
    return Param(default, description=description, schema=_Schema(title=title, section=section,
                                                                  **{"$schema": SCHEMA_DRAFT}, **schema))


def dag_params(profile: dict[str, Any]) -> dict[str, Param]:
    """Params of trn1_bert_pretrain with ``profile``'s defaults, in form order."""
    p = profile
    return {
        # --- Cluster ---------------------------------------------------------------------------
        "existing_cluster_name": _param(
            None, "Existing cluster", CLUSTER,
            "Optional: run on this ParallelCluster instead of creating one. The run creates no network, "
            "config or cluster, and never deletes, updates or stops this one; preflight checks it is "
            "CREATE_COMPLETE or UPDATE_COMPLETE with the queue, the instance type and 'Training nodes' "
            "nodes. The run is billed from its own Slurm jobs. The cluster-shaping fields below then "
            "do not apply.",
            type=["null", "string"], pattern=CLUSTER_NAME_PATTERN),
        "existing_cluster_queue": _param(
            None, "Existing cluster's queue", CLUSTER,
            f"Optional, with 'Existing cluster': the Slurm queue to train in. Empty: {TRAINING_QUEUE}.",
            type=["null", "string"], pattern=QUEUE_NAME_PATTERN),
        "num_nodes": _param(
            p["num_nodes"], "Training nodes", CLUSTER,
            "Compute nodes the training job runs on (sbatch --nodes). At most 'Max nodes'.",
            type="integer", minimum=1, maximum=MAX_NODES),
        "min_nodes": _param(
            p["min_nodes"], "Min nodes (static)", CLUSTER,
            "Nodes kept running in the training queue for the cluster's whole life (MinCount). "
            "0 = all dynamic: nodes start when the job needs them.",
            type="integer", minimum=0, maximum=MAX_NODES),
        "max_nodes": _param(
            p["max_nodes"], "Max nodes", CLUSTER,
            "Size limit of the training queue (MaxCount). Must be at least 'Training nodes'.",
            type="integer", minimum=1, maximum=MAX_NODES),
        "instance_type": _param(
            p["instance_type"], "Compute instance type", CLUSTER,
            "Trn1 instance type of the training queue. EFA and the placement group are enabled on the "
            "32xlarge types.",
            type="string", enum=list(TRN1_INSTANCE_TYPES)),
        "head_node_instance_type": _param(
            p["head_node_instance_type"], "Head node instance type", CLUSTER,
            "Runs Slurm's controller and the SSH endpoint; it does not train.",
            type="string", pattern=r"^[a-z][a-z0-9-]*\.[a-z0-9]+$"),
        "image_os": _param(
            p["image_os"], "Node OS", CLUSTER,
            "Operating system of every node: the Ubuntu releases ParallelCluster 3.16 accepts (the "
            "blog's ubuntu2004 is refused since 3.14).",
            type="string", enum=list(IMAGE_OS)),
        "key_name": _param(
            p["key_name"], "EC2 key pair", CLUSTER,
            "Key pair of the head node; its private key is in the ultracluster_head_node connection.",
            type="string", minLength=1),
        "custom_ami": _param(
            optional(p["custom_ami"]), "Pre-built image (AMI)", CLUSTER,
            "Optional: the training nodes' image (Image.CustomAmi of the training queue), an AMI the "
            "trn1_build_image DAG built with the pinned Neuron release; preflight refuses one whose Neuron "
            "tags differ. It must match 'Node OS'. Empty: the image the deployment recorded (its "
            "node_image_parameter), else, where the deployment allows it, Neuron installed at every boot.",
            type=["null", "string"], pattern=AMI_ID_PATTERN),
        "capacity_type": _param(
            p["capacity_type"], "Capacity type", CLUSTER,
            "How the training queue gets its instances (CapacityType): ONDEMAND; SPOT (cheaper, may be "
            "interrupted); CAPACITY_BLOCK (an EC2 Capacity Block for ML, prepaid for a fixed window: set "
            "'Capacity reservation' to it and 'Min nodes' = 'Max nodes', static nodes). Extra queues stay ONDEMAND.",
            type="string", enum=list(CAPACITY_TYPES)),
        "capacity_reservation_id": _param(
            None, "Capacity reservation", CLUSTER,
            "Optional: the training queue launches into this reservation (cr-...): an On-Demand Capacity "
            "Reservation (with ONDEMAND) or a Capacity Block (with CAPACITY_BLOCK). preflight checks it is "
            "active or starts in time, reserves the instance type in the AZ, holds 'Max nodes' instances and "
            "lasts past the run's estimated end.",
            type=["null", "string"], pattern=CAPACITY_RESERVATION_ID_PATTERN),
        "capacity_reservation_resource_group_arn": _param(
            None, "Capacity reservation group", CLUSTER,
            "Optional, instead of 'Capacity reservation': the ARN of a resource group of On-Demand Capacity "
            "Reservations (arn:aws:resource-groups:...:group/...); preflight checks its reservations as one.",
            type=["null", "string"], pattern=CAPACITY_RESERVATION_GROUP_ARN_PATTERN),
        "node_replacements": _param(
            DEFAULT_NODE_REPLACEMENTS, "Node replacements", CLUSTER,
            "Times a node may be lost (bootstrap timeout, failed power-up, failed health gate) and "
            "replaced by ParallelCluster; one more loss fails the run, naming the node. 0 = fail at once.",
            type="integer", minimum=0, maximum=MAX_NODE_REPLACEMENTS),
        "log_retention_days": _param(
            p["log_retention_days"], "Log retention (days)", CLUSTER,
            "How long CloudWatch Logs keeps the cluster's logs (Monitoring.Logs.CloudWatch."
            "RetentionInDays); the values ParallelCluster accepts.",
            type="integer", enum=list(LOG_RETENTION_DAYS)),
        "extra_queues": _param(
            p["extra_queues"], "Extra queues", CLUSTER,
            f"Multi-queue clusters: more Slurm queues next to '{TRAINING_QUEUE}', where training always "
            'runs. Example: [{"name": "small", "instance_type": "trn1.2xlarge", "max_nodes": 4}]',
            type="array", maxItems=MAX_QUEUES - 1,
            items={
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "instance_type", "max_nodes"],
                "properties": {
                    "name": {"type": "string", "pattern": QUEUE_NAME_PATTERN},
                    "instance_type": {"type": "string", "enum": list(TRN1_INSTANCE_TYPES)},
                    "min_nodes": {"type": "integer", "minimum": 0},
                    "max_nodes": {"type": "integer", "minimum": 1},
                },
            }),
        # --- Training --------------------------------------------------------------------------
        "scaling_mode": _param(
            p["scaling_mode"], "Scaling mode", TRAINING,
            "strong: the global batch stays fixed (accumulation is divided by the node count); "
            "weak: the global batch grows with the nodes.",
            type="string", enum=["strong", "weak"]),
        "model_size": _param(
            p["model_size"], "Model", TRAINING,
            "large: BERT-Large (the blog's model); tiny: a 4 M-parameter BERT for smoke tests.",
            type="string", enum=["large", "tiny"]),
        "max_steps": _param(
            p["max_steps"], "Total steps", TRAINING,
            "Optimizer steps of the whole pretraining phase (phase 1: 28125); sets the LR schedule.",
            type="integer", minimum=1),
        "steps_this_run": _param(
            p["steps_this_run"], "Steps this run", TRAINING,
            "Optimizer steps this run performs, from step 0 or from the 'Resume from' checkpoint's step, "
            "never past 'Total steps'. A later run continues where this one stopped: set its 'Resume "
            "from' to this run's results (or failed-run) S3 prefix.",
            type="integer", minimum=1),
        "resume_from": _param(
            None, "Resume from", TRAINING,
            "Optional S3 URI of a checkpoint (.../ckpt_<step>.pt) or of a saved run's prefix "
            "(<artifacts>/results/... or <artifacts>/failed/<dag_id>/<run>/: its newest checkpoint). "
            "preflight checks it exists; 'train' resumes from it, keeping its LR schedule and data "
            "position. Empty: start from step 0.",
            type=["null", "string"], pattern=S3_URI_PATTERN),
        "batch_size": _param(
            p["batch_size"], "Micro-batch", TRAINING,
            "Sequences per NeuronCore (per rank) in one forward pass.",
            type="integer", minimum=1),
        "grad_accum_usteps": _param(
            p["grad_accum_usteps"], "Gradient accumulation", TRAINING,
            "Accumulation micro-steps per optimizer step before node scaling; strong scaling needs it "
            "divisible by 'Training nodes'.",
            type="integer", minimum=1),
        "auto_resume_attempts": _param(
            2, "Auto-resume attempts", TRAINING,
            "Times 'train' resumes after a node fault (NODE_FAIL): it waits for the fleet to be healthy "
            "again, then resubmits from the newest checkpoint. 0 = off.",
            type="integer", minimum=0, maximum=20),
        # --- Data ------------------------------------------------------------------------------
        "dataset_s3_uri": _param(
            p["dataset_s3_uri"], "Dataset", DATA,
            "S3 URI of the tokenized dataset tar (HDF5 shards); the head node fetches it through a "
            "presigned URL.",
            type="string", pattern=S3_URI_PATTERN),
        "dataset_anonymous": _param(
            p["dataset_anonymous"], "Public dataset (anonymous)", DATA,
            "Read the dataset without credentials, as `aws s3 cp --no-sign-request` does: for a public "
            "bucket of another account (the seed's neuron-s3), which answers 403 (access denied) to "
            "this account's signed requests. Off: the AWS connection's credentials.",
            type="boolean"),
        "artifacts_s3_uri": _param(
            p["artifacts_s3_uri"], "Artifacts prefix", DATA,
            "S3 prefix for this DAG's artifacts: cluster config, node script, results.",
            type="string", pattern=S3_URI_PATTERN),
        "compile_cache_s3_uri": _param(
            optional(p["compile_cache_s3_uri"]), "Compile cache in S3", DATA,
            "Optional S3 prefix for a copy of the Neuron compile cache. Empty: the cache stays on the "
            "cluster's shared storage only.",
            type=["null", "string"], pattern=S3_URI_PATTERN),
        "shared_storage_mount_dir": _param(
            p["shared_storage_mount_dir"], "Shared storage mount", DATA,
            "Mount point of FSx for Lustre on every node: job directories, the dataset, the compile cache.",
            type="string", pattern=ABSOLUTE_PATH_PATTERN),
        "fsx_storage_capacity_gib": _param(
            p["fsx_storage_capacity_gib"], "FSx capacity (GiB)", DATA,
            "FSx for Lustre capacity, in multiples of 1200 GiB.",
            type="integer", minimum=1200, multipleOf=1200),
        "local_scratch_dir": _param(
            p["local_scratch_dir"], "Node-local scratch", DATA,
            "Where the jobs put compiler work directories and temporary files (TMPDIR) on each compute "
            f"node. Compute nodes mount their NVMe at {LOCAL_STORAGE_MOUNT_DIR}; a node without this "
            "directory keeps its default /tmp. The compile cache stays on shared storage.",
            type="string", pattern=ABSOLUTE_PATH_PATTERN),
        # --- Network ---------------------------------------------------------------------------
        "region": _param(
            p["region"], "Region", NETWORK,
            "AWS region of the network and the cluster.",
            type="string", pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9]$"),
        "availability_zone_id": _param(
            p["availability_zone_id"], "Availability zone id", NETWORK,
            "AZ id (e.g. use1-az6) that offers the instance type; an id names the same zone in every account.",
            type="string", pattern=r"^[a-z0-9]+-az[0-9]+$"),
        "ssh_allowed_cidr": _param(
            None, "SSH allowed from", NETWORK,
            "Optional: who may reach the head node's SSH (HeadNode.Ssh.AllowedIps), a CIDR or a prefix list "
            "(pl-...). Empty: the deployment's, where its Airflow workers connect from. People reach the head "
            "node through SSM Session Manager. A world-open one (0.0.0.0/0, or none at all) is refused unless "
            "'Allow SSH from anywhere' is set.",
            type=["null", "string"], pattern=SSH_ALLOWED_PATTERN),
        "allow_world_ssh": _param(
            False, "Allow SSH from anywhere", NETWORK,
            "Let the head node's SSH be open to the whole internet (0.0.0.0/0, or an empty 'SSH allowed "
            "from'). Off: preflight refuses a world-open SSH.",
            type="boolean"),
        "existing_vpc_id": _param(
            None, "Existing VPC", NETWORK,
            "Optional: reuse this VPC and the two subnets below instead of creating a network. "
            "This DAG never deletes it.",
            type=["null", "string"], pattern=r"^vpc-[0-9a-z]+$"),
        "existing_public_subnet_id": _param(
            None, "Existing public subnet", NETWORK,
            "Optional: public subnet of the existing VPC, for the head node.",
            type=["null", "string"], pattern=r"^subnet-[0-9a-z]+$"),
        "existing_private_subnet_id": _param(
            None, "Existing private subnet", NETWORK,
            "Optional: private subnet of the existing VPC, for the compute nodes (same AZ as the public one).",
            type=["null", "string"], pattern=r"^subnet-[0-9a-z]+$"),
        "existing_security_group_id": _param(
            None, "Extra security group", NETWORK,
            "Optional: another security group for the nodes when reusing a network.",
            type=["null", "string"], pattern=r"^sg-[0-9a-z]+$"),
        # --- Sweep and cost ---------------------------------------------------------------------
        "sweep": _param(
            None, "Scaling sweep", SWEEP,
            "Optional: this run is one point of a scaling sweep; the point sets the node count, and "
            "the scaling report groups runs by id. In a backfill each logical date picks its point. "
            'Example: {"id": "s1", "num_nodes": [1, 2, 4], "scaling_mode": "weak"}; '
            'one run of it: add "point": {"num_nodes": 2}. "cluster": "shared" trains every point on '
            "the sweep's one cluster, made by trn1_sweep_cluster (trigger it first, with the same sweep).",
            **SWEEP_SCHEMA),
        "max_cost_usd": _param(
            None, "Cost limit (USD)", SWEEP,
            "Optional: fail before anything is created when the run's cost estimate exceeds this.",
            type=["null", "number"], minimum=0),
        # --- Advanced --------------------------------------------------------------------------
        "cluster_name": _param(
            None, "Cluster name", ADVANCED,
            "Optional: the ParallelCluster name. Empty: derived from the run id. A cluster of another "
            "run is never adopted.",
            type=["null", "string"], pattern=CLUSTER_NAME_PATTERN),
        "training_python": _param(
            p["training_python"], "Training Python", ADVANCED,
            "Python interpreter of the training environment on the compute nodes.",
            type="string", minLength=1),
        "extra_job_env": _param(
            p["extra_job_env"], "Extra job environment", ADVANCED,
            "More environment variables for the compile and training jobs; they never override the "
            'pipeline\'s own. Example: {"NEURON_CC_FLAGS": "--retry_failed_compilation"}',
            type="object", additionalProperties={"type": "string"},
            propertyNames={"pattern": r"^[A-Z_][A-Z0-9_]*$"}),
        "resource_ttl_hours": _param(
            DEFAULT_RESOURCE_TTL_HOURS, "Resource time to live (hours)", ADVANCED,
            "The run's network stack, cluster and S3 scratch are tagged to expire this long after the run "
            "starts. The reaper deletes expired ones only when their run cannot be found (its record is "
            "deleted, or another Airflow made them); a live run's resources are never reaped. A week by "
            "default: longer than any run, and than a sweep's shared network is held (at most 72 h).",
            type="integer", minimum=1, maximum=24 * 90),
        "extra_tags": _param(
            p["extra_tags"], "Extra tags", ADVANCED,
            "More AWS tags on the network stack and the cluster (the DAG adds its id and the run id). "
            'Example: {"team": "ml-infra", "cost-center": "1234"}',
            type="object", additionalProperties={"type": "string"}),
    }
