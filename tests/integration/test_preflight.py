"""preflight: the run's plan, the cross-field rules, the cost estimate and the sweep index (moto S3)."""
from __future__ import annotations

import json
from datetime import timedelta
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException

from tests.integration.test_dataset import aws_conn, empty_bucket, moto_endpoint  # noqa: F401 - fixtures
from ultracluster.hooks.artifacts import ArtifactsS3Hook
from ultracluster.operators import preflight
from ultracluster.operators.preflight import PreflightOperator
from ultracluster.run.profiles import load_profile
from ultracluster.run.sweep import ORIGIN, on_held, read_index

WEEK = timedelta(days=7)
RUN_ID = "backfill__2026-11-15T00:00:00+00:00"
SWEEP = {"id": "s1", "num_nodes": [1, 2, 3], "scaling_mode": "weak"}


@pytest.fixture
def s3(aws_conn, moto_endpoint):
    """The local profile's account: its dataset object and key pair (the account checks look)."""
    import boto3

    empty_bucket(aws_conn, "ultracluster-artifacts")
    bucket, key = load_profile("local")["dataset_s3_uri"].removeprefix("s3://").split("/", 1)
    aws_conn.put_object(Bucket=bucket, Key=key, Body=b"tar")
    ec2 = boto3.client("ec2", endpoint_url=moto_endpoint, region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    if not ec2.describe_key_pairs(Filters=[{"Name": "key-name", "Values": ["ultracluster-local"]}])["KeyPairs"]:
        ec2.create_key_pair(KeyName="ultracluster-local")
    return aws_conn


def run(params: dict, *, weeks: int | None = 0, run_id: str = RUN_ID, max_cost_usd=None,
        estimate_boot_time: bool = False, install_neuron_at_boot: bool = True,
        node_image_parameter: str | None = None, **deployment) -> dict:
    """preflight as the local profile runs it (installs at boot; no node image parameter unless given)."""
    deployment.setdefault("require_permissions_boundary", False)  # the local profile's
    op = PreflightOperator(task_id="preflight", schedule_period=WEEK, max_cost_usd=max_cost_usd,
                           artifacts_s3_uri="s3://ultracluster-artifacts/runs", aws_conn_id="uc_test_aws",
                           estimate_boot_time=estimate_boot_time,
                           default_ssh_allowed_cidr=load_profile("local")["head_node_ssh_cidr"],
                           install_neuron_at_boot=install_neuron_at_boot, node_image_parameter=node_image_parameter,
                           **deployment)
    context = {"params": params, "run_id": run_id, "dag": SimpleNamespace(dag_id="trn1_bert_pretrain"),
               "logical_date": None if weeks is None else ORIGIN + weeks * WEEK}
    return op.execute(context)


def local(**changes) -> dict:
    return {**load_profile("local"), "sweep": None, "max_cost_usd": None, **changes}


def test_a_plain_run_plans_its_params_and_estimates_the_cost(s3):
    result = run(local())
    assert result["plan"]["num_nodes"] == 2 and result["plan"]["sweep_point"] is None
    estimate = result["estimate"]
    assert estimate["instance_type"] == "trn1.32xlarge" and estimate["usd"] > 0
    assert s3.list_objects_v2(Bucket="ultracluster-artifacts").get("KeyCount") == 0  # no sweep, no index


def test_a_backfilled_sweep_run_trains_its_point_and_is_indexed(s3, capsys):
    result = run(local(sweep=SWEEP, max_nodes=2), weeks=2)  # tick 2: the third point
    plan = result["plan"]
    assert (plan["num_nodes"], plan["max_nodes"], plan["scaling_mode"]) == (3, 3, "weak")
    assert "sweep s1: point 3/3 -> num_nodes=3" in capsys.readouterr().out  # the task log
    key = "runs/sweeps/trn1_bert_pretrain/s1/runs/backfill-2026-11-15t00-00-00-00-00"
    [listed] = s3.list_objects_v2(Bucket="ultracluster-artifacts")["Contents"]
    assert listed["Key"].startswith(key) and listed["Key"].endswith(".json")
    entry = json.loads(s3.get_object(Bucket="ultracluster-artifacts", Key=listed["Key"])["Body"].read())
    assert (entry["run_id"], entry["point"]["index"], entry["plan"]["num_nodes"]) == (RUN_ID, 2, 3)
    assert entry["estimate"] == json.loads(json.dumps(result["estimate"]))


@pytest.mark.parametrize("params, message, indexed", [
    (local(num_nodes=3, max_nodes=2), r"num_nodes \(3\) exceeds max_nodes \(2\)", 0),
    # A sweep point that fails its checks is indexed: it has ended, for its report and a holder.
    (local(sweep={"id": "s1", "num_nodes": [1, 3], "scaling_mode": "strong"}, grad_accum_usteps=2),
     r"divides grad_accum_usteps \(2\) by num_nodes \(3\)", 1),  # tick 1 picks 3 nodes
    # No point at all: nothing to index.
    (local(sweep={"id": "s1", "num_nodes": [1, 2], "point": {"num_nodes": 4}}), "not one of its points", 0),
])
def test_a_bad_conf_fails_at_once_without_retries(s3, params, message, indexed):
    # AirflowFailException: the task fails without using its retries.
    with pytest.raises(AirflowFailException, match=message):
        run(params, weeks=1)
    assert s3.list_objects_v2(Bucket="ultracluster-artifacts").get("KeyCount") == indexed


def test_a_shared_point_that_fails_preflight_has_ended_for_its_holder(s3, monkeypatch):
    """A point of a sweep on one cluster refused by its checks (here: the cluster's own) is in the
    index, on the holder's cluster, before the task fails: the holder counts it as ended (failed)."""
    monkeypatch.setattr(preflight, "existing_cluster_problems",
                        lambda plan, conn_id, log, warnings: ["existing_cluster_name: uc-sweep-s1 is DELETE_IN_PROGRESS"])
    sweep = {**SWEEP, "cluster": "shared", "point": {"num_nodes": 2}}
    with pytest.raises(AirflowFailException, match="uc-sweep-s1 is DELETE_IN_PROGRESS"):
        run(local(sweep=sweep), weeks=None, run_id="manual__p2")
    entries = read_index(ArtifactsS3Hook(aws_conn_id="uc_test_aws"), "s3://ultracluster-artifacts/runs",
                         "trn1_bert_pretrain", "s1", log=None)
    assert [e["run_id"] for e in on_held(entries, None, "uc-sweep-s1")] == ["manual__p2"]


def test_a_sweep_run_without_a_logical_date_must_name_its_point(s3):
    with pytest.raises(AirflowFailException, match="must name its point"):
        run(local(sweep=SWEEP), weeks=None, run_id="manual__x")
    assert run(local(sweep={**SWEEP, "point": {"num_nodes": 1}}), weeks=None,
               run_id="manual__x")["plan"]["num_nodes"] == 1


def test_the_cost_limit_fails_before_anything_is_created(s3):
    estimate = run(local())["estimate"]["usd"]
    assert run(local(), max_cost_usd=estimate + 1)["estimate"]["usd"] == estimate
    with pytest.raises(AirflowFailException, match=rf"estimate \${estimate:.2f} exceeds the limit \$0.01"):
        run(local(), max_cost_usd=0.01)


def test_every_problem_fails_the_run_once_and_names_its_param(s3):
    params = local(num_nodes=3, max_nodes=2, key_name="nobody", extra_tags={"aws:owner": "me"},
                   availability_zone_id="use1-az1")
    with pytest.raises(AirflowFailException) as failed:
        run(params)
    message = str(failed.value)
    # The count is the number of lines listed (the cross-field rules count one each).
    assert message.startswith("preflight found 5 problems, nothing was created:\n- ")
    assert len(message.splitlines()) == 1 + 5 and message.count("\n- ") == 5   # one line per problem
    for expected in ("num_nodes (3) exceeds max_nodes (2)", "extra_tags: key 'aws:owner' uses a reserved prefix",
                     "key_name: no key pair 'nobody' in us-east-1",
                     "instance_type: trn1.32xlarge is not offered in availability zone id use1-az1"):
        assert expected in message, message
    assert s3.list_objects_v2(Bucket="ultracluster-artifacts").get("KeyCount") == 0   # no probe left


def test_a_bucket_that_does_not_block_public_access_is_a_warning_not_a_failure(s3, capsys):
    s3.delete_public_access_block(Bucket="ultracluster-artifacts")
    result = run(local())
    missing = "artifacts_s3_uri: bucket ultracluster-artifacts has no public access block"
    assert [w[:len(missing)] for w in result["warnings"]] == [missing]
    assert "warning" in capsys.readouterr().out.split(missing)[0].splitlines()[-1]  # in the task log

    flags = dict.fromkeys(("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets"), True)
    s3.put_public_access_block(Bucket="ultracluster-artifacts",
                               PublicAccessBlockConfiguration={**flags, "RestrictPublicBuckets": False})
    assert run(local())["warnings"] == ["artifacts_s3_uri: bucket ultracluster-artifacts does not block all public "
                                        "access (RestrictPublicBuckets off)"]
    s3.put_public_access_block(Bucket="ultracluster-artifacts", PublicAccessBlockConfiguration=flags)
    try:
        assert run(local())["warnings"] == []
    finally:
        s3.delete_public_access_block(Bucket="ultracluster-artifacts")  # the shared moto's bucket as it was


def test_the_production_profile_estimates_a_nodes_boot(s3, capsys):
    """16 trn1.32xlarge installing Neuron at boot: in the log and the XCom, well under the warning line."""
    result = run(local(num_nodes=16, max_nodes=16, scaling_mode="weak"), estimate_boot_time=True)
    boot = result["boot"]
    assert (boot["seconds"], boot["timeout_s"], boot["row_set"], boot["nodes"]) == (752, 2100, "install_at_boot", 16)
    assert not any("boot estimate" in w for w in result["warnings"])
    assert "node boot estimate: 752 s for 16 × trn1.32xlarge" in capsys.readouterr().out


def test_a_boot_near_the_timeout_is_a_warning_not_a_failure(s3, capsys):
    result = run(local(num_nodes=128, max_nodes=128, scaling_mode="weak"), estimate_boot_time=True)
    warnings = [w for w in result["warnings"] if "boot estimate" in w]
    assert len(warnings) == 1 and warnings[0].startswith("num_nodes: node boot estimate:")
    assert "at or over the 70% warning line" in warnings[0]
    assert warnings[0] in capsys.readouterr().out  # the task log's warning


def test_a_prebuilt_image_boots_in_parallelclusters_own_time(s3, node_image):
    result = run(local(num_nodes=128, max_nodes=128, scaling_mode="weak", custom_ami=node_image()),
                 estimate_boot_time=True)
    assert result["boot"]["row_set"] == "prebuilt_image" and result["boot"]["seconds"] == 288
    assert not any("boot estimate" in w for w in result["warnings"])


def test_the_local_profile_does_not_estimate(s3):
    assert run(local())["boot"] is None


BOUNDARY = "arn:aws:iam::123456789012:policy/ultracluster-pcluster-boundary"
KMS = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "arn:aws:kms:us-east-1:123456789012:key/uc-test"}


def test_an_empty_permissions_boundary_is_refused_where_the_profile_requires_one(s3):
    """The production profile requires it (the pcluster role creates roles only with it); the local one
    opts out. Refused before anything is created, naming the profile key and where its value comes from."""
    for empty in (None, ""):
        with pytest.raises(AirflowFailException) as failed:
            run(local(), require_permissions_boundary=True, permissions_boundary_arn=empty)
        message = str(failed.value)
        assert message.startswith("preflight found 1 problem, nothing was created:\n"
                                  "- permissions_boundary_arn: not set")
        assert "ULTRACLUSTER_PERMISSIONS_BOUNDARY_ARN" in message and "PermissionsBoundaryArn" in message
    assert s3.list_objects_v2(Bucket="ultracluster-artifacts").get("KeyCount") == 0
    # Set, or not required (the local profile): the run goes on.
    assert run(local(), require_permissions_boundary=True, permissions_boundary_arn=BOUNDARY)["plan"]
    assert run(local(), require_permissions_boundary=False)["plan"]
    assert load_profile("production")["require_permissions_boundary"] is True
    assert load_profile("local")["require_permissions_boundary"] is False


def test_a_customer_kms_key_needs_the_nodes_kms_policy(s3):
    """Without it the nodes could not read their node script: refused in preflight, not after the boot."""
    with pytest.raises(AirflowFailException, match="node_kms_policy_arn: not set, but s3_kms_key_id"):
        run(local(), s3_encryption=KMS)
    assert run(local(), s3_encryption=KMS, node_kms_policy_arn="arn:aws:iam::123456789012:policy/uc-node-kms")["plan"]


# --- the node image (docs/operations.md, "The node image") ----------------------------------------

@pytest.fixture
def node_image(moto_endpoint, request):
    """Register AMIs in moto tagged as trn1_build_image tags them (the pinned stack unless told);
    each is deregistered afterwards (the session's moto is shared)."""
    import boto3

    from ultracluster.run.neuron_versions import load_versions
    from ultracluster.run.node_image import ami_tags

    ec2 = boto3.client("ec2", endpoint_url=moto_endpoint, region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    made: list[str] = []

    def make(**overrides: str) -> str:
        tags = {**ami_tags(load_versions(), "0123456789abcdef0123456789abcdef01234567", PARAMETER), **overrides}
        ami = ec2.register_image(Name=f"uc-test-{len(made)}-{request.node.name[:40]}", Architecture="x86_64",
                                 RootDeviceName="/dev/sda1", VirtualizationType="hvm")["ImageId"]
        ec2.create_tags(Resources=[ami], Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
        made.append(ami)
        return ami

    yield make
    for ami in made:
        ec2.deregister_image(ImageId=ami)


# A parameter of these tests alone: the shared moto may hold the local profile's.
PARAMETER = "/ultracluster/test/node-image"


@pytest.fixture
def ssm(moto_endpoint):
    import boto3

    client = boto3.client("ssm", endpoint_url=moto_endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    yield client
    try:
        client.delete_parameter(Name=PARAMETER)
    except client.exceptions.ParameterNotFound:
        pass


def production_like(**kwargs) -> dict:
    """preflight as the production profile runs it: the recorded image, no install at boot."""
    return run(local(**kwargs.pop("changes", {})), install_neuron_at_boot=False, node_image_parameter=PARAMETER,
               **kwargs)


def test_the_recorded_node_image_is_the_runs(s3, ssm, node_image, capsys):
    """The production way: the image trn1_build_image recorded, checked and planned, booting in
    ParallelCluster's own time (which image a run gets and what is refused: test_node_image_records.py)."""
    ami = node_image()
    ssm.put_parameter(Name=PARAMETER, Value=ami, Type="String", DataType="aws:ec2:image")
    result = production_like(estimate_boot_time=True)
    assert result["plan"]["custom_ami"] == ami and result["plan"]["install_neuron_at_boot"] is False
    assert result["boot"]["row_set"] == "prebuilt_image"  # 288 s: ParallelCluster's own start only
    assert f"Node image {ami} (custom_ami (empty): the node image parameter {PARAMETER}): Neuron 2.28.0" in (
        capsys.readouterr().out)


def test_no_image_is_refused_unless_the_profile_installs_at_boot(s3, ssm, capsys):
    with pytest.raises(AirflowFailException) as failed:
        production_like()
    assert str(failed.value) == (
        "preflight found 1 problem, nothing was created:\n"
        f"- custom_ami: no node image ({PARAMETER} holds none), and this deployment does not install Neuron at "
        "boot (install_neuron_at_boot); build one: trigger the trn1_build_image DAG (it builds the pinned stack "
        f"into an image and records it in {PARAMETER})")
    # With the opt-in the nodes install at boot, and preflight sets the boot against the timeout.
    result = run(local(num_nodes=16, max_nodes=16, scaling_mode="weak"), estimate_boot_time=True,
                 install_neuron_at_boot=True, node_image_parameter=PARAMETER)
    assert result["plan"]["custom_ami"] is None and result["plan"]["install_neuron_at_boot"] is True
    assert result["boot"]["row_set"] == "install_at_boot" and result["boot"]["timeout_s"] == 2100
    out = capsys.readouterr().out
    assert f"No node image ({PARAMETER} holds none): compute nodes install Neuron 2.28.0 at boot" in out
    assert "node boot estimate: 752 s for 16 × trn1.32xlarge" in out


def test_the_holder_of_a_shared_cluster_plans_the_largest_point_and_indexes_nothing(s3):
    """trn1_sweep_cluster's preflight (trains=False): a cluster for the sweep's largest point, named
    after the sweep; steps_this_run over max_steps is the points' to refuse, not the holder's."""
    sweep = {**SWEEP, "num_nodes": [1, 3, 2], "cluster": "shared"}
    result = run(local(sweep=sweep, max_nodes=1, steps_this_run=50, max_steps=10), weeks=None, trains=False)
    plan = result["plan"]
    assert (plan["num_nodes"], plan["max_nodes"], plan["cluster_name"]) == (3, 3, "uc-sweep-s1")
    assert plan["sweep_point"] is None and plan["existing_cluster_name"] is None
    assert s3.list_objects_v2(Bucket="ultracluster-artifacts").get("KeyCount") == 0  # the points index themselves
    with pytest.raises(AirflowFailException, match="needs a sweep"):
        run(local(), trains=False)
