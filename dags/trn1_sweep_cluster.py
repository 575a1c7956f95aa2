"""One cluster for all the points of a scaling sweep, sized to its largest point, deleted after the last one.

preflight -> create_vpc -> render_config -> pcluster_create -> hold_cluster -> delete_cluster (teardown
of pcluster_create) -> delete_vpc (teardown of create_vpc). The cluster tasks are trn1_bert_pretrain's
own (ultracluster.cluster_tasks names each one's operator); preflight plans a cluster, not training
(``trains=False``: ``run.shared_cluster.holder_plan``).

A sweep with ``"cluster": "shared"`` (``ultracluster sweep --cluster shared``) trains every point on
this cluster: each point's plan names it (``uc-sweep-<sweep id>``) as ``existing_cluster_name``, so a
point creates and deletes nothing, waits while other points hold the nodes, and is billed from its
own Slurm jobs. ``hold_cluster`` waits (deferred once) until the sweep index lists every point on the
cluster and all have ended; then the teardowns delete it and bill it (its bill goes to
``<artifacts>/sweeps/<pipeline>/<sweep id>/shared-cluster/usage.json``, the report's shared overhead).
Marking hold_cluster success (the client does when the points cannot start) deletes it at once
(docs/operations.md, "A sweep on one cluster").

Parse cost: as trn1_bert_pretrain's (the same modules).
"""
from __future__ import annotations

import airflow.providers.amazon.aws.operators.base_aws  # noqa: F401 - pre-imported by the DAG processor
from airflow.sdk import DAG, Param

from ultracluster import cluster_tasks as tasks
from ultracluster.operators.scaling_report import DEFAULT_SOURCE_DAG_ID
from ultracluster.operators.sweep_network import SweepNetworkHoldOperator
from ultracluster.params import dag_params
from ultracluster.run.profiles import load_profile
from ultracluster.run.shared_cluster import HOLDER_DAG_ID, USAGE_FOLDER

DAG_ID = HOLDER_DAG_ID
PROFILE = load_profile()
# The pipeline's params: the cluster is made as a point's would be, with the sweep's largest point.
PARAMS = {
    **dag_params(PROFILE),
    "max_hold_hours": Param(
        72, type="number", exclusiveMinimum=0, title="Hold at most (hours)",
        description="Stop waiting for the points after this long; the cluster is then deleted."),
    "source_dag_id": Param(
        DEFAULT_SOURCE_DAG_ID, type="string", pattern=r"^[A-Za-z0-9_.-]+$", title="Pipeline DAG",
        description="The DAG the points run in (its sweep index tells which runs use the cluster)."),
}
SWEEP_FOLDER = ("{{ params.artifacts_s3_uri.rstrip('/') }}/sweeps/{{ params.source_dag_id }}/"
                "{{ params.sweep.id }}/" + USAGE_FOLDER + "/")

with DAG(
    dag_id=DAG_ID,
    description="A scaling sweep's shared cluster: created for its largest point, held while its points run, deleted",
    schedule=None,
    is_paused_upon_creation=False,
    params=PARAMS,
    render_template_as_native_obj=True,
    user_defined_macros=tasks.MACROS,
    tags=["ultracluster", "trn1", "sweep"],
    doc_md=__doc__,
) as dag:
    preflight = tasks.preflight(PROFILE, trains=False)
    create_vpc = tasks.create_vpc(PROFILE)
    render_config = tasks.render_config(PROFILE, create_vpc.output)
    pcluster_create = tasks.pcluster_create(PROFILE, render_config.output)
    hold_cluster = SweepNetworkHoldOperator(
        task_id="hold_cluster",
        network=create_vpc.output,
        cluster_name="{{ ti.xcom_pull(task_ids='render_config')['cluster_name'] }}",
        sweep_id="{{ params.sweep.id }}",
        points="{{ params.sweep.num_nodes | length }}",
        source_dag_id="{{ params.source_dag_id }}",
        artifacts_s3_uri="{{ params.artifacts_s3_uri }}",
        max_hold_hours="{{ params.max_hold_hours }}",
        aws_conn_id=tasks.AWS_CONN_ID,
        # Each look runs in the triggerer; the task defers once.
        poll_interval=5 * PROFILE["cluster_poll_interval_s"],
    )
    delete_cluster = tasks.delete_cluster(PROFILE, SWEEP_FOLDER)
    delete_vpc = tasks.delete_vpc(PROFILE, create_vpc.output)
    (
        preflight
        >> create_vpc
        >> render_config
        >> pcluster_create
        >> hold_cluster
        >> delete_cluster.as_teardown(setups=pcluster_create)
        >> delete_vpc.as_teardown(setups=create_vpc, on_failure_fail_dagrun=True)
    )
