"""One network for all the points of a scaling sweep, deleted after the last one has ended.

create_vpc -> hold_network -> delete_vpc (teardown of create_vpc).

Each point of a sweep gets its own cluster, but the default regional quotas allow 5 VPCs and 5
Elastic IPs: a 5-point sweep with a network per point would stop at the quota. ``ultracluster sweep``
triggers this DAG first, then passes its network to every point as the ``existing_*`` params; the
points adopt it and leave it alone. ``hold_network`` waits (deferred) until the sweep index lists
``points`` runs on this VPC and all have ended; then the network is deleted (docs/operations.md,
Scaling sweeps).

Parse cost: airflow.sdk, the amazon base operator (pre-imported, as in trn1_bert_pretrain) and
stdlib-only ultracluster modules.
"""
from __future__ import annotations

import airflow.providers.amazon.aws.operators.base_aws  # noqa: F401 - pre-imported by the DAG processor
from airflow.sdk import DAG, Param

from ultracluster.operators.scaling_report import DEFAULT_SOURCE_DAG_ID
from ultracluster.operators.sweep_network import SweepNetworkHoldOperator
from ultracluster.operators.vpc import CreateVpcStackOperator, DeleteVpcStackOperator
from ultracluster.params import dag_params
from ultracluster.run.names import safe_run_id
from ultracluster.run.profiles import load_profile
from ultracluster.run.sweep import SWEEP_ID_PATTERN

DAG_ID = "trn1_sweep_network"
PROFILE = load_profile()
AWS_CONN_ID = "aws_default"
PIPELINE_PARAMS = dag_params(PROFILE)
# Not uc-vpc-<run>: a pipeline run and this DAG's run may share a run id.
STACK_NAME = "uc-net-{{ params.sweep_id }}-{{ safe_run_id(run_id) }}"

PARAMS = {
    "sweep_id": Param(
        "sweep", type="string", pattern=SWEEP_ID_PATTERN, title="Sweep id",
        description="The sweep whose points use this network (the 'id' of the pipeline's sweep param)."),
    "points": Param(
        1, type="integer", minimum=1, maximum=64, title="Points",
        description="How many runs of the sweep use the network: it is held until that many have ended."),
    "max_hold_hours": Param(
        72, type="number", exclusiveMinimum=0, title="Hold at most (hours)",
        description="Stop waiting for the points after this long; delete_vpc then fails while a cluster "
                    "still uses the network."),
    "source_dag_id": Param(
        DEFAULT_SOURCE_DAG_ID, type="string", pattern=r"^[A-Za-z0-9_.-]+$", title="Pipeline DAG",
        description="The DAG the points run in (its sweep index tells which runs use the network)."),
    **{key: PIPELINE_PARAMS[key] for key in ("region", "availability_zone_id", "artifacts_s3_uri", "extra_tags",
                                             "resource_ttl_hours")},
}

with DAG(
    dag_id=DAG_ID,
    description="A scaling sweep's shared network: created, held while its points run, deleted",
    schedule=None,
    is_paused_upon_creation=False,
    params=PARAMS,
    render_template_as_native_obj=True,
    user_defined_macros={"safe_run_id": safe_run_id},
    tags=["ultracluster", "trn1", "sweep"],
    doc_md=__doc__,
) as dag:
    create_vpc = CreateVpcStackOperator(
        task_id="create_vpc",
        stack_name=STACK_NAME,
        availability_zone_id="{{ params.availability_zone_id }}",
        tags="{{ params.extra_tags }}",
        resource_ttl_hours="{{ params.resource_ttl_hours }}",
        aws_conn_id=AWS_CONN_ID,
        region_name="{{ params.region }}",
        waiter_delay=PROFILE["cluster_poll_interval_s"],
    )
    hold_network = SweepNetworkHoldOperator(
        task_id="hold_network",
        network=create_vpc.output,
        sweep_id="{{ params.sweep_id }}",
        points="{{ params.points }}",
        source_dag_id="{{ params.source_dag_id }}",
        artifacts_s3_uri="{{ params.artifacts_s3_uri }}",
        max_hold_hours="{{ params.max_hold_hours }}",
        aws_conn_id=AWS_CONN_ID,
        # Each look resumes the task in a worker: slower than the cluster waits, which run in the triggerer.
        poll_interval=5 * PROFILE["cluster_poll_interval_s"],
    )
    delete_vpc = DeleteVpcStackOperator(
        task_id="delete_vpc",
        vpc=create_vpc.output,
        stack_name=STACK_NAME,
        aws_conn_id=AWS_CONN_ID,
        region_name="{{ params.region }}",
        waiter_delay=PROFILE["cluster_poll_interval_s"],
    )
    create_vpc >> hold_network >> delete_vpc.as_teardown(setups=create_vpc, on_failure_fail_dagrun=True)
