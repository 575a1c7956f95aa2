"""The enforced moto server (tests/fixtures/moto_enforced.py) judges the Airflow policy as AWS does,
where moto alone would not: calls of a user holding exactly include/cluster/iam/airflow-policy.json,
allowed and denied. The end-to-end runs under enforcement (tests/e2e/test_pipeline.py) rely on it."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.fixtures_enforced import client, make_user
from tests.fixtures_localcluster import FAKE_AWS
from tests.iam_policy import AIRFLOW_POLICY, render_policy

pytestmark = pytest.mark.localcluster

ACCOUNT = "123456789012"
VALUES = {"region": "us-east-1", "account-id": ACCOUNT, "dataset-bucket": "uc-dataset", "dataset-key": "data/bert.tar",
          "artifacts-bucket": "uc-artifacts", "artifacts-prefix": "runs", "compile-cache-bucket": "uc-cache",
          "compile-cache-prefix": "neuron", "kms-key-arn": f"arn:aws:kms:us-east-1:{ACCOUNT}:key/k1"}
TEMPLATE = '{"Resources": {"Handle": {"Type": "AWS::CloudFormation::WaitConditionHandle"}}}'


@pytest.fixture(scope="module")
def airflow(enforced_moto):
    s3 = client(enforced_moto, "s3")
    for bucket in ("uc-dataset", "uc-artifacts", "uc-cache"):
        s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket="uc-dataset", Key="data/bert.tar", Body=b"tar")
    s3.put_object(Bucket="uc-dataset", Key="data/other.tar", Body=b"tar")
    return make_user(enforced_moto, "uc-airflow-test", render_policy(AIRFLOW_POLICY.read_text(), VALUES))


def denied(call) -> str:
    with pytest.raises(ClientError) as raised:
        call()
    code = raised.value.response["Error"]["Code"]
    assert code in ("AccessDenied", "403", "UnauthorizedOperation"), raised.value
    return str(raised.value)


def test_the_local_clusters_principal_may_do_everything_and_nobody_else_is_known(enforced_moto, airflow):
    users = client(enforced_moto, "iam").list_users()["Users"]
    assert {u["UserName"] for u in users} >= {"local-ultracluster", airflow.name}
    assert client(enforced_moto, "iam", FAKE_AWS["AWS_ACCESS_KEY_ID"], FAKE_AWS["AWS_SECRET_ACCESS_KEY"]).list_users()["Users"]
    assert airflow.client("sts").get_caller_identity()["Arn"] == airflow.arn
    with pytest.raises(ClientError, match="InvalidClientTokenId"):
        client(enforced_moto, "sts", "unknown", "unknown").get_caller_identity()
    with pytest.raises(ClientError, match="SignatureDoesNotMatch"):
        client(enforced_moto, "sts", airflow.key, "not-the-secret").get_caller_identity()


def test_s3_as_iam_judges_it(airflow):
    s3 = airflow.client("s3")
    assert s3.get_object(Bucket="uc-dataset", Key="data/bert.tar")["Body"].read() == b"tar"
    s3.head_bucket(Bucket="uc-dataset")                       # moto's HeadBucket is IAM's s3:ListBucket
    with pytest.raises(ClientError, match="NoSuchPublicAccessBlock"):   # s3:GetBucketPublicAccessBlock
        s3.get_public_access_block(Bucket="uc-artifacts")
    denied(lambda: s3.get_object(Bucket="uc-dataset", Key="data/other.tar"))
    denied(lambda: s3.put_object(Bucket="uc-dataset", Key="data/bert.tar", Body=b"x"))
    s3.put_object(Bucket="uc-artifacts", Key="runs/a", Body=b"x")
    denied(lambda: s3.put_object(Bucket="uc-artifacts", Key="elsewhere/a", Body=b"x"))
    # A multi-object delete is s3:DeleteObject on each key (moto alone judges the bucket, and denies).
    done = s3.delete_objects(Bucket="uc-artifacts", Delete={"Objects": [{"Key": "runs/a"}]})
    assert [d["Key"] for d in done["Deleted"]] == ["runs/a"] and not done.get("Errors")
    client(airflow.endpoint, "s3").put_object(Bucket="uc-artifacts", Key="elsewhere/b", Body=b"x")
    done = s3.delete_objects(Bucket="uc-artifacts", Delete={"Objects": [{"Key": "elsewhere/b"}]})
    assert [e["Code"] for e in done["Errors"]] == ["AccessDenied"]


def fetch(url: str, data: bytes | None = None, headers: dict | None = None) -> int:
    request = urllib.request.Request(url, data=data, method="PUT" if data is not None else "GET", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_presigned_urls_carry_their_signers_permissions(airflow):
    """What the head node does with the URLs Airflow signs: allowed inside the policy, not outside;
    a tampered signature, an expired URL and an unsigned request are refused."""
    from botocore.config import Config

    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=airflow.endpoint, aws_access_key_id=airflow.key,
                      aws_secret_access_key=airflow.secret, config=Config(signature_version="s3v4"))  # as ArtifactsS3Hook
    url = lambda method, bucket, key, ExpiresIn=60, **params: s3.generate_presigned_url(  # noqa: E731
        method, Params={"Bucket": bucket, "Key": key, **params}, ExpiresIn=ExpiresIn)
    assert fetch(url("get_object", "uc-dataset", "data/bert.tar")) == 200
    assert fetch(url("put_object", "uc-artifacts", "runs/results.json"), b"{}") == 200
    assert fetch(url("put_object", "uc-cache", "neuron/cache.tar"), b"tar") == 200
    # The pipeline's uploads carry their encryption header, signed in (ArtifactsS3Hook.upload_headers).
    sse = url("put_object", "uc-artifacts", "runs/log.txt", ServerSideEncryption="AES256")
    assert fetch(sse, b"log", {"x-amz-server-side-encryption": "AES256"}) == 200
    assert fetch(sse, b"log", {"x-amz-server-side-encryption": "aws:kms"}) == 403
    assert fetch(url("get_object", "uc-dataset", "data/other.tar")) == 403
    assert fetch(url("put_object", "uc-artifacts", "elsewhere/x"), b"x") == 403
    good = url("get_object", "uc-dataset", "data/bert.tar")
    assert fetch(good.replace("data/bert.tar", "data/other.tar")) == 403     # the signature covers the key
    short = url("get_object", "uc-dataset", "data/bert.tar", ExpiresIn=1)
    time.sleep(2)
    assert fetch(short) == 403
    assert fetch(f"{airflow.endpoint}/uc-dataset/data/bert.tar") == 403
    # Signature V2 (botocore's default for S3 URLs) is refused: the pipeline presigns with V4 only.
    assert fetch(airflow.client("s3").generate_presigned_url(
        "get_object", Params={"Bucket": "uc-dataset", "Key": "data/bert.tar"})) == 403


def test_cloudformation_and_quotas_are_judged_on_their_arns(airflow):
    cfn = airflow.client("cloudformation")
    cfn.create_stack(StackName="uc-vpc-enforced", TemplateBody=TEMPLATE)
    assert cfn.describe_stacks(StackName="uc-vpc-enforced")["Stacks"]
    cfn.delete_stack(StackName="uc-vpc-enforced")
    message = denied(lambda: cfn.create_stack(StackName="someone-elses", TemplateBody=TEMPLATE))
    assert "cloudformation:CreateStack" in message          # AWS names the action; the task log shows it
    denied(lambda: cfn.delete_stack(StackName="someone-elses"))
    quotas = airflow.client("service-quotas")
    with pytest.raises(ClientError) as other:
        quotas.get_service_quota(ServiceCode="ec2", QuotaCode="L-1216C47A")
    # moto answers a JSON-protocol service's denial in XML: botocore reads only the status, 403.
    assert other.value.response["Error"]["Code"] in ("AccessDenied", "AccessDeniedException", "403")
    try:
        quotas.get_service_quota(ServiceCode="ec2", QuotaCode="L-2C3B7624")
    except ClientError as err:   # moto may not know the quota; the point is it was not denied
        assert err.response["Error"]["Code"] not in ("AccessDenied", "AccessDeniedException", "403"), err
    # SSM: the node image parameter under /ultracluster/ only (preflight reads it, trn1_build_image writes it).
    ssm = airflow.client("ssm")
    ssm.put_parameter(Name="/ultracluster/node-image/enforced", Value="ami-12c6146b", Type="String")
    assert ssm.get_parameter(Name="/ultracluster/node-image/enforced")["Parameter"]["Value"] == "ami-12c6146b"
    with pytest.raises(ClientError) as elsewhere:
        ssm.get_parameter(Name="/someone-else/secret")
    assert elsewhere.value.response["Error"]["Code"] in ("AccessDenied", "AccessDeniedException", "403")


def test_ec2_reads_pass_and_writes_only_through_cloudformation(airflow):
    ec2 = airflow.client("ec2")
    assert ec2.describe_vpcs()["Vpcs"]
    # The policy's EC2 writes hold only with aws:CalledVia CloudFormation: a direct call is denied.
    assert "ec2:CreateVpc" in denied(lambda: ec2.create_vpc(CidrBlock="10.9.0.0/16"))
    denied(lambda: ec2.terminate_instances(InstanceIds=["i-0123456789abcdef0"]))
    denied(lambda: airflow.client("iam").list_users())


def test_iam_policy_reads_are_judged_on_the_policys_arn(enforced_moto):
    """ParallelCluster's validators read the policies a config names (iam:GetPolicy); the pcluster role's
    statement names them, and AWS's managed ones must exist."""
    iam = client(enforced_moto, "iam")
    document = json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}]})
    mine, other = (iam.create_policy(PolicyName=f"uc-enforced-{name}", PolicyDocument=document)["Policy"]["Arn"]
                   for name in ("mine", "other"))
    managed = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
    reader = make_user(enforced_moto, "uc-policy-reader", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "iam:GetPolicy", "Resource": [mine, managed]}]})
    assert reader.client("iam").get_policy(PolicyArn=mine)["Policy"]["Arn"] == mine
    assert reader.client("iam").get_policy(PolicyArn=managed)["Policy"]["PolicyName"] == "AmazonSSMManagedInstanceCore"
    assert "iam:GetPolicy" in denied(lambda: reader.client("iam").get_policy(PolicyArn=other))
