"""BERT-Large pretraining on an AWS Trn1 UltraCluster, from network to results, torn down afterwards.

preflight -> create_vpc -> render_config -> pcluster_create -> wait_for_fleet -> download_data -> parallel_compile
-> train -> collect_results -> save_failure_artifacts -> delete_cluster (both teardowns of pcluster_create)
-> delete_vpc (teardown of create_vpc). Beside the chain: restore_compile_cache before parallel_compile,
restore_checkpoint (``resume_from``) before train, save_compile_cache after it. Each task's operator is
imported below by name: its module is the step's code; the cluster tasks (preflight, create_vpc,
render_config, pcluster_create, delete_cluster, delete_vpc), which trn1_sweep_cluster shares, are built
in ultracluster.cluster_tasks, which names theirs.

With ``existing_cluster_name`` the run uses a cluster it did not create: create_vpc and pcluster_create
adopt it (creating nothing), render_config, delete_cluster and delete_vpc skip, and nothing the run does
deletes, updates or stops that cluster (ultracluster.run.existing_cluster).

Param defaults come from the deploy-time profile include/profiles/$ULTRACLUSTER_PROFILE.json
(production by default; ``local`` for the local UltraCluster). Nothing here depends on the profile:
only connections and configuration differ between real AWS and the local cluster.

Parse cost: the package imports normally; only paramiko, asyncssh, matplotlib and torch stay out of
the parse (docs/architecture.md, "Imports"). The Airflow modules below are pre-imported by the DAG
processor's parent, once; the parse takes at most 3x a bare DAG of as many tasks (bench/dag_parse.py).
"""
from __future__ import annotations

from datetime import timedelta

# Pre-imported once by the DAG processor's parent (parsing_pre_import_modules), so no parse pays for
# them: the Airflow modules the parse loads that airflow.sdk does not, each measured worth >= 0.5 ms
# of every parse (bench/dag_parse.py); the amazon hooks bring boto3 (~0.4 s).
import airflow.providers.amazon.aws.hooks.ec2  # noqa: F401
import airflow.providers.amazon.aws.hooks.s3  # noqa: F401
import airflow.providers.amazon.aws.operators.base_aws  # noqa: F401
import airflow.providers.amazon.aws.triggers.base  # noqa: F401
import airflow.providers.standard.triggers.temporal  # noqa: F401
import airflow.sdk.bases.operatorlink  # noqa: F401
import airflow.sdk.bases.sensor  # noqa: F401
import airflow.sdk.definitions.timetables.trigger  # noqa: F401
import airflow.timetables.base  # noqa: F401
from airflow.sdk import DAG, Asset

from ultracluster import cluster_tasks as tasks
from ultracluster.cluster_tasks import AWS_CONN_ID, CLUSTER_NAME, EXISTING_CLUSTER, PCLUSTER_CONN_ID, SSH_CONN_ID
from ultracluster.notifications import run_failed
from ultracluster.operators.checkpoint import RestoreCheckpointOperator
from ultracluster.operators.compile_cache import CompileCacheOperator
from ultracluster.operators.dataset import DownloadDatasetOperator
from ultracluster.operators.failure_artifacts import SaveFailureArtifactsOperator
from ultracluster.operators.results import CollectResultsOperator
from ultracluster.operators.retry_policy import DeniedCallsFail
from ultracluster.operators.slurm import SlurmJobOperator
from ultracluster.params import dag_params
from ultracluster.run.profiles import include_dir, load_profile
from ultracluster.run.s3 import profile_sse
from ultracluster.run.shared_cluster import HELD_NODES_TIMEOUT_S
from ultracluster.sensors.fleet import ComputeFleetSensor

DAG_ID = "trn1_bert_pretrain"
PROFILE = load_profile()

PARAMS = dag_params(PROFILE)
# Server-side encryption of every object the pipeline writes to S3 (docs/operations.md, "Encryption").
S3_ENCRYPTION = profile_sse(PROFILE)

# Derived paths on shared storage (docs/contracts.md).
JOB_DIR = "{{ params.shared_storage_mount_dir }}/ultracluster/{{ dag.dag_id }}/{{ safe_run_id(run_id) }}"
DATA_ROOT = "{{ params.shared_storage_mount_dir }}/examples_datasets"
COMPILE_CACHE_DIR = "{{ params.shared_storage_mount_dir }}/neuron-compile-cache"
# The Slurm partition of every job: the existing cluster's queue (existing_cluster_queue), else compute1.
TRAINING_QUEUE = "{{ plan(ti).training_queue }}"

JOB_ENV = {
    "SCALING_MODE": "{{ plan(ti).scaling_mode }}",
    "MAX_STEPS": "{{ params.max_steps }}",
    "STEPS_THIS_RUN": "{{ params.steps_this_run }}",
    "BATCH_SIZE": "{{ params.batch_size }}",
    "GRAD_ACCUM_USTEPS": "{{ params.grad_accum_usteps }}",
    "DATA_DIR": "{{ ti.xcom_pull(task_ids='download_data')['data_dir'] }}",
    "OUTPUT_ROOT": JOB_DIR,
    "COMPILE_CACHE_DIR": COMPILE_CACHE_DIR,
    # Compiler work dirs and temporary files on the node's NVMe when it has it (else /tmp).
    "LOCAL_SCRATCH_DIR": "{{ params.local_scratch_dir }}",
    "MODEL_SIZE": "{{ params.model_size }}",
    "TRAINING_PYTHON": "{{ params.training_python }}",
    "SWEEP_POINT": "{{ plan(ti).sweep_point }}",  # JSON in the job's environment; into results.json
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
    schedule="@weekly",  # ticks cluster_tasks.SCHEDULE_PERIOD apart: a backfilled sweep's points follow them
    catchup=False,
    is_paused_upon_creation=True,
    # Each run owns a whole cluster: a couple at a time is what quotas and budgets allow.
    max_active_runs=2,
    params=PARAMS,
    render_template_as_native_obj=True,
    user_defined_macros=tasks.MACROS,
    # A call AWS denies fails its task at once: a retry meets the same policy (docs/operations.md).
    default_args={"retries": 2, "retry_delay": timedelta(minutes=1), "retry_policy": DeniedCallsFail()},
    # Mail/Slack through the ultracluster_* connections, if any (docs/operations.md, "Notifications").
    on_failure_callback=run_failed,
    tags=["ultracluster", "trn1", "bert"],
    doc_md=__doc__,
) as dag:
    preflight = tasks.preflight(PROFILE)
    create_vpc = tasks.create_vpc(PROFILE)
    render_config = tasks.render_config(PROFILE, create_vpc.output)
    pcluster_create = tasks.pcluster_create(PROFILE, render_config.output)

    wait_for_fleet = ComputeFleetSensor(
        task_id="wait_for_fleet",
        cluster_name=CLUSTER_NAME,
        num_nodes="{{ plan(ti).num_nodes }}",
        partition=TRAINING_QUEUE,
        region_name="{{ params.region }}",
        pcluster_conn_id=PCLUSTER_CONN_ID,
        ssh_conn_id=SSH_CONN_ID,
        poke_interval=PROFILE["fleet_poke_interval_s"],
        timeout=PROFILE["fleet_timeout_s"],
        node_replacements="{{ params.node_replacements }}",
        # On a cluster the run did not create (a sweep's shared one), nodes other jobs hold are waited
        # for, this long at most, instead of failing the wait.
        existing_cluster_name=EXISTING_CLUSTER,
        held_nodes_timeout=HELD_NODES_TIMEOUT_S,
        cluster=pcluster_create.output,  # its first look judges what pcluster_create just described
    )

    download_data = DownloadDatasetOperator(
        task_id="download_data",
        head_node=wait_for_fleet.output,
        dataset_s3_uri="{{ params.dataset_s3_uri }}",
        anonymous="{{ params.dataset_anonymous }}",
        data_dir=DATA_ROOT,
        aws_conn_id=AWS_CONN_ID,
        ssh_conn_id=SSH_CONN_ID,
    )

    # The compile cache outlives the cluster in S3 (compile_cache_s3_uri; null: not kept), keyed by
    # what determines the graphs.
    compile_cache = dict(
        head_node=wait_for_fleet.output,
        compile_cache_s3_uri="{{ params.compile_cache_s3_uri }}",
        cache_dir=COMPILE_CACHE_DIR,
        cache_facts={
            "model_size": "{{ params.model_size }}",
            "micro_batch": "{{ params.batch_size }}",
            "procs_per_node": "{{ (params.extra_job_env or {}).get('NPROC_PER_NODE', '') }}",
            "instance_type": "{{ params.instance_type }}",
            "training_python": "{{ params.training_python }}",
        },
        aws_conn_id=AWS_CONN_ID,
        ssh_conn_id=SSH_CONN_ID,
        s3_encryption=S3_ENCRYPTION,
    )
    restore_compile_cache = CompileCacheOperator(task_id="restore_compile_cache", action="restore", **compile_cache)
    save_compile_cache = CompileCacheOperator(task_id="save_compile_cache", action="save", **compile_cache)

    # resume_from's checkpoint onto shared storage for train (null: nothing to do). Hidden directory:
    # save_failure_artifacts does not copy back what is already in S3.
    restore_checkpoint = RestoreCheckpointOperator(
        task_id="restore_checkpoint",
        head_node=wait_for_fleet.output,
        resume_from="{{ params.resume_from }}",
        destination_dir=JOB_DIR + "/.resume",
        aws_conn_id=AWS_CONN_ID,
        ssh_conn_id=SSH_CONN_ID,
    )

    # Compile and train are the same Slurm job, run under neuron_parallel_compile or not.
    same_slurm_job = dict(
        head_node=wait_for_fleet.output,
        job_dir=JOB_DIR,
        num_nodes="{{ plan(ti).num_nodes }}",
        job_env=JOB_ENV,
        extra_job_env="{{ params.extra_job_env }}",
        training_files_dir=str(include_dir() / "training"),
        ssh_conn_id=SSH_CONN_ID,
        poll_interval=PROFILE["job_poll_interval_s"],
        progress_log_interval_s=PROFILE["progress_log_interval_s"],
        progress_log_every_steps=PROFILE["progress_log_every_steps"],
        partition=TRAINING_QUEUE,
        # Where an auto-resume's fleet wait looks for the cluster (train's; parallel_compile has none).
        pcluster_conn_id=PCLUSTER_CONN_ID,
        region_name="{{ params.region }}",
    )
    parallel_compile = SlurmJobOperator(
        task_id="parallel_compile",
        launcher="neuron_parallel_compile",
        # Without the launcher the job fails (UC_ERROR); only the local profile opts into compile-only.
        launcher_fallback_env={"COMPILE_ONLY": "1"} if PROFILE.get("compile_without_launcher") is True else None,
        job_name="{{ dag.dag_id }}-compile",
        # No auto-resume (a compile has no checkpoint), but a job EC2 had no capacity for is submitted
        # again as the lost-node rule allows (docs/operations.md, "Capacity faults").
        node_replacements="{{ params.node_replacements }}",
        **same_slurm_job,
    )
    train = SlurmJobOperator(
        task_id="train",
        launcher=None,
        # Cancel the job once its progress projects the run past max_cost_usd (null: no guard).
        budget={
            "max_usd": "{{ params.max_cost_usd }}",
            "usd_per_hour": "{{ ti.xcom_pull(task_ids='preflight')['estimate']['usd_per_hour'] }}",
            # From the cluster's creation; on an existing cluster, from the fleet's readiness.
            "since": "{{ ti.xcom_pull(task_ids='pcluster_create')['created_at'] "
                     "or ti.xcom_pull(task_ids='wait_for_fleet')['ready_at'] }}",
        },
        job_name="{{ dag.dag_id }}-train",
        # After a node fault: wait for the fleet, resubmit from the newest checkpoint (docs/operations.md).
        auto_resume_attempts="{{ params.auto_resume_attempts }}",
        node_replacements="{{ params.node_replacements }}",
        # First on every node: Neuron and EFA devices as the instance type has them; a failing node is
        # drained and the job resubmitted like after a node fault (docs/operations.md, "Node health gate").
        health_gate="{{ params.instance_type }}",
        **{**same_slurm_job, "job_env": {
            **JOB_ENV,
            # How parallel_compile ran (launcher or compile-only): into results.json.
            "COMPILE_LAUNCH": "{{ ti.xcom_pull(task_ids='parallel_compile').get('launch') }}",
            # The checkpoint train resumes from (resume_from); empty: none.
            "RESUME_CKPT": "{{ ti.xcom_pull(task_ids='restore_checkpoint').get('path') }}",
        }},
    )

    collect_results = CollectResultsOperator(
        task_id="collect_results",
        head_node=wait_for_fleet.output,
        train=train.output,
        artifacts_s3_uri="{{ params.artifacts_s3_uri }}",  # + results/<dag_id>/<safe run id>/
        aws_conn_id=AWS_CONN_ID,
        s3_encryption=S3_ENCRYPTION,
        ssh_conn_id=SSH_CONN_ID,
        # On an existing cluster the run is billed here, from its own Slurm jobs (delete_cluster skips).
        billing={
            "existing_cluster_name": EXISTING_CLUSTER,
            "instance_type": "{{ params.instance_type }}",
            "num_nodes": "{{ plan(ti).num_nodes }}",
            "jobs": ["{{ ti.xcom_pull(task_ids='parallel_compile') }}", "{{ ti.xcom_pull(task_ids='train') }}"],
        },
        outlets=[RESULTS_ASSET],
    )

    # A failed or cancelled run's checkpoints and logs go to S3 before the cluster's storage does.
    # A teardown: it runs whatever failed, and after "mark failed"; delete_cluster runs after it anyway.
    save_failure_artifacts = SaveFailureArtifactsOperator(
        task_id="save_failure_artifacts",
        head_node="{{ ti.xcom_pull(task_ids='wait_for_fleet') }}",
        job_dir=JOB_DIR,
        artifacts_s3_uri="{{ params.artifacts_s3_uri }}",  # + failed/<dag_id>/<safe run id>/
        collected="{{ ti.xcom_pull(task_ids='collect_results') }}",
        aws_conn_id=AWS_CONN_ID,
        s3_encryption=S3_ENCRYPTION,
        ssh_conn_id=SSH_CONN_ID,
        retries=1,  # each retry keeps the cluster up a little longer
    )

    # Bills the run from EC2 once its cluster is gone, beside the collected results.
    delete_cluster = tasks.delete_cluster(
        PROFILE, "{{ (ti.xcom_pull(task_ids='collect_results') or {}).get('artifacts_uri') }}")
    delete_vpc = tasks.delete_vpc(PROFILE, create_vpc.output)

    (
        preflight
        >> create_vpc
        >> render_config
        >> pcluster_create
        >> wait_for_fleet
        >> download_data
        >> parallel_compile
        >> train
        >> collect_results
        >> save_failure_artifacts.as_teardown(setups=pcluster_create)
        >> delete_cluster.as_teardown(setups=pcluster_create)
        # A failed delete_vpc (leftover NAT gateway, or a cluster still holding the VPC) fails the run.
        # Only on the last teardown: Airflow then judges the run by collect_results AND delete_vpc;
        # the flag on delete_cluster would hide collect_results from the run state.
        >> delete_vpc.as_teardown(setups=create_vpc, on_failure_fail_dagrun=True)
    )
    wait_for_fleet >> restore_compile_cache >> parallel_compile
    wait_for_fleet >> restore_checkpoint >> train
    train >> save_compile_cache >> save_failure_artifacts >> delete_cluster
