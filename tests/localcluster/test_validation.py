"""Every validation rule of `pcluster create-cluster`: the error pcluster 3.16.1 gives (recorded/), exit 1,
and nothing created: no cluster dir, no stack in moto, no config in S3, no worker process."""
from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.fixtures_localcluster import REGION, prepared_home, processes_mentioning, run_pcluster, wait_until_gone

pytestmark = pytest.mark.localcluster

RECORDED = Path(__file__).parent / "recorded"
# Entries the real run got from moto, not from the config (recorded/README.md).
MOTO_NOISE_TYPES = {"HeadNodeLaunchTemplateValidator", "ComputeResourceLaunchTemplateValidator"}
NAME = "vcheck"


@pytest.fixture(scope="module")
def uc_home(moto_server: str) -> Iterator[Path]:
    """One home for the module: a rejected config creates nothing, so tests cannot disturb each other."""
    with prepared_home(moto_server) as home:
        yield home


def recorded(name: str) -> dict[str, Any]:
    return json.loads((RECORDED / f"{name}.json").read_text())


def recorded_errors(name: str) -> list[dict[str, str]]:
    return [e for e in recorded(name)["configurationValidationErrors"]
            if e["level"] == "ERROR" and e["type"] not in MOTO_NOISE_TYPES and e["message"] != "'KeyType'"]


def queue(config: dict[str, Any]) -> dict[str, Any]:
    return config["Scheduling"]["SlurmQueues"][0]


def resource(config: dict[str, Any]) -> dict[str, Any]:
    return queue(config)["ComputeResources"][0]


def many_queues(config: dict[str, Any]) -> None:
    config["Scheduling"]["SlurmQueues"] = [dict(copy.deepcopy(queue(config)), Name=f"q{i}") for i in range(51)]


def second_storage(**changes: str) -> Callable[[dict[str, Any]], None]:
    return lambda c: c["SharedStorage"].append(dict(copy.deepcopy(c["SharedStorage"][0]), **changes))


# (recorded file, mutation of the valid config); the recorded ERROR entries must come back exactly.
LISTED_RULES: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("no_headnode", lambda c: c.pop("HeadNode")),
    ("headnode_no_instancetype", lambda c: c["HeadNode"].pop("InstanceType")),
    ("headnode_no_subnet", lambda c: c["HeadNode"]["Networking"].pop("SubnetId")),
    ("keypair_missing", lambda c: c["HeadNode"]["Ssh"].update(KeyName="nokey")),
    ("scheduler_not_slurm", lambda c: c["Scheduling"].update(Scheduler="sge")),
    ("no_queues", lambda c: c["Scheduling"].pop("SlurmQueues")),
    ("too_many_queues", many_queues),
    ("queue_name_upper", lambda c: queue(c).update(Name="Compute1")),
    ("queue_name_long", lambda c: queue(c).update(Name="a" * 26)),
    ("dup_queue", lambda c: c["Scheduling"]["SlurmQueues"].append(copy.deepcopy(queue(c)))),
    ("dup_cr", lambda c: queue(c)["ComputeResources"].append(copy.deepcopy(resource(c)))),
    ("cr_name_bad", lambda c: resource(c).update(Name="Trn_1")),
    ("min_gt_max", lambda c: resource(c).update(MinCount=3, MaxCount=2)),
    ("min_negative", lambda c: resource(c).update(MinCount=-1)),
    ("max_zero", lambda c: resource(c).update(MaxCount=0)),
    ("unknown_key", lambda c: c.update(Bogus=1)),
    ("dup_storage_mount", second_storage(Name="fsx2")),
    ("dup_storage_name", second_storage(MountDir="/fsx2")),
]

# (recorded file, mutation): pcluster answers these with a plain {"message"} while loading the config.
PLAIN_RULES: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("validation_headnode_bad_instancetype", lambda c: c["HeadNode"].update(InstanceType="bogus.huge")),
    ("validation_cr_bad_type", lambda c: resource(c).update(InstanceType="garbage")),
]


def assert_nothing_created(env: dict[str, str], home: Path, name: str = NAME) -> None:
    assert not (home / "clusters" / name).exists()
    cfn = boto3.client("cloudformation", region_name=REGION, endpoint_url=env["AWS_ENDPOINT_URL"],
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    with pytest.raises(ClientError, match="does not exist"):
        cfn.describe_stacks(StackName=name)
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=env["AWS_ENDPOINT_URL"],
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    for bucket in s3.list_buckets()["Buckets"]:
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket["Name"]).get("Contents", [])]
        assert not [k for k in keys if f"/clusters/{name}-" in k], keys
    assert processes_mentioning(str(home / "clusters" / name)) == []


def create(env: dict[str, str], config: Path, name: str = NAME, *extra: str) -> tuple[int, Any]:
    return run_pcluster(env, "create-cluster", "-n", name, "-c", str(config), *extra)


@pytest.mark.parametrize(("case", "mutate"), LISTED_RULES, ids=[c for c, _ in LISTED_RULES])
def test_rule_gives_the_recorded_pcluster_error(case: str, mutate: Callable[[dict[str, Any]], None],
                                                make_cluster_config: Callable[..., Path],
                                                uc_env: dict[str, str], uc_home: Path) -> None:
    code, out = create(uc_env, make_cluster_config(mutate))
    assert code == 1
    assert out["message"] == "Invalid cluster configuration."
    assert [e for e in out["configurationValidationErrors"] if e["level"] == "ERROR"] == recorded_errors(
        f"validation_{case}")
    assert_nothing_created(uc_env, uc_home)


@pytest.mark.parametrize(("case", "mutate"), PLAIN_RULES, ids=[c for c, _ in PLAIN_RULES])
def test_unknown_instance_type_gives_the_plain_pcluster_message(
        case: str, mutate: Callable[[dict[str, Any]], None], make_cluster_config: Callable[..., Path],
        uc_env: dict[str, str], uc_home: Path) -> None:
    code, out = create(uc_env, make_cluster_config(mutate))
    assert (code, out) == (1, recorded(case))
    assert_nothing_created(uc_env, uc_home)


def test_missing_key_name_is_an_error_with_the_pcluster_message(
        make_cluster_config: Callable[..., Path], uc_env: dict[str, str], uc_home: Path) -> None:
    code, out = create(uc_env, make_cluster_config(lambda c: c["HeadNode"].pop("Ssh")))
    real = [e for e in recorded("validation_headnode_no_keyname")["configurationValidationErrors"]
            if e["type"] == "KeyPairValidator"]
    assert code == 1
    # pcluster only warns; a local head node without a key cannot be reached, so here it is an ERROR.
    assert out["configurationValidationErrors"] == [dict(real[0], level="ERROR")]
    assert_nothing_created(uc_env, uc_home)


def test_null_section_like_marshmallow(make_cluster_config: Callable[..., Path], uc_env: dict[str, str],
                                      uc_home: Path) -> None:
    # pcluster 3.16.1's ClusterSchema answers {'Tags': ['Field may not be null.']} for an empty `Tags:`.
    code, out = create(uc_env, make_cluster_config(lambda c: c.update(Tags=None)))
    assert code == 1
    assert out["configurationValidationErrors"] == [{
        "level": "ERROR", "type": "ConfigSchemaValidator", "message": "[('Tags', ['Field may not be null.'])]"}]
    assert_nothing_created(uc_env, uc_home)


def test_empty_queue_list(make_cluster_config: Callable[..., Path], uc_env: dict[str, str],
                          uc_home: Path) -> None:
    code, out = create(uc_env, make_cluster_config(lambda c: c["Scheduling"].update(SlurmQueues=[])))
    assert code == 1
    assert out["configurationValidationErrors"] == [{
        "level": "ERROR", "type": "ConfigSchemaValidator",
        "message": "[('Scheduling', {'SlurmQueues': ['Shorter than minimum length 1.']})]"}]
    assert_nothing_created(uc_env, uc_home)


def test_subnet_unknown_to_ec2(make_cluster_config: Callable[..., Path], uc_env: dict[str, str],
                               uc_home: Path) -> None:
    def use_missing_subnet(config: dict[str, Any]) -> None:
        config["HeadNode"]["Networking"]["SubnetId"] = "subnet-12345678"
    code, out = create(uc_env, make_cluster_config(use_missing_subnet))
    assert (code, out) == (1, recorded("error_subnet_not_found"))
    assert_nothing_created(uc_env, uc_home)


def test_cluster_name_not_matching_the_pattern(make_cluster_config: Callable[..., Path], uc_env: dict[str, str],
                                               uc_home: Path) -> None:
    code, out = create(uc_env, make_cluster_config(), "1bad")
    assert (code, out) == (1, recorded("error_cluster_name_pattern"))
    assert_nothing_created(uc_env, uc_home, "1bad")


def test_cluster_name_too_long(make_cluster_config: Callable[..., Path], uc_env: dict[str, str],
                               uc_home: Path) -> None:
    name = "c" * 61
    code, out = create(uc_env, make_cluster_config(), name)
    assert code == 1
    assert out["configurationValidationErrors"] == [{
        "level": "ERROR", "type": "ClusterNameValidator",
        "message": "Error: The cluster name can contain only alphanumeric characters (case-sensitive) and hyphens. "
                   "It must start with an alphabetic character and can't be longer than 60 characters."}]
    assert_nothing_created(uc_env, uc_home, name)


@pytest.mark.parametrize(("knob", "value", "said"), [
    ("fail-create", "Oops", "Oops"),
    # Node faults name a node of the config (dynamic=2: compute1-dy-trn1-1 and -2), NODE or NODE:always.
    ("efa-unhealthy", "compute1-dy-trn1-3", "efa-unhealthy: 'compute1-dy-trn1-3' is not a compute node"),
    ("neuron-unhealthy", "compute1-dy-trn1-1:sometimes", "neuron-unhealthy: a node fault target is NODE or NODE:always"),
])
def test_bad_fault_tag(knob: str, value: str, said: str, make_cluster_config: Callable[..., Path],
                       uc_env: dict[str, str], uc_home: Path) -> None:
    config = make_cluster_config(tags={f"local-ultracluster:{knob}": value})
    code, out = create(uc_env, config, NAME, "--suppress-validators", "ALL")   # cannot be suppressed
    assert code == 1
    [error] = out["configurationValidationErrors"]
    assert (error["level"], error["type"]) == ("ERROR", "LocalUltraClusterFaultValidator")
    assert said in error["message"], error["message"]
    assert_nothing_created(uc_env, uc_home)


def test_not_yaml(uc_home: Path, uc_env: dict[str, str]) -> None:
    config = uc_home / "broken.yaml"
    config.write_text("HeadNode: [unclosed\n")
    code, out = create(uc_env, config)
    assert code == 1
    assert out["message"].startswith("Bad Request: Configuration must be a valid YAML document.")
    assert_nothing_created(uc_env, uc_home)


def test_config_file_missing(uc_env: dict[str, str], uc_home: Path) -> None:
    code, out = run_pcluster(uc_env, "create-cluster", "-n", "abc", "-c", "/nonexistent.yaml")
    assert (code, out) == (1, recorded("error_config_file_not_found"))
    assert_nothing_created(uc_env, uc_home, "abc")


def test_dryrun_validates_only(make_cluster_config: Callable[..., Path], uc_env: dict[str, str],
                               uc_home: Path) -> None:
    code, out = create(uc_env, make_cluster_config(), NAME, "--dryrun", "true")
    assert (code, out) == (1, {"message": recorded("create_cluster_dryrun")["message"]})
    assert_nothing_created(uc_env, uc_home)


def test_suppressed_validator_lets_the_config_through_dryrun(
        make_cluster_config: Callable[..., Path], uc_env: dict[str, str], uc_home: Path) -> None:
    config = make_cluster_config(lambda c: resource(c).update(MinCount=3, MaxCount=2))
    code, out = create(uc_env, config, NAME, "--dryrun", "true", "--suppress-validators",
                       "type:ComputeResourceSizeValidator")
    assert (code, out["message"]) == (1, "Request would have succeeded, but DryRun flag is set.")
    assert_nothing_created(uc_env, uc_home)


def pipeline_keys(config: dict[str, Any]) -> None:
    """The keys render_config adds to the seed's layout: compute storage, log retention, a custom AMI."""
    config["Image"]["CustomAmi"] = "ami-0123456789abcdef0"
    queue(config)["ComputeSettings"] = {"LocalStorage": {"RootVolume": {"Size": 1024},
                                                         "EphemeralVolume": {"MountDir": "/local_storage"}}}
    config["Monitoring"] = {"Logs": {"CloudWatch": {"Enabled": True, "RetentionInDays": 14}}}


def test_the_pipelines_storage_monitoring_and_image_keys_pass_dryrun(
        make_cluster_config: Callable[..., Path], uc_env: dict[str, str], uc_home: Path) -> None:
    code, out = create(uc_env, make_cluster_config(pipeline_keys), NAME, "--dryrun", "true")
    assert (code, out["message"]) == (1, "Request would have succeeded, but DryRun flag is set."), out
    assert_nothing_created(uc_env, uc_home)


def test_a_retention_pcluster_refuses_is_refused(make_cluster_config: Callable[..., Path],
                                                 uc_env: dict[str, str], uc_home: Path) -> None:
    def mutate(config: dict[str, Any]) -> None:
        pipeline_keys(config)
        config["Monitoring"]["Logs"]["CloudWatch"]["RetentionInDays"] = 2

    code, out = create(uc_env, make_cluster_config(mutate))
    assert code == 1
    [error] = out["configurationValidationErrors"]
    assert error["type"] == "ConfigSchemaValidator"
    assert "'Monitoring', {'Logs': {'CloudWatch': {'RetentionInDays': ['Must be one of: 1, 3, 5" in error["message"]
    assert_nothing_created(uc_env, uc_home)


def test_existing_cluster_name_is_refused(make_cluster_config: Callable[..., Path], uc_env: dict[str, str],
                                          uc_home: Path) -> None:
    # A cluster that stays CREATE_IN_PROGRESS (long delay) and never starts daemons (fail-create).
    slow = make_cluster_config(tags={"local-ultracluster:provisioning-delay": "600",
                                     "local-ultracluster:fail-create": "OnNodeConfiguredExecutionFailure"})
    code, _ = create(uc_env, slow, "taken")
    assert code == 0
    stack_before = json.loads((uc_home / "clusters" / "taken" / "cluster.json").read_text())["cloudformationStackArn"]
    code, out = create(uc_env, make_cluster_config(), "taken")
    assert (code, out) == (1, {"message": "Bad Request: Cluster taken already exists."})
    assert recorded("error_cluster_already_exists") == {"message": "Bad Request: Cluster probe already exists."}
    stack_after = json.loads((uc_home / "clusters" / "taken" / "cluster.json").read_text())["cloudformationStackArn"]
    assert stack_after == stack_before
    code, _ = run_pcluster(uc_env, "delete-cluster", "-n", "taken")
    assert code == 0
    wait_until_gone(uc_env, "taken")  # its stack too: the session's moto is shared with later tests


def test_warnings_come_back_as_validation_messages_or_fail_at_warning_level(
        make_cluster_config: Callable[..., Path], uc_env: dict[str, str], uc_home: Path) -> None:
    # pcluster 3.16.1 rejects the blog-era ubuntu2004 (recorded); here it is a WARNING so old configs run.
    assert recorded_errors("validation_os_ubuntu2004")[0]["type"] == "ConfigSchemaValidator"
    config = make_cluster_config(lambda c: c["Image"].update(Os="ubuntu2004"))
    code, out = create(uc_env, config, NAME, "--dryrun", "true")
    assert code == 1 and out["message"] == "Request would have succeeded, but DryRun flag is set."
    [warning] = out["validationMessages"]
    assert (warning["level"], warning["type"]) == ("WARNING", "LocalUltraClusterOsValidator")
    code, out = create(uc_env, config, NAME, "--validation-failure-level", "WARNING")
    assert (code, out["message"]) == (1, "Invalid cluster configuration.")
    assert out["configurationValidationErrors"] == [warning]
    assert_nothing_created(uc_env, uc_home)
