"""preflight's account checks against the moto server: S3 locations, key pair, instance type offerings
by AZ id (moto offers trn1.32xlarge in use1-az4/5/6 only), the Trn vCPU quota; and the tag rules."""
from __future__ import annotations

import logging

import boto3
import pytest

from tests.integration.test_dataset import aws_conn, empty_bucket, moto_endpoint  # noqa: F401 - fixtures
from ultracluster.hooks.account import AccountHook
from ultracluster.operators.account_checks import account_problems
from ultracluster.run.cost import load_prices
from ultracluster.run.profiles import load_profile
from ultracluster.run.tags import tag_problems

DATASET = "training_datasets/bert.tar"
LOG = logging.getLogger("test")


@pytest.fixture
def account(aws_conn, moto_endpoint):
    aws_conn.put_object(Bucket="neuron-s3", Key=DATASET, Body=b"tar")
    empty_bucket(aws_conn, "ultracluster-artifacts")
    ec2 = boto3.client("ec2", endpoint_url=moto_endpoint, region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    if not ec2.describe_key_pairs(Filters=[{"Name": "key-name", "Values": ["uc-test-key"]}])["KeyPairs"]:
        ec2.create_key_pair(KeyName="uc-test-key")
    return aws_conn


def plan(**changes) -> dict:
    return {**load_profile("local"), "dataset_s3_uri": f"s3://neuron-s3/{DATASET}", "key_name": "uc-test-key",
            "compile_cache_s3_uri": None, **changes}


def check(**changes) -> list[str]:
    return account_problems(plan(**changes), "uc_test_aws", "run-1.probe", load_prices(), LOG)


def test_a_good_plan_has_no_problems_and_leaves_no_probe(account, caplog):
    with caplog.at_level(logging.WARNING):
        assert check() == []
    assert account.list_objects_v2(Bucket="ultracluster-artifacts").get("KeyCount") == 0
    # moto's Service Quotas does not answer for EC2: said in the log, not a failure.
    assert "Trn vCPU quota not checked" in caplog.text


@pytest.mark.parametrize("changes, expected", [
    ({"dataset_s3_uri": "s3://neuron-s3/training_datasets/typo.tar"},
     "dataset_s3_uri: no object s3://neuron-s3/training_datasets/typo.tar"),
    ({"dataset_s3_uri": "s3://no-such-bucket-uc/x.tar"}, "dataset_s3_uri: bucket no-such-bucket-uc does not exist"),
    ({"artifacts_s3_uri": "s3://no-such-bucket-uc/runs"}, "artifacts_s3_uri: bucket no-such-bucket-uc does not exist"),
    ({"compile_cache_s3_uri": "s3://no-such-bucket-uc/cache"},
     "compile_cache_s3_uri: bucket no-such-bucket-uc does not exist"),
    ({"key_name": "nobody"}, "key_name: no key pair 'nobody' in us-east-1"),
    ({"availability_zone_id": "use1-az1"},
     "instance_type: trn1.32xlarge is not offered in availability zone id use1-az1"),
    ({"extra_queues": [{"name": "big", "instance_type": "trn2.48xlarge", "max_nodes": 1}]},
     "extra_queues[big].instance_type: trn2.48xlarge is not offered in availability zone id use1-az6"),
])
def test_each_problem_names_its_param(account, changes, expected):
    problems = check(**changes)
    assert len(problems) == 1 and problems[0].startswith(expected), problems


def test_every_problem_is_reported_at_once(account):
    problems = check(key_name="nobody", availability_zone_id="use1-az1", dataset_s3_uri="s3://neuron-s3/typo")
    assert [p.split(":")[0] for p in problems] == ["dataset_s3_uri", "key_name", "instance_type"]


@pytest.mark.parametrize("quota, problems", [(1024.0, 0), (128.0, 1)])
def test_the_trn_vcpu_quota_must_cover_max_nodes(account, monkeypatch, quota, problems):
    monkeypatch.setattr(AccountHook, "get_service_quota", lambda self, service, code: quota)
    found = check(max_nodes=2)   # 2 x 128 vCPUs
    assert len(found) == problems
    if problems:
        assert found[0].startswith("max_nodes: 2 × trn1.32xlarge needs 256 vCPUs, over the account's Running "
                                   "On-Demand Trn instances quota of 128 (L-2C3B7624)")


@pytest.mark.parametrize("tags, expected", [
    ({}, []), (None, []), ({"team": "ml", "cost-center": "42"}, []),
    ({"aws:created-by": "me"}, ["extra_tags: key 'aws:created-by' uses a reserved prefix"]),
    ({"ParallelCluster:x": "y"}, ["extra_tags: key 'ParallelCluster:x' uses a reserved prefix"]),
    ({"k": "v" * 257}, ["extra_tags: the value of 'k' is 257 characters (at most 256)"]),
    ({"k" * 129: "v"}, ["extra_tags: key 'kkkk"]),
    ({"bad#key": "v"}, ["extra_tags: 'bad#key' has characters AWS tags do not allow"]),
    ({f"t{i}": "v" for i in range(48)}, ["extra_tags: 48 tags plus the pipeline's 5 exceed AWS's 50 per resource"]),
    (["not", "a", "dict"], ["extra_tags must be an object"]),
])
def test_tag_rules(tags, expected):
    problems = tag_problems(tags)
    assert len(problems) == len(expected) and all(p.startswith(e) for p, e in zip(problems, expected)), problems
