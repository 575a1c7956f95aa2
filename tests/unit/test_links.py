"""Operator extra links (registered by the provider: tests/unit/test_provider.py)."""
from __future__ import annotations


from ultracluster.links import (
    CloudFormationStackLink,
    ClusterConfigLink,
    ParallelClusterStackLink,
    S3ResultsLink,
)


def test_stack_link_escapes_the_arn():
    url = ParallelClusterStackLink().format_link(
        region_name="us-east-1", stack_name="arn:aws:cloudformation:us-east-1:1:stack/uc-x/abc")
    assert url == ("https://console.aws.amazon.com/cloudformation/home?region=us-east-1#/stacks/stackinfo?"
                   "stackId=arn%3Aaws%3Acloudformation%3Aus-east-1%3A1%3Astack/uc-x/abc")


def test_s3_links():
    assert ClusterConfigLink().format_link(region_name="us-east-1", bucket="b", key="runs/x/cluster-config.yaml") == (
        "https://s3.console.aws.amazon.com/s3/object/b?region=us-east-1&prefix=runs/x/cluster-config.yaml")
    assert S3ResultsLink().format_link(region_name="us-east-1", bucket="b", prefix="runs/x") == (
        "https://s3.console.aws.amazon.com/s3/buckets/b?region=us-east-1&prefix=runs/x/")


def test_missing_values_give_no_link():
    assert CloudFormationStackLink().format_link(region_name="us-east-1") == ""


def test_persist_pushes_under_the_links_key():
    pushed = {}

    class TaskInstance:
        def xcom_push(self, key, value):
            pushed[key] = value

    CloudFormationStackLink.persist(context={"ti": TaskInstance()}, region_name="us-east-1", stack_name="s")
    assert pushed == {"ultracluster_cloudformation_stack": {"region_name": "us-east-1", "stack_name": "s"}}


def test_links_have_distinct_names_and_keys():
    links = [CloudFormationStackLink, ClusterConfigLink, S3ResultsLink, ParallelClusterStackLink]
    assert len({link.name for link in links}) == len({link.key for link in links}) == len(links)


def test_the_provider_registers_every_link():
    from ultracluster.get_provider_info import get_provider_info

    assert set(get_provider_info()["extra-links"]) == {
        f"{link.__module__}.{link.__qualname__}"
        for link in (CloudFormationStackLink, ClusterConfigLink, S3ResultsLink, ParallelClusterStackLink)}
