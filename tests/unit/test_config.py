"""render_config: cross-field checks, template + JSON Schema validation, S3 upload (in-process moto)."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import yaml

from ultracluster.operators.cluster_config import RenderClusterConfigOperator, validate_cluster_config
from ultracluster.run.errors import ConfigValidationError, counted, problem_list
from ultracluster.run.names import CLUSTER_NAME_PATTERN, cluster_name_for, safe_run_id
from ultracluster.run.neuron_versions import render_on_node_configured
from ultracluster.run.plan import validate_plan
from ultracluster.run.profiles import include_dir, load_profile

REGION = "us-east-1"
RUN_ID = "manual__2026-11-30T08:00:00.123456+00:00"
SCHEMA = str(include_dir() / "cluster" / "cluster-config.schema.json")
# The production profile leaves the head node's SSH CIDR to the deployment: a documentation range here.
SSH_CIDR = "203.0.113.0/24"
NETWORK = {"owned": True, "vpc_id": "vpc-0a1", "public_subnet_id": "subnet-0pub", "private_subnet_id": "subnet-0priv",
           "security_group_id": "sg-0abc", "availability_zone": "us-east-1a"}


class RecordingTaskInstance:
    def __init__(self):
        self.xcom = {}

    def xcom_push(self, key, value):
        self.xcom[key] = value


def make_context(params: dict) -> dict:
    return {"run_id": RUN_ID, "params": params, "dag": SimpleNamespace(dag_id="trn1_bert_pretrain"),
            "ti": RecordingTaskInstance()}


@pytest.fixture(params=["production", "local"])
def profile(request) -> dict:
    return load_profile(request.param)


def test_profile_defaults_pass_the_cross_field_rules(profile):
    validate_plan(profile)


@pytest.mark.parametrize(("change", "message"), [
    ({"num_nodes": 32, "max_nodes": 16}, r"num_nodes \(32\) exceeds max_nodes \(16\)"),
    ({"min_nodes": 20, "max_nodes": 16}, r"min_nodes \(20\) exceeds max_nodes"),
    ({"steps_this_run": 50, "max_steps": 40}, r"steps_this_run \(50\) exceeds max_steps \(40\)"),
    ({"scaling_mode": "strong", "num_nodes": 3, "max_nodes": 4, "grad_accum_usteps": 32}, "must divide evenly"),
    ({"existing_public_subnet_id": "subnet-1"}, "go together"),
    ({"existing_vpc_id": "vpc-1"}, "needs existing_public_subnet_id"),
    ({"extra_queues": [{"name": "compute1", "instance_type": "trn1.2xlarge", "max_nodes": 1}]}, "unique"),
    ({"artifacts_s3_uri": "https://bucket/x"}, "artifacts_s3_uri: Not an s3:// URI"),
])
def test_cross_field_violations_are_reported(change, message):
    params = dict(load_profile("production"), **change)
    with pytest.raises(ConfigValidationError, match=message):
        validate_plan(params)


def test_weak_scaling_allows_any_node_count():
    validate_plan(dict(load_profile("production"), scaling_mode="weak", num_nodes=3))


def test_all_problems_are_listed_at_once():
    params = dict(load_profile("production"), num_nodes=40, max_nodes=16, steps_this_run=10**6)
    with pytest.raises(ConfigValidationError) as err:
        validate_plan(params)
    assert str(err.value).count("\n- ") == 3  # max_nodes, steps, divisibility


def test_a_problem_list_has_one_line_per_problem():
    """Issue 25: preflight said "1 problem(s)" and listed two: validate_plan's whole list had gone in
    as one problem. A problem's own line breaks are folded, so the count matches the lines listed."""
    merged = "Invalid run configuration:\n- num_nodes (3) exceeds max_nodes (2)\n- steps_this_run (50) exceeds"
    problems = [merged, "key_name: no key pair 'x\ny' in us-east-1\n"]
    message = problem_list(f"preflight found {counted(problems, 'problem')}, nothing was created", problems)
    assert message.splitlines() == [
        "preflight found 2 problems, nothing was created:",
        "- Invalid run configuration: - num_nodes (3) exceeds max_nodes (2) - steps_this_run (50) exceeds",
        "- key_name: no key pair 'x y' in us-east-1"]
    assert counted(["one"], "problem") == "1 problem"


@pytest.mark.parametrize("run_id", [
    RUN_ID, "scheduled__2026-11-29T00:00:00+00:00", "backfill__2026-11-22T00:00:00+00:00",
    "manual__" + "x" * 200, "REST run: num_nodes=8 / sweep #3", "2026",
])
def test_derived_names_are_valid_and_stable(run_id):
    name = cluster_name_for(run_id)
    assert CLUSTER_NAME_PATTERN.match(name), name
    assert cluster_name_for(run_id) == name
    assert re.fullmatch(r"[a-z0-9-]+", safe_run_id(run_id))


def test_derived_names_stay_distinct_for_similar_run_ids():
    a, b = "manual__2026-11-30T08:00:00+00:00", "manual__2026-11-30T08:00:00-00:00"
    assert cluster_name_for(a) != cluster_name_for(b)
    assert safe_run_id(a) != safe_run_id(b)


def test_requested_cluster_name_is_checked():
    assert cluster_name_for(RUN_ID, "my-cluster") == "my-cluster"
    with pytest.raises(ConfigValidationError):
        cluster_name_for(RUN_ID, "1-starts-with-digit")


# --- rendering + upload ----------------------------------------------------------------------

@pytest.fixture
def s3(monkeypatch):
    from moto import mock_aws

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({"conn_type": "aws", "extra": {"region_name": REGION}}))
    with mock_aws():
        import boto3

        client = boto3.client("s3", region_name=REGION)
        client.create_bucket(Bucket="ultracluster-artifacts")
        yield client


def render_op(params: dict, **overrides) -> RenderClusterConfigOperator:
    kwargs = dict(
        task_id="render_config", network=NETWORK, cluster_name=params.get("cluster_name"), region_name=REGION,
        key_name=params["key_name"], image_os=params["image_os"],
        head_node_instance_type=params["head_node_instance_type"], instance_type=params["instance_type"],
        min_nodes=params["min_nodes"], max_nodes=params["max_nodes"], extra_queues=params["extra_queues"],
        shared_storage_mount_dir=params["shared_storage_mount_dir"],
        fsx_storage_capacity_gib=params["fsx_storage_capacity_gib"],
        artifacts_s3_uri="s3://ultracluster-artifacts/runs", extra_tags={"team": "ml"},
        ssh_allowed_cidr=params.get("ssh_allowed_cidr") or SSH_CIDR,
        pcluster_conn_id=None,  # the rendering alone; the dry run: tests/unit/test_config_dryrun.py
    )
    kwargs.update(overrides)
    return RenderClusterConfigOperator(**kwargs)


def test_render_uploads_a_valid_seed_layout(s3):
    from datetime import datetime, timezone

    params = load_profile("production")
    context = make_context(params)
    context["dag_run"] = SimpleNamespace(start_date=datetime(2026, 11, 30, 8, 0, tzinfo=timezone.utc))
    result = render_op(params, resource_ttl_hours="48").execute(context)

    assert result["cluster_name"] == cluster_name_for(RUN_ID)
    assert result["config_s3_key"] == f"runs/trn1_bert_pretrain/{safe_run_id(RUN_ID)}/cluster-config.yaml"
    body = s3.get_object(Bucket="ultracluster-artifacts", Key=result["config_s3_key"])["Body"].read().decode()
    config = yaml.safe_load(body)
    [queue] = config["Scheduling"]["SlurmQueues"]
    [resource] = queue["ComputeResources"]
    assert queue["Name"] == "compute1" and queue["Networking"]["SubnetIds"] == ["subnet-0priv"]
    assert queue["Networking"]["PlacementGroup"]["Enabled"] is True
    assert resource == {"Name": "trn1-32xl", "InstanceType": "trn1.32xlarge", "MinCount": 0, "MaxCount": 16,
                        "Efa": {"Enabled": True}}
    assert config["HeadNode"]["Networking"]["SubnetId"] == "subnet-0pub"
    assert config["SharedStorage"][0]["StorageType"] == "FsxLustre"
    assert config["SharedStorage"][0]["MountDir"] == "/fsx"
    script_uri = config["HeadNode"]["CustomActions"]["OnNodeConfigured"]["Script"]
    assert script_uri == result["on_node_configured_s3_uri"] == queue["CustomActions"]["OnNodeConfigured"]["Script"]
    uploaded_script = s3.get_object(Bucket="ultracluster-artifacts", Key=script_uri.split("/", 3)[3])["Body"].read()
    # The script goes up with the pinned Neuron versions rendered in (tests/unit/test_neuron_versions.py).
    assert uploaded_script.decode() == render_on_node_configured()
    assert "NEURON_RELEASE=" in uploaded_script.decode()
    # The nodes read the run's prefix, nothing else (docs/operations.md, "The node roles").
    run_prefix = f"runs/trn1_bert_pretrain/{safe_run_id(RUN_ID)}/*"
    for iam in (config["HeadNode"]["Iam"], queue["Iam"]):
        assert iam["S3Access"] == [{"BucketName": "ultracluster-artifacts", "KeyName": run_prefix}]
    tags = {t["Key"]: t["Value"] for t in config["Tags"]}
    own = {"ultracluster:dag-id": "trn1_bert_pretrain", "ultracluster:run-id": RUN_ID,
           "ultracluster:created-by": "ultracluster", "ultracluster:expires-at": "2026-12-02T08:00:00Z"}
    assert tags == {"team": "ml", **own, "ultracluster:nodes": "16"}  # the node cap counts it
    # The script is the run's S3 scratch: tagged for the reaper (the config, a record, is not).
    tagging = s3.get_object_tagging(Bucket="ultracluster-artifacts", Key=script_uri.split("/", 3)[3])["TagSet"]
    assert {t["Key"]: t["Value"] for t in tagging} == own
    assert result["nodes"] == 16
    assert context["ti"].xcom["ultracluster_cluster_config"]["key"] == result["config_s3_key"]


@pytest.mark.parametrize("opt_in", [False, True, "True"])
def test_the_uploaded_script_installs_at_boot_only_with_the_opt_in(s3, opt_in):
    """The plan's install_neuron_at_boot (the profile's opt-in, rendered as text by a template) reaches the
    node script; without it a compute node lacking the node image fails instead of installing."""
    params = load_profile("production")
    result = render_op(params, install_neuron_at_boot=opt_in).execute(make_context(params))
    key = result["on_node_configured_s3_uri"].split("/", 3)[3]
    uploaded = s3.get_object(Bucket="ultracluster-artifacts", Key=key)["Body"].read().decode()
    wanted = opt_in in (True, "True")
    assert uploaded == render_on_node_configured(install_at_boot=wanted)
    assert f"NEURON_INSTALL_AT_BOOT={'true' if wanted else 'false'}\n" in uploaded


def test_render_multi_queue(s3):
    params = dict(load_profile("production"), extra_queues=[
        {"name": "small", "instance_type": "trn1.2xlarge", "max_nodes": 4},
        {"name": "wide", "instance_type": "trn1n.32xlarge", "min_nodes": 1, "max_nodes": 8},
    ])
    result = render_op(params).execute(make_context(params))
    config = yaml.safe_load(s3.get_object(Bucket="ultracluster-artifacts", Key=result["config_s3_key"])["Body"].read())
    queues = {q["Name"]: q for q in config["Scheduling"]["SlurmQueues"]}
    assert list(queues) == ["compute1", "small", "wide"] == result["queues"]
    small = queues["small"]["ComputeResources"][0]
    assert small["Efa"]["Enabled"] is False and queues["small"]["Networking"]["PlacementGroup"]["Enabled"] is False
    assert queues["wide"]["ComputeResources"][0]["MinCount"] == 1


def test_schema_violations_fail_before_anything_is_uploaded(s3):
    params = dict(load_profile("production"), fsx_storage_capacity_gib=1000)
    with pytest.raises(ConfigValidationError, match="StorageCapacity"):
        render_op(params, fsx_storage_capacity_gib=1000).execute(make_context(params))
    assert s3.list_objects_v2(Bucket="ultracluster-artifacts").get("KeyCount") == 0


# Template context the operator adds for compute storage, log retention and the roles' boundary.
STORAGE_AND_LOGS = {"log_retention_days": 14, "compute_root_volume_gib": 1024,
                    "ephemeral_mount_dir": "/local_storage", "permissions_boundary": None,
                    "s3_access": [{"BucketName": "ultracluster-artifacts", "KeyName": "x/*"}],
                    "head_node_policies": [], "compute_policies": []}


def rendered_seed() -> dict:
    from ultracluster.operators.cluster_config import build_queues, render_cluster_config

    context = {
        "region": REGION, "image_os": "ubuntu2204", "cluster_name": "uc-x", "head_node_instance_type": "c5.4xlarge",
        "public_subnet_id": "subnet-0pub", "private_subnet_id": "subnet-0priv", "security_group_id": None,
        "key_name": "k", "ssh_allowed_ips": SSH_CIDR,
        "on_node_configured_s3_uri": "s3://ultracluster-artifacts/x/on_node_configured.sh",
        "queues": build_queues("trn1.32xlarge", 0, 16, []), "mount_dir": "/fsx",
        "fsx_storage_capacity_gib": 1200, "tags": [{"key": "k", "value": "v: with colon"}],
        **STORAGE_AND_LOGS,
    }
    return yaml.safe_load(render_cluster_config(str(include_dir() / "cluster" / "cluster-config.yaml.j2"), context))


def test_rendered_seed_validates_and_omits_absent_security_group():
    config = rendered_seed()
    validate_cluster_config(yaml.safe_dump(config), SCHEMA)
    assert "AdditionalSecurityGroups" not in config["HeadNode"]["Networking"]
    assert config["Tags"] == [{"Key": "k", "Value": "v: with colon"}]
    assert "Iam" not in config  # no boundary set: ParallelCluster's roles without one


def test_the_permissions_boundary_renders_as_iam_permissions_boundary():
    """render_config's permissions_boundary_arn (the profile's) becomes Iam.PermissionsBoundary."""
    arn = "arn:aws:iam::123456789012:policy/ultracluster-pcluster-boundary"
    operator = RenderClusterConfigOperator(
        task_id="render_config", network={"public_subnet_id": "subnet-0pub", "private_subnet_id": "subnet-0priv"},
        cluster_name="uc-x", region_name=REGION, key_name="k", head_node_instance_type="c5.4xlarge",
        instance_type="trn1.32xlarge", min_nodes=0, max_nodes=16, artifacts_s3_uri="s3://ultracluster-artifacts/runs",
        permissions_boundary_arn=arn, pcluster_conn_id=None,
        ssh_allowed_cidr=SSH_CIDR)
    context = operator.build_context({"run_id": "manual__x", "dag": SimpleNamespace(dag_id="trn1_bert_pretrain")},
                                     "s3://ultracluster-artifacts/x.sh")
    assert context["permissions_boundary"] == arn
    config = yaml.safe_load(render_cluster_config_text(context))
    assert config["Iam"] == {"PermissionsBoundary": arn}
    validate_cluster_config(yaml.safe_dump(config), SCHEMA)
    with pytest.raises(ConfigValidationError, match="Iam/PermissionsBoundary"):
        validate_cluster_config(yaml.safe_dump(dict(config, Iam={"PermissionsBoundary": "boundary"})), SCHEMA)


def render_cluster_config_text(context: dict) -> str:
    from ultracluster.operators.cluster_config import render_cluster_config

    return render_cluster_config(str(include_dir() / "cluster" / "cluster-config.yaml.j2"), context)


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda c: c["Scheduling"]["SlurmQueues"][0].update(Name="Compute1"), "does not match"),
    (lambda c: c["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0].update(MaxCount=0), "less than the minimum"),
    (lambda c: c["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0].update(MinCount=20), "MinCount > MaxCount"),
    (lambda c: c["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0].update(InstanceType="trn1.2xlarge"), "has no EFA"),
    (lambda c: c.update(Bogus=1), "Additional properties are not allowed"),
    (lambda c: c["Scheduling"].update(SlurmQueues=c["Scheduling"]["SlurmQueues"] * 51), "is too long"),
    (lambda c: c["HeadNode"]["Networking"].update(SubnetId="None"), "does not match"),
    (lambda c: c["Tags"].append({"Key": "aws:reserved", "Value": "x"}), "Tags/1/Key"),
])
def test_schema_rejects_what_pcluster_would(mutate, message):
    config = rendered_seed()
    mutate(config)
    with pytest.raises(ConfigValidationError, match=message):
        validate_cluster_config(yaml.safe_dump(config), SCHEMA)


def test_a_missing_network_output_cannot_render_a_valid_config():
    """A None subnet must fail validation rather than reach pcluster as the string 'None'."""
    from ultracluster.operators.cluster_config import build_queues, render_cluster_config

    text = render_cluster_config(str(include_dir() / "cluster" / "cluster-config.yaml.j2"), {
        "region": REGION, "image_os": "ubuntu2204", "cluster_name": "uc-x", "head_node_instance_type": "c5.4xlarge",
        "public_subnet_id": None, "private_subnet_id": "subnet-0priv", "security_group_id": None, "key_name": "k",
        "ssh_allowed_ips": SSH_CIDR, "on_node_configured_s3_uri": "s3://b-b/x.sh",
        "queues": build_queues("trn1.32xlarge", 0, 2, []), "mount_dir": "/fsx", "fsx_storage_capacity_gib": 1200,
        "tags": [], **STORAGE_AND_LOGS,
    })
    with pytest.raises(ConfigValidationError, match="HeadNode/Networking/SubnetId"):
        validate_cluster_config(text, SCHEMA)
