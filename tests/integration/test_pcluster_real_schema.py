"""The rendered cluster config against the real ParallelCluster: aws-parallelcluster 3.16.1 in its own venv.

.venvs/pcluster (requirements-pcluster.lock) cannot share Airflow's venv, so its schema runs in a
subprocess: scripts/pcluster_validate.py loads the YAML with ``ClusterSchema`` as `pcluster
create-cluster` does, offline (any AWS call is refused and reported). The configs are rendered by the
project's own code (RenderClusterConfigOperator.build_context + render_cluster_config), so template
changes are checked here as they land. Where the venv is missing: a failure under CI, else a skip.

The last tests run the real `pcluster create-cluster --dryrun true` against a moto server
(docs/operations.md, "The real ParallelCluster in the tests"), every capacity variant included: the
local UltraCluster's moto answers capacity reservations (localcluster/moto_capacity.py); the validators it cannot
answer are suppressed per variant, each logged with its reason (``CAPACITY_MOTO_GAPS``).
"""
from __future__ import annotations

import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.iam_policy import MANAGED_POLICY_ACTIONS, render_policy, statements
from tests.iam_policy import NODE_KMS_POLICY as NODE_KMS_FILE
from ultracluster.operators.cluster_config import (
    RenderClusterConfigOperator,
    render_cluster_config,
    validate_cluster_config,
)
from ultracluster.params import dag_params
from ultracluster.run.errors import ConfigValidationError
from ultracluster.run.form import IMAGE_OS
from ultracluster.run.profiles import include_dir, load_profile
from ultracluster.run.s3 import profile_sse
from ultracluster.run.ssh_access import effective_cidr

REPO = Path(__file__).resolve().parents[2]
PCLUSTER_BIN = REPO / ".venvs" / "pcluster" / "bin"
VALIDATE = REPO / "scripts" / "pcluster_validate.py"
TEMPLATE = include_dir() / "cluster" / "cluster-config.yaml.j2"
SCHEMA = include_dir() / "cluster" / "cluster-config.schema.json"
RUN_ID = "manual__2026-12-01T08:00:00.123456+00:00"
SCRIPT_URI = "s3://ultracluster-artifacts/runs/trn1_bert_pretrain/x/on_node_configured.sh"
# Ids shaped like EC2's (ParallelCluster takes 8 or 17 characters after the prefix).
NETWORK = {"public_subnet_id": "subnet-0123456789abcdef0", "private_subnet_id": "subnet-0fedcba9876543210",
           "security_group_id": "sg-0123456789abcdef0"}
# Validators that fail on moto's gaps, not on the config (tests/localcluster/recorded/README.md).
MOTO_GAPS = ["type:HeadNodeLaunchTemplateValidator", "type:ComputeResourceLaunchTemplateValidator",
             "type:KeyPairValidator"]


@pytest.fixture(scope="module")
def pcluster_python() -> Path:
    python = PCLUSTER_BIN / "python"
    if not python.exists():
        # CI builds it (scripts/setup_venvs.sh): there a missing venv is a failure, not a skip.
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"{python} missing: run `make setup`")
    return python


def real_schema(python: Path, texts: dict[str, str], tmp_path: Path) -> dict[str, dict]:
    """scripts/pcluster_validate.py's verdict on each config, in one run (the package imports slowly)."""
    paths = []
    for name, text in texts.items():
        paths.append(tmp_path / f"{name}.yaml")
        paths[-1].write_text(text)
    done = subprocess.run([str(python), str(VALIDATE), *map(str, paths), "--cluster-name", "uc-schema-check"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode in (0, 1), done.stderr
    results = json.loads(done.stdout)
    results = results if isinstance(results, list) else [results]
    for name, result in zip(texts, results):
        assert result["pclusterVersion"] == "3.16.1"
        # Offline: the only call the load makes (its reservation cache) is refused and tolerated.
        assert result["awsCalls"] == LOAD_CALLS.get(name.split("_", 1)[1], []), name
    return dict(zip(texts, results))


def render(params: dict, network: dict | None = None, **overrides) -> str:
    """The config render_config would upload for ``params`` (profile keys that are operator arguments)."""
    accepted = inspect.signature(RenderClusterConfigOperator.__init__).parameters
    kwargs = {key: value for key, value in params.items() if key in accepted}
    kwargs["s3_encryption"] = profile_sse(params)  # the profile's mode name as S3 request parameters
    # As preflight puts it into the plan: the run's CIDR, else the deployment's.
    kwargs["ssh_allowed_cidr"] = effective_cidr(params.get("ssh_allowed_cidr"), params.get("head_node_ssh_cidr"))
    kwargs.update(task_id="render_config", network=network or NETWORK, cluster_name=None,
                  region_name=params["region"], pcluster_conn_id=None, **overrides)
    operator = RenderClusterConfigOperator(**kwargs)
    context = {"run_id": RUN_ID, "dag": SimpleNamespace(dag_id="trn1_bert_pretrain")}
    return render_cluster_config(str(TEMPLATE), operator.build_context(context, SCRIPT_URI))


# The production profile leaves the head node's SSH CIDR to the deployment: a documentation range here.
SSH_CIDR = "203.0.113.0/24"
RESERVATION_ID = "cr-0123456789abcdef0"
GROUP_ARN = "arn:aws:resource-groups:us-east-1:123456789012:group/trn1-reservations"


def production(**changes) -> dict:
    return dict(load_profile("production"), **{"ssh_allowed_cidr": SSH_CIDR, **changes})


# What ParallelCluster's load asks AWS for on its own (SlurmClusterConfig caches the reservations the
# config names, tolerating a failure): scripts/pcluster_validate.py refuses and reports it.
LOAD_CALLS = {"capacity_odcr": ["ec2:DescribeCapacityReservations"],
              "capacity_capacity_block": ["ec2:DescribeCapacityReservations"],
              "capacity_odcr_group": ["resource-groups:ListGroupResources"]}
# Every capacity variant the params allow (run.capacity's rules): what render_config renders for each.
CAPACITY = {
    "spot": {"capacity_type": "SPOT"},
    "odcr": {"capacity_type": "ONDEMAND", "capacity_reservation_id": RESERVATION_ID},
    "odcr_group": {"capacity_type": "ONDEMAND", "capacity_reservation_resource_group_arn": GROUP_ARN},
    "capacity_block": {"capacity_type": "CAPACITY_BLOCK", "capacity_reservation_id": RESERVATION_ID,
                       "min_nodes": 16, "max_nodes": 16},
}


KEY_ARN = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
NODE_KMS_POLICY = "arn:aws:iam::123456789012:policy/ultracluster-node-kms"
# Every encryption a deployment may choose, and whether its key is a customer managed one.
ENCRYPTION = {
    "s3": {"s3_encryption": "AES256", "s3_kms_key_id": ""},
    "kms_aws_managed": {"s3_encryption": "aws:kms", "s3_kms_key_id": ""},
    "kms_customer": {"s3_encryption": "aws:kms", "s3_kms_key_id": KEY_ARN, "node_kms_policy_arn": NODE_KMS_POLICY},
    "kms_customer_alias": {"s3_encryption": "aws:kms", "s3_kms_key_id": "alias/ultracluster",
                           "node_kms_policy_arn": NODE_KMS_POLICY},
}


CASES = {
    "production": production(),
    "local": load_profile("local"),
    "multi_queue": production(extra_queues=[
        {"name": "small", "instance_type": "trn1.2xlarge", "max_nodes": 4},
        {"name": "wide", "instance_type": "trn1n.32xlarge", "min_nodes": 1, "max_nodes": 8},
    ]),
    "static_32_trn1n": production(instance_type="trn1n.32xlarge", num_nodes=32, min_nodes=32, max_nodes=32),
    "permissions_boundary": production(
        permissions_boundary_arn="arn:aws:iam::123456789012:policy/ultracluster-pcluster-boundary"),
    **{f"image_os_{os_name}": production(image_os=os_name) for os_name in IMAGE_OS},
    **{f"capacity_{name}": production(**changes) for name, changes in CAPACITY.items()},
    # The node image (trn1_build_image's, or the run's custom_ami): the training queue's Image.CustomAmi.
    "node_image": production(custom_ami="ami-0123456789abcdef0", extra_queues=[
        {"name": "small", "instance_type": "trn1.2xlarge", "max_nodes": 4}]),
    "ssh_prefix_list": production(ssh_allowed_cidr="pl-0123456789abcdef0"),
    "ssh_world_allowed": production(ssh_allowed_cidr=None, allow_world_ssh=True),
    # The node roles' KMS grant (run.node_iam): only a customer managed key adds the node KMS policy.
    **{f"sse_{name}": production(**changes) for name, changes in ENCRYPTION.items()},
}


# Configs that must fail, each with the error the real schema gives: (overrides, network, path, message).
INVALID = {
    "ubuntu2004": ({"image_os": "ubuntu2004"}, None, "Image/Os", "Must be one of"),  # the blog's OS, refused since 3.14
    "max_nodes_0": ({"max_nodes": 0}, None, "Scheduling/SlurmQueues/0/ComputeResources/0/MaxCount",
                    "greater than or equal to 1"),
    # EC2 ids have 8 or 17 characters after the prefix; the project's own schema only checks the prefix.
    "short_subnet": ({}, dict(NETWORK, public_subnet_id="subnet-0pub"), "HeadNode/Networking/SubnetId",
                     "does not match"),
}


def with_unknown_key() -> str:
    config = yaml.safe_load(render(production()))
    config["HeadNode"]["Bogus"] = 1
    return yaml.safe_dump(config)


@pytest.fixture(scope="module")
def verdicts(pcluster_python, tmp_path_factory) -> dict[str, dict]:
    """The real schema's verdict on every case above, valid and invalid, from one subprocess."""
    texts = {f"valid_{name}": render(params) for name, params in CASES.items()}
    texts.update({f"invalid_{name}": render(production(**overrides), network)
                  for name, (overrides, network, _, _) in INVALID.items()})
    texts["invalid_unknown_key"] = with_unknown_key()
    return real_schema(pcluster_python, texts, tmp_path_factory.mktemp("configs"))


@pytest.mark.parametrize("case", list(CASES))
def test_rendered_config_passes_the_real_schema(verdicts, case):
    validate_cluster_config(render(CASES[case]), str(SCHEMA))  # the project's own check agrees
    result = verdicts[f"valid_{case}"]
    assert result["valid"], result["errors"]
    assert result["errors"] == []


def test_the_32_node_static_config_is_what_was_asked():
    config = yaml.safe_load(render(CASES["static_32_trn1n"]))
    [queue] = config["Scheduling"]["SlurmQueues"]
    [resource] = queue["ComputeResources"]
    assert (resource["InstanceType"], resource["MinCount"], resource["MaxCount"]) == ("trn1n.32xlarge", 32, 32)
    assert resource["Efa"]["Enabled"] is True and queue["Networking"]["PlacementGroup"]["Enabled"] is True


@pytest.mark.parametrize("name", list(CAPACITY))
def test_each_capacity_variant_renders_as_parallelcluster_takes_it(name):
    config = yaml.safe_load(render(CASES[f"capacity_{name}"]))
    [queue] = config["Scheduling"]["SlurmQueues"]
    [resource] = queue["ComputeResources"]
    changes = CAPACITY[name]
    assert queue["CapacityType"] == changes["capacity_type"]
    target = {"CapacityReservationId": changes.get("capacity_reservation_id"),
              "CapacityReservationResourceGroupArn": changes.get("capacity_reservation_resource_group_arn")}
    assert resource.get("CapacityReservationTarget") == ({k: v for k, v in target.items() if v} or None)
    # No managed placement group on reserved capacity (ParallelCluster: a block needs none; a reservation's own wins).
    assert queue["Networking"]["PlacementGroup"]["Enabled"] is (name == "spot")
    if name == "capacity_block":
        assert resource["MinCount"] == resource["MaxCount"] == 16


def test_the_head_nodes_ssh_is_what_the_param_says():
    assert yaml.safe_load(render(production()))["HeadNode"]["Ssh"]["AllowedIps"] == SSH_CIDR
    assert yaml.safe_load(render(CASES["ssh_world_allowed"]))["HeadNode"]["Ssh"]["AllowedIps"] == "0.0.0.0/0"
    with pytest.raises(ConfigValidationError, match="ssh_allowed_cidr: not set"):
        render(production(ssh_allowed_cidr=None))


def node_role_grants(config: dict, iam: dict) -> set[str]:
    """The actions a node role gets from the config, as ParallelCluster 3.16.1 builds them
    (``_add_s3_access_policies_to_role``: s3:Get* and s3:List* on a read-only entry, s3:* with
    EnableWriteAccess; each AdditionalIamPolicies policy's own actions), and its CloudWatch agent's policy."""

    documents = {NODE_KMS_POLICY: render_policy(NODE_KMS_FILE.read_text(), {"kms-key-arn": KEY_ARN,
                                                                            "region": "us-east-1"})}
    granted = set()
    for access in iam.get("S3Access", []):
        granted |= {"s3:*"} if access.get("EnableWriteAccess") else {"s3:Get*", "s3:List*"}
    for entry in iam.get("AdditionalIamPolicies", []):
        arn = entry["Policy"]
        if arn in documents:
            granted |= {a for s in statements(documents[arn]) for a in s["Action"]}
        else:
            granted |= set(MANAGED_POLICY_ACTIONS[arn])
    assert config["Monitoring"]["Logs"]["CloudWatch"]["Enabled"] is True  # ParallelCluster adds the agent's policy
    return granted | set(MANAGED_POLICY_ACTIONS["arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy"])


@pytest.mark.parametrize("name", list(ENCRYPTION))
def test_the_node_roles_read_the_runs_prefix_and_decrypt_only_with_a_customer_key(name):
    """No S3 write for any node role, S3 only under the run's prefix, and kms:Decrypt exactly when a
    customer managed key encrypts the node script; the head node also gets SSM Session Manager."""
    config = yaml.safe_load(render(CASES[f"sse_{name}"]))
    roles = {"HeadNode": config["HeadNode"]["Iam"],
             **{q["Name"]: q["Iam"] for q in config["Scheduling"]["SlurmQueues"]}}
    customer = "node_kms_policy_arn" in ENCRYPTION[name]
    script_prefix = SCRIPT_URI.removeprefix("s3://ultracluster-artifacts/").rsplit("/", 1)[0]
    for role, iam in roles.items():
        assert iam["S3Access"] == [{"BucketName": "ultracluster-artifacts", "KeyName": f"{script_prefix}/*"}], role
        granted = node_role_grants(config, iam)
        s3_writes = {a for a in granted if a.startswith("s3:") and not a.startswith(("s3:Get", "s3:List"))}
        assert s3_writes == set(), (role, s3_writes)
        assert ("kms:Decrypt" in granted) is customer, (role, granted)
        assert (NODE_KMS_POLICY in [p["Policy"] for p in iam.get("AdditionalIamPolicies", [])]) is customer
    assert "ssm:UpdateInstanceInformation" in node_role_grants(config, roles["HeadNode"])
    assert "AdditionalIamPolicies" not in roles["compute1"] or customer
    # What it catches: write access or a KMS policy without a customer key.
    assert "s3:*" in node_role_grants(config, {"S3Access": [{"BucketName": "b", "EnableWriteAccess": True}]})
    # A customer key without the node policy is never rendered (preflight refuses it first).
    if customer:
        with pytest.raises(ConfigValidationError, match="node_kms_policy_arn: not set"):
            render(production(**{**ENCRYPTION[name], "node_kms_policy_arn": ""}))


def test_multi_queue_config_keeps_its_queues():
    config = yaml.safe_load(render(CASES["multi_queue"]))
    assert [q["Name"] for q in config["Scheduling"]["SlurmQueues"]] == ["compute1", "small", "wide"]


@pytest.mark.parametrize("case", list(INVALID))
def test_the_real_schema_catches_invalid_values(verdicts, case):
    _, _, path, message = INVALID[case]
    result = verdicts[f"invalid_{case}"]
    assert not result["valid"]
    assert any(e["path"] == path and message in e["message"] for e in result["errors"]), result["errors"]
    assert path.split("/")[0] in result["configSchemaValidator"]  # what the CLI would print


def test_an_unknown_key_is_refused_by_the_real_schema(verdicts):
    assert {"path": "HeadNode/Bogus", "message": "Unknown field."} in verdicts["invalid_unknown_key"]["errors"]


# --- Image.Os: what the param offers, the project's schema and the local CLI accept ----------------

@pytest.fixture(scope="module")
def real_supported_oses(pcluster_python) -> list[str]:
    done = subprocess.run([str(pcluster_python), str(VALIDATE), "--supported-oses"], capture_output=True,
                          text=True, timeout=120, check=True)
    return json.loads(done.stdout)


def test_image_os_param_offers_the_ubuntu_releases_pcluster_accepts(real_supported_oses):
    accepted = real_supported_oses
    # Every value offered is accepted; of what is accepted, the Ubuntu releases are offered (the node
    # script installs Neuron with apt, so alinux/rhel/rocky are left out on purpose).
    assert set(IMAGE_OS) <= set(accepted)
    assert list(IMAGE_OS) == [name for name in accepted if name.startswith("ubuntu")]
    assert dag_params(load_profile("production"))["image_os"].schema["enum"] == list(IMAGE_OS)


def test_project_schema_and_profiles_use_the_params_os_list():
    schema = json.loads(SCHEMA.read_text())
    assert schema["properties"]["Image"]["properties"]["Os"]["enum"] == list(IMAGE_OS)
    for name in ("production", "local"):
        assert load_profile(name)["image_os"] in IMAGE_OS
    with pytest.raises(ConfigValidationError, match="Image/Os"):
        validate_cluster_config(render(production(image_os="ubuntu2004")), str(SCHEMA))


def test_local_cli_knows_the_real_os_list(real_supported_oses):
    path = REPO / "localcluster" / "localcluster" / "config_schema.py"
    spec = importlib.util.spec_from_file_location("_localcluster_config_schema", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert list(module.SUPPORTED_OS) == real_supported_oses


# --- the real `pcluster create-cluster --dryrun true` against moto ---------------------------------

@pytest.fixture(scope="module")
def real_pcluster(pcluster_python) -> Path:
    if not shutil.which("node"):
        # pcluster's create-cluster refuses to start without Node.js (scripts/setup_apt.sh installs it).
        (pytest.fail if os.environ.get("CI") else pytest.skip)("node missing: run `make setup`")
    return PCLUSTER_BIN / "pcluster"


@pytest.fixture(scope="module")
def moto_account(moto_server) -> dict:
    return prepare_account(moto_server)


def prepare_account(moto_server: str) -> dict:
    """What a real dry run needs in moto: buckets, a key pair, a VPC with two subnets, a 'ParallelCluster AMI'
    (made with the fixed keys ``testing``, which the enforcing moto's local principal holds too)."""
    import boto3

    session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")
    ec2, s3 = (session.client(name, endpoint_url=moto_server) for name in ("ec2", "s3"))
    for bucket in ("ultracluster-artifacts", "neuron-s3"):
        s3.create_bucket(Bucket=bucket)  # moto answers 200 for a bucket the account already has
    key_name = f"uc-real-{uuid.uuid4().hex[:8]}"
    ec2.create_key_pair(KeyName=key_name)
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    ec2.modify_vpc_attribute(VpcId=vpc, EnableDnsHostnames={"Value": True})
    zone = ec2.describe_availability_zones()["AvailabilityZones"][0]["ZoneName"]
    public, private = (ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=zone)["Subnet"]["SubnetId"]
                       for cidr in ("10.42.0.0/24", "10.42.1.0/24"))
    # pcluster looks its AMI up by name (and owner "amazon", overridden below through DevSettings).
    [instance] = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"]
    ec2.create_image(InstanceId=instance["InstanceId"],
                     Name=f"aws-parallelcluster-3.16.1-ubuntu-2204-lts-hvm-x86_64-{uuid.uuid4().hex[:12]}")
    ec2.terminate_instances(InstanceIds=[instance["InstanceId"]])
    bucket, key = SCRIPT_URI[len("s3://"):].split("/", 1)
    s3.put_object(Bucket=bucket, Key=key, Body=b"#!/bin/bash\n")
    account = session.client("sts", endpoint_url=moto_server).get_caller_identity()["Account"]
    return {"endpoint": moto_server, "key_name": key_name, "account": account,
            "network": {"public_subnet_id": public, "private_subnet_id": private, "security_group_id": None}}


@pytest.fixture
def real_hook(real_pcluster, moto_account, monkeypatch, tmp_path):
    from ultracluster.hooks.parallelcluster import ParallelClusterHook

    env = {"AWS_ENDPOINT_URL": moto_account["endpoint"], "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "HOME": str(tmp_path)}  # pcluster logs to ~/.parallelcluster
    monkeypatch.setenv("AIRFLOW_CONN_UC_REAL_PCLUSTER", json.dumps(
        {"conn_type": "pcluster", "extra": {"binary": str(real_pcluster), "region": "us-east-1", "env": env}}))
    return ParallelClusterHook("uc_real_pcluster")


def moto_config(moto_account: dict, mutate=None, **changes) -> str:
    """The production config (with ``changes``) for moto's network, and DevSettings that find the AMI made above."""
    config = yaml.safe_load(render(production(key_name=moto_account["key_name"], image_os="ubuntu2204",
                                              **{"custom_ami": None, **changes}), moto_account["network"]))
    config["DevSettings"] = {"AmiSearchFilters": {"Owner": moto_account["account"]}}
    if mutate:
        mutate(config)
    return yaml.safe_dump(config)


@pytest.mark.localcluster
def test_real_dryrun_accepts_the_rendered_config(real_hook, moto_account, tmp_path):
    from ultracluster.parsers.pcluster import DRYRUN_SUCCEEDED

    path = tmp_path / "cluster-config.yaml"
    path.write_text(moto_config(moto_account))
    result = real_hook.create_cluster("uc-real-dryrun", str(path), suppress_validators=MOTO_GAPS, dryrun=True)
    assert result["message"] == DRYRUN_SUCCEEDED
    assert all(m["level"] in ("INFO", "WARNING") for m in result["validationMessages"])


@pytest.mark.localcluster
def test_real_dryrun_refusal_fails_render_configs_check(real_hook, moto_account):
    """A subnet that is not in the account: render_config's check fails the task, no retry."""
    import logging

    from airflow.sdk.exceptions import AirflowFailException

    from ultracluster.operators.cluster_config import dryrun_cluster_config

    def foreign_subnet(config):
        queue = config["Scheduling"]["SlurmQueues"][0]
        queue["Networking"]["SubnetIds"] = ["subnet-0aaaaaaaaaaaaaaaa"]

    text = moto_config(moto_account, foreign_subnet)
    with pytest.raises(AirflowFailException, match="subnet-0aaaaaaaaaaaaaaaa"):
        dryrun_cluster_config(real_hook, "uc-real-dryrun", text, suppress_validators=MOTO_GAPS,
                              log=logging.getLogger("test"))


# --- every capacity variant through the real dry run ---------------------------------------------

# Validators moto cannot answer for a variant, and why (docs/operations.md, "The real ParallelCluster
# in the tests"): each is suppressed for that variant only, and the test logs it.
CAPACITY_MOTO_GAPS = {
    "odcr_group": {
        "type:CapacityReservationResourceGroupValidator": "moto routes no resource-groups ListGroupResources, "
                                                          "which lists the group's reservations",
        "type:PlacementGroupCapacityReservationValidator": "it lists the group's reservations the same way",
    },
}


def reservation_for(moto_account: dict, name: str) -> dict:
    """The variant's params, with a reservation made in moto as a user makes it (the subnet's AZ, 16 x trn1)."""
    import boto3

    ec2 = boto3.client("ec2", endpoint_url=moto_account["endpoint"], region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    zone = ec2.describe_subnets(SubnetIds=[moto_account["network"]["private_subnet_id"]])["Subnets"][0]
    changes = dict(CAPACITY[name])
    if name == "odcr":
        made = ec2.create_capacity_reservation(InstanceType="trn1.32xlarge", InstancePlatform="Linux/UNIX",
                                               AvailabilityZone=zone["AvailabilityZone"], InstanceCount=16)
        changes["capacity_reservation_id"] = made["CapacityReservation"]["CapacityReservationId"]
    elif name == "capacity_block":
        [offer] = ec2.describe_capacity_block_offerings(InstanceType="trn1.32xlarge", InstanceCount=16,
                                                        CapacityDurationHours=24)["CapacityBlockOfferings"]
        assert offer["AvailabilityZone"] == zone["AvailabilityZone"]
        bought = ec2.purchase_capacity_block(CapacityBlockOfferingId=offer["CapacityBlockOfferingId"],
                                             InstancePlatform="Linux/UNIX")
        changes["capacity_reservation_id"] = bought["CapacityReservation"]["CapacityReservationId"]
    elif name == "odcr_group":
        changes["capacity_reservation_resource_group_arn"] = GROUP_ARN.replace("123456789012", moto_account["account"])
    return changes


@pytest.mark.localcluster
@pytest.mark.parametrize("name", list(CAPACITY))
def test_real_dryrun_accepts_every_capacity_variant(real_hook, moto_account, tmp_path, name):
    import logging

    from ultracluster.parsers.pcluster import DRYRUN_SUCCEEDED

    gaps = CAPACITY_MOTO_GAPS.get(name, {})
    for validator, why in gaps.items():
        logging.getLogger(__name__).warning("dry run of %s: %s suppressed: %s", name, validator, why)
    path = tmp_path / "cluster-config.yaml"
    path.write_text(moto_config(moto_account, **reservation_for(moto_account, name)))
    result = real_hook.create_cluster("uc-real-dryrun", str(path), suppress_validators=MOTO_GAPS + list(gaps),
                                      dryrun=True)
    assert result["message"] == DRYRUN_SUCCEEDED
    assert all(m["level"] in ("INFO", "WARNING") for m in result["validationMessages"]), result


@pytest.mark.localcluster
def test_real_dryrun_refuses_a_capacity_block_of_dynamic_nodes(real_hook, moto_account, tmp_path):
    """What preflight's rule (min_nodes = max_nodes > 0) stands for: ParallelCluster's own refusal."""
    from ultracluster.parsers.pcluster import ClusterValidationError

    def dynamic(config):
        config["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0]["MinCount"] = 0

    path = tmp_path / "cluster-config.yaml"
    path.write_text(moto_config(moto_account, dynamic, **reservation_for(moto_account, "capacity_block")))
    with pytest.raises(ClusterValidationError) as refused:
        real_hook.create_cluster("uc-real-dryrun", str(path), suppress_validators=MOTO_GAPS, dryrun=True)
    messages = [e["message"] for e in refused.value.configuration_validation_errors]
    assert any("Max count must be set to the same value of min count" in m for m in messages), messages
