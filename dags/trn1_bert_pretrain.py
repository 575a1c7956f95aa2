"""BERT-Large pretraining on an AWS Trn1 UltraCluster, from network to results, torn down afterwards.

create_vpc -> render_config -> pcluster_create -> wait_for_fleet -> download_data -> parallel_compile
-> train -> collect_results -> delete_cluster (teardown of pcluster_create) -> delete_vpc (teardown of
create_vpc).

Param defaults come from the deploy-time profile include/profiles/$ULTRACLUSTER_PROFILE.json
(production by default; ``local`` for the local UltraCluster). Nothing here depends on the profile:
only connections and configuration differ between real AWS and the local cluster.

Parse cost: only the Airflow SDK and ultracluster's light modules are imported here; boto3, yaml,
jinja2 rendering, paramiko/asyncssh load inside tasks.
"""
from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Asset, Param

from ultracluster.operators.config import (
    TRAINING_QUEUE,
    RenderClusterConfigOperator,
    cluster_name_for,
    safe_run_id,
    vpc_stack_name_for,
)
from ultracluster.operators.dataset import DownloadDatasetOperator
from ultracluster.operators.pcluster import CreateClusterOperator, DeleteClusterOperator
from ultracluster.operators.results import CollectResultsOperator
from ultracluster.operators.slurm import SlurmJobOperator
from ultracluster.operators.vpc import CreateVpcStackOperator, DeleteVpcStackOperator
from ultracluster.profiles import include_dir, load_profile
from ultracluster.sensors.fleet import ComputeFleetSensor

DAG_ID = "trn1_bert_pretrain"
PROFILE = load_profile()

AWS_CONN_ID = "aws_default"
PCLUSTER_CONN_ID = "pcluster_default"
SSH_CONN_ID = "ultracluster_head_node"

TRN1_INSTANCE_TYPES = ["trn1.32xlarge", "trn1n.32xlarge", "trn1.2xlarge"]
S3_URI_PATTERN = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$"

PARAMS = {
    "num_nodes": Param(PROFILE["num_nodes"], type="integer", minimum=1, maximum=256,
                       description="Compute nodes the training job uses (sbatch --nodes). At most max_nodes."),
    "min_nodes": Param(PROFILE["min_nodes"], type="integer", minimum=0, maximum=256,
                       description="Static nodes kept running in the training queue (MinCount). 0 = all dynamic."),
    "max_nodes": Param(PROFILE["max_nodes"], type="integer", minimum=1, maximum=256,
                       description="Size limit of the training queue (MaxCount). Must be at least num_nodes."),
    "instance_type": Param(PROFILE["instance_type"], type="string", enum=TRN1_INSTANCE_TYPES,
                           description="Compute instance type. EFA and the placement group are enabled on the 32xlarge types."),
    "head_node_instance_type": Param(PROFILE["head_node_instance_type"], type="string",
                                     pattern=r"^[a-z][a-z0-9-]*\.[a-z0-9]+$",
                                     description="Head node instance type (runs Slurm's controller and the ssh endpoint)."),
    "image_os": Param(PROFILE["image_os"], type="string", enum=["ubuntu2204", "ubuntu2404", "ubuntu2004"],
                      description="Node OS. ubuntu2004 is the blog-era image; ParallelCluster 3.16 accepts only 22.04/24.04."),
    "scaling_mode": Param(PROFILE["scaling_mode"], type="string", enum=["strong", "weak"],
                          description="strong: fixed global batch (accumulation divided by num_nodes); weak: batch grows with nodes."),
    "model_size": Param(PROFILE["model_size"], type="string", enum=["large", "tiny"],
                        description="BERT-Large, or a tiny BERT for smoke tests."),
    "max_steps": Param(PROFILE["max_steps"], type="integer", minimum=1,
                       description="Total optimizer steps of the full pretraining (phase 1: 28125)."),
    "steps_this_run": Param(PROFILE["steps_this_run"], type="integer", minimum=1,
                            description="Steps this run performs (<= max_steps); later runs can resume."),
    "batch_size": Param(PROFILE["batch_size"], type="integer", minimum=1,
                        description="Per-NeuronCore micro-batch size."),
    "grad_accum_usteps": Param(PROFILE["grad_accum_usteps"], type="integer", minimum=1,
                               description="Gradient accumulation micro-steps before node scaling; strong scaling needs it divisible by num_nodes."),
    "training_python": Param(PROFILE["training_python"], type="string", minLength=1,
                             description="Python interpreter of the training environment on the compute nodes."),
    "region": Param(PROFILE["region"], type="string", pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9]$",
                    description="AWS region of the network and the cluster."),
    "availability_zone_id": Param(PROFILE["availability_zone_id"], type="string", pattern=r"^[a-z0-9]+-az[0-9]+$",
                                  description="AZ id (e.g. use1-az6) offering the instance type; ids mean the same AZ in every account."),
    "key_name": Param(PROFILE["key_name"], type="string", minLength=1,
                      description="EC2 key pair for the head node; its private key is in the ultracluster_head_node connection."),
    "existing_vpc_id": Param(None, type=["null", "string"], pattern=r"^vpc-[0-9a-z]+$",
                             description="Optional: reuse this VPC (with the two subnets below) instead of creating one. Never deleted by this DAG."),
    "existing_public_subnet_id": Param(None, type=["null", "string"], pattern=r"^subnet-[0-9a-z]+$",
                                       description="Optional: existing public subnet for the head node (requires existing_private_subnet_id)."),
    "existing_private_subnet_id": Param(None, type=["null", "string"], pattern=r"^subnet-[0-9a-z]+$",
                                        description="Optional: existing private subnet for compute nodes, same AZ as the public one."),
    "existing_security_group_id": Param(None, type=["null", "string"], pattern=r"^sg-[0-9a-z]+$",
                                        description="Optional: extra security group for the nodes when reusing a network."),
    "dataset_s3_uri": Param(PROFILE["dataset_s3_uri"], type="string", pattern=S3_URI_PATTERN,
                            description="Tokenized dataset tar (hdf5 shards); the head node fetches it with a presigned URL."),
    "artifacts_s3_uri": Param(PROFILE["artifacts_s3_uri"], type="string", pattern=S3_URI_PATTERN,
                              description="Prefix for this DAG's artifacts: cluster config, node script, results."),
    "compile_cache_s3_uri": Param(PROFILE["compile_cache_s3_uri"], type="string", pattern=r"^(s3://.+)?$",
                                  description="Optional S3 copy of the Neuron compile cache (empty: shared storage only)."),
    "shared_storage_mount_dir": Param(PROFILE["shared_storage_mount_dir"], type="string", pattern=r"^/[A-Za-z0-9_./-]+$",
                                      description="FSx for Lustre mount point shared by all nodes (job dirs, data, compile cache)."),
    "fsx_storage_capacity_gib": Param(PROFILE["fsx_storage_capacity_gib"], type="integer", minimum=1200, multipleOf=1200,
                                      description="FSx for Lustre capacity in GiB (multiples of 1200)."),
    "extra_queues": Param(
        PROFILE["extra_queues"], type="array", maxItems=49,
        items={
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "instance_type", "max_nodes"],
            "properties": {
                "name": {"type": "string", "pattern": r"^[a-z][a-z0-9-]{0,24}$"},
                "instance_type": {"type": "string", "enum": TRN1_INSTANCE_TYPES},
                "min_nodes": {"type": "integer", "minimum": 0},
                "max_nodes": {"type": "integer", "minimum": 1},
            },
        },
        description=f"Multi-queue clusters: more Slurm queues next to '{TRAINING_QUEUE}' (training always runs there). "
                    'Example: [{"name": "small", "instance_type": "trn1.2xlarge", "max_nodes": 4}].',
    ),
    "extra_job_env": Param(PROFILE["extra_job_env"], type="object", additionalProperties={"type": "string"},
                           propertyNames={"pattern": r"^[A-Z_][A-Z0-9_]*$"},
                           description="More environment variables for the compile and training jobs "
                                       "(e.g. TORCH_NUM_THREADS, NEURON_CC_FLAGS). They never override the pipeline's own."),
    "cluster_name": Param(None, type=["null", "string"], pattern=r"^[A-Za-z][A-Za-z0-9-]{0,39}$",
                          description="Optional cluster name; default derived from the run id. A cluster of another run is never adopted."),
    "extra_tags": Param(PROFILE["extra_tags"], type="object", additionalProperties={"type": "string"},
                        description="Extra tags on the network stack and the cluster (the DAG adds dag id and run id)."),
}

# Derived paths on shared storage (docs/contracts.md).
JOB_DIR = "{{ params.shared_storage_mount_dir }}/ultracluster/{{ dag.dag_id }}/{{ safe_run_id(run_id) }}"
DATA_ROOT = "{{ params.shared_storage_mount_dir }}/examples_datasets"
COMPILE_CACHE_DIR = "{{ params.shared_storage_mount_dir }}/neuron-compile-cache"
CLUSTER_NAME = "{{ ti.xcom_pull(task_ids='render_config')['cluster_name'] }}"

JOB_ENV = {
    "SCALING_MODE": "{{ params.scaling_mode }}",
    "MAX_STEPS": "{{ params.max_steps }}",
    "STEPS_THIS_RUN": "{{ params.steps_this_run }}",
    "BATCH_SIZE": "{{ params.batch_size }}",
    "GRAD_ACCUM_USTEPS": "{{ params.grad_accum_usteps }}",
    "DATA_DIR": "{{ ti.xcom_pull(task_ids='download_data')['data_dir'] }}",
    "OUTPUT_ROOT": JOB_DIR,
    "COMPILE_CACHE_DIR": COMPILE_CACHE_DIR,
    "MODEL_SIZE": "{{ params.model_size }}",
    "TRAINING_PYTHON": "{{ params.training_python }}",
}

# Named, without a URI: any URI with a scheme makes Airflow load every provider's URI normaliser
# (the amazon one imports boto3) at parse time. Each run's S3 location is in collect_results' XCom.
RESULTS_ASSET = Asset(name=f"{DAG_ID}_results")

with DAG(
    dag_id=DAG_ID,
    description="BERT-Large pretraining on a Trn1 UltraCluster (ParallelCluster + Slurm), torn down afterwards",
    # Weekly so backfills can sweep node counts; paused on creation so nobody pays for a surprise run.
    # No start_date: with one, unpausing starts a run for the latest past week at once (catchup=False
    # still schedules the most recent tick); without, the first scheduled run is the next tick.
    schedule="@weekly",
    catchup=False,
    is_paused_upon_creation=True,
    # Each run owns a whole cluster: a couple at a time is what quotas and budgets allow.
    max_active_runs=2,
    params=PARAMS,
    render_template_as_native_obj=True,
    user_defined_macros={
        "safe_run_id": safe_run_id,
        "cluster_name_for": cluster_name_for,
        "vpc_stack_name_for": vpc_stack_name_for,
    },
    default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
    tags=["ultracluster", "trn1", "bert"],
    doc_md=__doc__,
) as dag:
    create_vpc = CreateVpcStackOperator(
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
        aws_conn_id=AWS_CONN_ID,
        region_name="{{ params.region }}",
        waiter_delay=PROFILE["cluster_poll_interval_s"],
    )

    render_config = RenderClusterConfigOperator(
        task_id="render_config",
        network=create_vpc.output,
        cluster_name="{{ params.cluster_name }}",
        region_name="{{ params.region }}",
        key_name="{{ params.key_name }}",
        image_os="{{ params.image_os }}",
        head_node_instance_type="{{ params.head_node_instance_type }}",
        instance_type="{{ params.instance_type }}",
        min_nodes="{{ params.min_nodes }}",
        max_nodes="{{ params.max_nodes }}",
        extra_queues="{{ params.extra_queues }}",
        shared_storage_mount_dir="{{ params.shared_storage_mount_dir }}",
        fsx_storage_capacity_gib="{{ params.fsx_storage_capacity_gib }}",
        artifacts_s3_uri="{{ params.artifacts_s3_uri }}",
        dataset_s3_uri="{{ params.dataset_s3_uri }}",
        compile_cache_s3_uri="{{ params.compile_cache_s3_uri }}",
        extra_tags="{{ params.extra_tags }}",
        aws_conn_id=AWS_CONN_ID,
    )

    pcluster_create = CreateClusterOperator(
        task_id="pcluster_create",
        cluster_config=render_config.output,
        pcluster_conn_id=PCLUSTER_CONN_ID,
        region_name="{{ params.region }}",
        aws_conn_id=AWS_CONN_ID,
        poll_interval=PROFILE["cluster_poll_interval_s"],
    )

    wait_for_fleet = ComputeFleetSensor(
        task_id="wait_for_fleet",
        cluster_name=CLUSTER_NAME,
        num_nodes="{{ params.num_nodes }}",
        partition=TRAINING_QUEUE,
        region_name="{{ params.region }}",
        pcluster_conn_id=PCLUSTER_CONN_ID,
        ssh_conn_id=SSH_CONN_ID,
        poke_interval=PROFILE["fleet_poke_interval_s"],
        timeout=PROFILE["fleet_timeout_s"],
    )

    download_data = DownloadDatasetOperator(
        task_id="download_data",
        head_node=wait_for_fleet.output,
        dataset_s3_uri="{{ params.dataset_s3_uri }}",
        data_dir=DATA_ROOT,
        aws_conn_id=AWS_CONN_ID,
        ssh_conn_id=SSH_CONN_ID,
    )

    # Compile and train are the same Slurm job, run under neuron_parallel_compile or not.
    same_slurm_job = dict(
        head_node=wait_for_fleet.output,
        job_dir=JOB_DIR,
        num_nodes="{{ params.num_nodes }}",
        job_env=JOB_ENV,
        extra_job_env="{{ params.extra_job_env }}",
        training_files_dir=str(include_dir() / "training"),
        ssh_conn_id=SSH_CONN_ID,
        poll_interval=PROFILE["job_poll_interval_s"],
        partition=TRAINING_QUEUE,
    )
    parallel_compile = SlurmJobOperator(
        task_id="parallel_compile",
        launcher="neuron_parallel_compile",
        job_name="{{ dag.dag_id }}-compile",
        **same_slurm_job,
    )
    train = SlurmJobOperator(
        task_id="train",
        launcher=None,
        job_name="{{ dag.dag_id }}-train",
        **same_slurm_job,
    )

    collect_results = CollectResultsOperator(
        task_id="collect_results",
        head_node=wait_for_fleet.output,
        train=train.output,
        artifacts_s3_uri="{{ params.artifacts_s3_uri }}",  # + results/<dag_id>/<run_id>/
        aws_conn_id=AWS_CONN_ID,
        ssh_conn_id=SSH_CONN_ID,
        outlets=[RESULTS_ASSET],
    )

    delete_cluster = DeleteClusterOperator(
        task_id="delete_cluster",
        cluster_name=CLUSTER_NAME,
        pcluster_conn_id=PCLUSTER_CONN_ID,
        region_name="{{ params.region }}",
        poll_interval=PROFILE["cluster_poll_interval_s"],
    )

    delete_vpc = DeleteVpcStackOperator(
        task_id="delete_vpc",
        vpc=create_vpc.output,
        stack_name="{{ vpc_stack_name_for(run_id) }}",
        # delete_cluster's name, checked gone before the network goes. None (no cluster was ever
        # named) when render_config did not run: CLUSTER_NAME would render Undefined there.
        cluster_name="{{ (ti.xcom_pull(task_ids='render_config') or {}).get('cluster_name') }}",
        pcluster_conn_id=PCLUSTER_CONN_ID,
        aws_conn_id=AWS_CONN_ID,
        region_name="{{ params.region }}",
        waiter_delay=PROFILE["cluster_poll_interval_s"],
    )

    (
        create_vpc
        >> render_config
        >> pcluster_create
        >> wait_for_fleet
        >> download_data
        >> parallel_compile
        >> train
        >> collect_results
        >> delete_cluster.as_teardown(setups=pcluster_create)
        # A failed delete_vpc (leftover NAT gateway, or a cluster still holding the VPC) fails the run.
        # Only on the last teardown: Airflow then judges the run by collect_results AND delete_vpc;
        # the flag on delete_cluster would hide collect_results from the run state.
        >> delete_vpc.as_teardown(setups=create_vpc, on_failure_fail_dagrun=True)
    )
