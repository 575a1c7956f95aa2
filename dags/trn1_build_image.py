"""The Trn1 node image: the pinned Neuron stack built into an AMI, recorded for trn1_bert_pretrain.

build_image -> record_image -> delete_superseded.

``pcluster build-image`` of include/cluster/image-config.yaml with the node set-up script
(include/cluster/on_node_configured.sh, the versions of include/neuron-versions.env rendered in) as
its component, waited for deferrably; the AMI is tagged with the Neuron release, the pins' digest and
the repository's commit. Its id then goes into the SSM parameter the profile names
(``node_image_parameter``), where trn1_bert_pretrain's preflight finds it. With ``delete_superseded``,
the images built for that parameter before are deleted (docs/operations.md, "The node image").

Trigger it after changing include/neuron-versions.env or the node script: preflight refuses an image
whose Neuron tags differ from the pins. Re-triggering the same commit finds the image it built.

Parse cost: airflow.sdk, the modules trn1_bert_pretrain loads anyway; yaml and boto3 load in the tasks.
"""
from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param

from ultracluster.operators.node_image import BuildNodeImageOperator
from ultracluster.operators.node_image_records import DeleteSupersededImagesOperator, RecordNodeImageOperator
from ultracluster.params import dag_params
from ultracluster.run.form import AMI_ID_PATTERN
from ultracluster.run.node_image import DAG_ID
from ultracluster.run.profiles import load_profile
from ultracluster.run.s3 import profile_sse

PROFILE = load_profile()
AWS_CONN_ID = "aws_default"
PCLUSTER_CONN_ID = "pcluster_default"
PIPELINE_PARAMS = dag_params(PROFILE)
BUILT = "{{ ti.xcom_pull(task_ids='build_image') }}"

PARAMS = {
    "delete_superseded": Param(
        False, type="boolean", title="Delete superseded images",
        description="After recording the new image, delete the images built for the same parameter before it "
                    "(pcluster delete-image; one still used by a cluster's nodes is kept, and the run fails "
                    "naming it)."),
    "parent_image": Param(
        None, type=["null", "string"], pattern=AMI_ID_PATTERN, title="Parent image (AMI)",
        description="The AMI to build on. Empty: ParallelCluster's official AMI of 'Node OS' "
                    "(pcluster list-official-images)."),
    **{key: PIPELINE_PARAMS[key] for key in ("image_os", "region", "artifacts_s3_uri")},
}

with DAG(
    dag_id=DAG_ID,
    description="The Trn1 node image: the pinned Neuron stack in an AMI, recorded for the pipeline's nodes",
    schedule=None,
    # A build runs a trn1.2xlarge for most of an hour: only when someone asks.
    is_paused_upon_creation=False,
    max_active_runs=1,
    params=PARAMS,
    render_template_as_native_obj=True,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
    tags=["ultracluster", "trn1", "image"],
    doc_md=__doc__,
) as dag:
    build_image = BuildNodeImageOperator(
        task_id="build_image",
        parameter=PROFILE["node_image_parameter"],
        region_name="{{ params.region }}",
        image_os="{{ params.image_os }}",
        parent_image="{{ params.parent_image }}",
        artifacts_s3_uri="{{ params.artifacts_s3_uri }}",
        permissions_boundary_arn=PROFILE.get("permissions_boundary_arn") or None,
        cleanup_role_arn=PROFILE.get("image_cleanup_role_arn") or None,
        aws_conn_id=AWS_CONN_ID,
        pcluster_conn_id=PCLUSTER_CONN_ID,
        s3_encryption=profile_sse(PROFILE),
        poll_interval=PROFILE["cluster_poll_interval_s"],
    )
    record_image = RecordNodeImageOperator(
        task_id="record_image", image=BUILT, region_name="{{ params.region }}", aws_conn_id=AWS_CONN_ID)
    delete_superseded = DeleteSupersededImagesOperator(
        task_id="delete_superseded", image=BUILT, delete="{{ params.delete_superseded }}",
        region_name="{{ params.region }}", aws_conn_id=AWS_CONN_ID, pcluster_conn_id=PCLUSTER_CONN_ID,
        poll_interval=PROFILE["cluster_poll_interval_s"])
    build_image >> record_image >> delete_superseded
