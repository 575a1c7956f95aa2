"""The pcluster role's image-build permissions against ParallelCluster's own image build stack
(docs/operations.md, "Least privilege"), as test_pcluster_role_policy.py does for the cluster stack.

The pinned aws-parallelcluster synthesizes the build stack of the node image's configuration as
trn1_build_image renders it, with the production profile's boundary and cleanup role
(scripts/pcluster_synth.py --image-id: `pcluster build-image`'s code, stopped at its CreateStack) against
a moto server. Then the pcluster role (pcluster-role-policy.json plus pcluster-image-build-policy.json)
must grant every action that creates or deletes a resource type of that stack (tests/pcluster_actions.py),
every call the CLI made, and what `pcluster delete-image` does (a reviewed table); the stack's role must
be one its conditions allow, its named resources inside the role's; and the boundary must leave the
build instance what the stack grants it.
"""
from __future__ import annotations

import fnmatch
import json
import os
import subprocess

import boto3
import pytest
import yaml

from tests.iam_policy import BOUNDARY_POLICY, allowing, denials, pcluster_role, render_policy, uncovered_actions
from tests.integration.test_pcluster_real_schema import moto_account, pcluster_python  # noqa: F401 - fixtures
# The cluster stack's checks, run here on this module's stack and role (pytest collects them with this
# module's `templates` and `policy` fixtures): every type has handler permissions or a reviewed row, and
# the role grants every create and delete action of the stack.
from tests.integration.test_pcluster_role_policy import (  # noqa: F401 - collected as this module's tests
    test_every_type_has_handler_permissions_or_a_reviewed_row,
    test_the_policy_grants_every_create_and_delete_action_of_the_stack,
)
from tests.integration.test_pcluster_role_policy import (
    ACCOUNT,
    BOUNDARY_ARN,
    FREE_CALLS,
    IAM_PREFIX,
    MANAGED_POLICY_ACTIONS,
    REGION,
    REPO,
    SYNTH,
    VALUES,
)
from tests.pcluster_actions import resolve, resource_types, resources_of
from ultracluster.run.neuron_versions import load_versions, render_on_node_configured
from ultracluster.run.node_image import ami_tags, image_config, image_id_for
from ultracluster.run.profiles import include_dir

pytestmark = pytest.mark.localcluster  # a moto server, and pcluster's CDK on Node.js

IMAGE_ID = image_id_for(load_versions(), "0" * 40)
CLEANUP_ROLE = f"arn:aws:iam::{ACCOUNT}:role/parallelcluster/ultracluster-image-cleanup"
PSEUDO = {"AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT, "AWS::URLSuffix": "amazonaws.com",
          "AWS::StackName": IMAGE_ID,
          "AWS::StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{IMAGE_ID}/5b2c6a10-2f0e-11f1-9c1e-0a1b"}
# What `pcluster delete-image` and `describe-image` call (pcluster/models/imagebuilder.py: ImageBuilder.delete,
# _check_instance_using_image, _check_image_is_shared, the stack's image_state; the controller's describe)
# with the pcluster role, reviewed: (action, resource) as IAM judges it.
DELETE_IMAGE = [
    ("ec2:DescribeImages", "*"), ("ec2:DescribeInstances", "*"), ("ec2:DescribeImageAttribute", "*"),
    ("cloudformation:DescribeStacks", f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{IMAGE_ID}/id"),
    ("cloudformation:DeleteStack", f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{IMAGE_ID}/id"),
    ("imagebuilder:GetImage",  # the image the build stack made: named after the stack's id, in lower case
     f"arn:aws:imagebuilder:{REGION}:{ACCOUNT}:image/parallelclusterimage-5b2c6a10-2f0e-11f1-9c1e-0a1b/3.16.1/1"),
    ("ec2:DeleteSnapshot", f"arn:aws:ec2:{REGION}::snapshot/snap-0123456789abcdef0"),
    ("s3:ListBucketVersions", "arn:aws:s3:::parallelcluster-0123456789abcdef-v1-do-not-delete"),
    ("s3:DeleteObjectVersion", "arn:aws:s3:::parallelcluster-0123456789abcdef-v1-do-not-delete/parallelcluster/3.16.1/"
                               f"images/{IMAGE_ID}-x/configs/image-config.yaml"),
    ("logs:DeleteLogGroup",
     f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/imagebuilder/ParallelClusterImage-{IMAGE_ID}"),
]


@pytest.fixture(scope="module")
def policy() -> dict:
    return pcluster_role(VALUES)


@pytest.fixture(scope="module")
def synthesized(pcluster_python, moto_account, tmp_path_factory) -> dict:
    """`pcluster build-image` of the node image's configuration, up to its CreateStack."""
    kw = dict(endpoint_url=moto_account["endpoint"], region_name=REGION, aws_access_key_id="testing",
              aws_secret_access_key="testing")
    iam, s3, ec2 = (boto3.client(name, **kw) for name in ("iam", "s3", "ec2"))
    for make in (lambda: iam.create_policy(PolicyName="ultracluster-pcluster-boundary", PolicyDocument=json.dumps(
                     render_policy(BOUNDARY_POLICY.read_text(), VALUES))),
                 lambda: iam.create_role(RoleName="ultracluster-image-cleanup", Path="/parallelcluster/",
                                         AssumeRolePolicyDocument="{}")):
        try:
            make()
        except iam.exceptions.EntityAlreadyExistsException:
            pass
    key = f"runs/images/{IMAGE_ID}/image-setup.sh"
    s3.put_object(Bucket="ultracluster-artifacts", Key=key, Body=render_on_node_configured().encode())
    parent = ec2.describe_images(Owners=["self"], Filters=[
        {"Name": "name", "Values": ["aws-parallelcluster-3.16.1-ubuntu-2204-lts-hvm-*"]}])["Images"][0]["ImageId"]
    config = image_config(yaml.safe_load((include_dir() / "cluster" / "image-config.yaml").read_text()),
                          image_id=IMAGE_ID, region=REGION, parent_image=parent,
                          script_uri=f"s3://ultracluster-artifacts/{key}",
                          tags=ami_tags(load_versions(), "0" * 40, "/ultracluster/node-image/trn1"),
                          permissions_boundary=BOUNDARY_ARN, cleanup_role=CLEANUP_ROLE)
    work = tmp_path_factory.mktemp("synth-image")
    path, out = work / "image-config.yaml", work / "synth.json"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "AWS_ENDPOINT_URL": moto_account["endpoint"], "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION, "HOME": str(work)}
    done = subprocess.run([str(pcluster_python), str(SYNTH), str(path), "--image-id", IMAGE_ID, "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["pclusterVersion"] == "3.16.1" and result["stackName"] == IMAGE_ID
    return result


@pytest.fixture(scope="module")
def templates(synthesized) -> list[dict]:
    return [synthesized["template"]]


def test_the_stack_builds_the_node_image(templates):
    types = resource_types(templates)
    assert {"AWS::ImageBuilder::Image", "AWS::ImageBuilder::Component", "AWS::SNS::Topic",
            "AWS::Lambda::Function", "AWS::IAM::Role"} <= set(types)
    [(_, recipe)] = resources_of(templates, "AWS::ImageBuilder::ImageRecipe")
    assert len(recipe["Components"]) == 3  # ParallelCluster's own, its tag component, the node script
    # What the reviewed UNUSED rows assume: no launch template or SSM parameter distribution.
    [(_, distribution)] = resources_of(templates, "AWS::ImageBuilder::DistributionConfiguration")
    for item in distribution["Distributions"]:
        assert not {"LaunchTemplateConfigurations", "SsmParameterConfigurations"} & set(item)


def test_the_role_grants_every_call_the_cli_made_and_what_delete_image_does(synthesized, policy):
    calls = [c for c in synthesized["awsCalls"] if (c["service"], c["operation"]) not in FREE_CALLS]
    assert {"CreateStack", "PutObject", "DescribeImages", "GetRole", "GetPolicy"} <= {c["operation"] for c in calls}
    scoped = [c for c in calls if c["service"] in ("s3", "cloudformation")]
    assert denials(policy, scoped, REGION, ACCOUNT) == []
    actions = {f"{IAM_PREFIX.get(c['service'], c['service'])}:{c['operation']}" for c in calls if c not in scoped}
    assert uncovered_actions(policy, actions) == []
    from tests.iam_policy import is_allowed

    assert [(a, r) for a, r in DELETE_IMAGE if not is_allowed(policy, a, r)] == []


def _matches_any(arn: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(arn, pattern) for pattern in patterns)


def test_the_stacks_role_and_names_are_inside_the_roles_conditions(templates, policy):
    [(_, role)] = resources_of(templates, "AWS::IAM::Role")
    [create_role] = allowing(policy, "iam:CreateRole")
    [attach] = allowing(policy, "iam:AttachRolePolicy")
    [passing] = allowing(policy, "iam:PassRole")
    assert resolve(role["PermissionsBoundary"], PSEUDO) == BOUNDARY_ARN.replace("<account-id>", ACCOUNT)
    arn = f"arn:aws:iam::{ACCOUNT}:role{role['Path']}generated"
    assert _matches_any(arn, create_role["Resource"]) and _matches_any(arn, passing["Resource"])
    for managed in role["ManagedPolicyArns"]:
        assert _matches_any(resolve(managed, PSEUDO), attach["Condition"]["ArnLike"]["iam:PolicyARN"]), managed
    [(_, function)] = resources_of(templates, "AWS::Lambda::Function")
    assert function["Role"] == CLEANUP_ROLE and _matches_any(CLEANUP_ROLE, passing["Resource"])
    named = {  # type: (its name property, the creating action, the resource ARN of a name)
        "AWS::Lambda::Function": ("FunctionName", "lambda:CreateFunction", "arn:aws:lambda:{r}:{a}:function:{n}"),
        "AWS::Logs::LogGroup": ("LogGroupName", "logs:CreateLogGroup", "arn:aws:logs:{r}:{a}:log-group:{n}"),
        "AWS::SNS::Topic": ("TopicName", "sns:CreateTopic", "arn:aws:sns:{r}:{a}:{n}"),
        "AWS::ImageBuilder::Component": ("Name", "imagebuilder:CreateComponent",
                                         "arn:aws:imagebuilder:{r}:{a}:component/{n}/3.16.1/1"),
        "AWS::ImageBuilder::ImageRecipe": ("Name", "imagebuilder:CreateImageRecipe",
                                           "arn:aws:imagebuilder:{r}:{a}:image-recipe/{n}/3.16.1"),
    }
    checked = 0
    for type_name, (prop, action, pattern) in named.items():
        resources = [r for s in allowing(policy, action) for r in s["Resource"]]
        for logical_id, props in resources_of(templates, type_name):
            name = resolve(props[prop], PSEUDO)
            # Image Builder's ARNs carry the name in lower case.
            name = name.lower() if type_name.startswith("AWS::ImageBuilder") else name
            assert _matches_any(pattern.format(r=REGION, a=ACCOUNT, n=name), resources), (logical_id, name)
            checked += 1
    assert checked >= 6


def test_the_boundary_leaves_the_build_instance_what_the_stack_grants_it(templates):
    boundary = render_policy(BOUNDARY_POLICY.read_text(), VALUES)
    [(_, role)] = resources_of(templates, "AWS::IAM::Role")
    granted = {a for p in role["Policies"] for s in p["PolicyDocument"]["Statement"]
               for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    managed = {resolve(m, PSEUDO) for m in role["ManagedPolicyArns"]}
    assert [m for m in managed if m not in MANAGED_POLICY_ACTIONS] == [], managed
    granted |= {a for m in managed for a in MANAGED_POLICY_ACTIONS[m]}
    assert {"ec2:CreateTags", "ec2:ModifyImageAttribute", "s3:GetObject", "ssm:UpdateInstanceInformation"} <= granted
    assert uncovered_actions(boundary, granted) == []


def test_the_synthesis_script_is_the_one_the_cluster_test_runs():
    assert SYNTH == REPO / "scripts" / "pcluster_synth.py" and "--image-id" in SYNTH.read_text()
