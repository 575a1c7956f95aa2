"""run.node_iam: what the cluster's node roles may do (docs/operations.md, "The node roles"), and
run.s3.customer_kms_key, which decides whether they need kms:Decrypt."""
from __future__ import annotations

import pytest
from ultracluster.run import node_iam
from ultracluster.run.s3 import customer_kms_key, sse_args

KEY_ARN = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
KMS_POLICY = "arn:aws:iam::123456789012:policy/ultracluster-node-kms"
BOUNDARY = "arn:aws:iam::123456789012:policy/ultracluster-pcluster-boundary"
SSM = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"


@pytest.mark.parametrize(("mode", "key", "customer"), [
    ("AES256", None, None),
    ("aws:kms", None, None),                                  # the account's aws/s3 key
    ("aws:kms", "alias/aws/s3", None),                        # the same, named
    ("aws:kms", "arn:aws:kms:us-east-1:123456789012:alias/aws/s3", None),
    ("aws:kms", KEY_ARN, KEY_ARN),
    ("aws:kms", "alias/ultracluster", "alias/ultracluster"),
    ("aws:kms", "1234abcd-12ab-34cd-56ef-1234567890ab", "1234abcd-12ab-34cd-56ef-1234567890ab"),
])
def test_a_customer_managed_key_is_any_key_but_the_accounts_aws_s3_one(mode, key, customer):
    assert customer_kms_key(sse_args(mode, key)) == customer
    assert customer_kms_key(None) is None


def test_the_nodes_read_the_prefix_of_their_script_only():
    uri = "s3://ultracluster-artifacts/runs/trn1_bert_pretrain/manual-x/on_node_configured.sh"
    assert node_iam.s3_access(uri) == [{"BucketName": "ultracluster-artifacts",
                                         "KeyName": "runs/trn1_bert_pretrain/manual-x/*"}]
    assert node_iam.s3_access("s3://b-b/script.sh") == [{"BucketName": "b-b", "KeyName": "script.sh"}]


def test_the_head_node_gets_ssm_and_both_get_the_kms_policy_only_with_a_customer_key():
    assert node_iam.additional_policies("us-east-1", sse_args(), None) == {"head_node": [SSM], "compute": []}
    assert node_iam.additional_policies("us-east-1", sse_args("aws:kms"), KMS_POLICY) == {
        "head_node": [SSM], "compute": []}
    assert node_iam.additional_policies("us-east-1", sse_args("aws:kms", KEY_ARN), KMS_POLICY) == {
        "head_node": [SSM, KMS_POLICY], "compute": [KMS_POLICY]}
    assert node_iam.additional_policies("cn-north-1", sse_args(), None)["head_node"] == [
        "arn:aws-cn:iam::aws:policy/AmazonSSMManagedInstanceCore"]
    assert node_iam.partition("us-gov-west-1") == "aws-us-gov" and node_iam.partition("eu-west-1") == "aws"


def test_a_customer_key_needs_the_node_policy_and_the_policy_needs_the_key():
    assert node_iam.iam_problems(sse_args("aws:kms", KEY_ARN), KMS_POLICY) == []
    assert node_iam.iam_problems(sse_args(), None) == []
    [missing] = node_iam.iam_problems(sse_args("aws:kms", KEY_ARN), None)
    assert missing.startswith("node_kms_policy_arn: not set") and "ULTRACLUSTER_NODE_KMS_POLICY_ARN" in missing
    assert "NodeKmsPolicyArn" in missing and KEY_ARN in missing
    [needless] = node_iam.iam_problems(sse_args(), KMS_POLICY)
    assert needless.startswith("node_kms_policy_arn:") and "clear it" in needless


def test_an_empty_boundary_is_refused_where_required_with_what_to_set():
    assert node_iam.iam_problems(sse_args(), None, None, boundary_required=False) == []
    assert node_iam.iam_problems(sse_args(), None, BOUNDARY, boundary_required=True) == []
    for empty in (None, "", "  "):
        [problem] = node_iam.iam_problems(sse_args(), None, empty, boundary_required=True)
        assert problem.startswith("permissions_boundary_arn: not set.")
        for words in ("iam:CreateRole would be denied", "ULTRACLUSTER_PERMISSIONS_BOUNDARY_ARN",
                      "PermissionsBoundaryArn"):
            assert words in problem


@pytest.mark.parametrize("value", ["ultracluster-pcluster-boundary", "arn:aws:iam::123:policy/x",
                                   "arn:aws:iam::123456789012:role/x"])
def test_a_value_that_is_no_policy_arn_is_refused(value):
    [problem] = node_iam.iam_problems(sse_args(), None, value)
    assert problem.startswith(f"permissions_boundary_arn: {value!r} is not an IAM policy ARN")
    [problem] = node_iam.iam_problems(sse_args("aws:kms", KEY_ARN), value)
    assert problem.startswith(f"node_kms_policy_arn: {value!r} is not an IAM policy ARN")
