"""Encryption at rest: every S3 write of the pipeline carries the deployment's server-side encryption
(docs/operations.md, "Encryption"). Against the real moto server, which records an object's
ServerSideEncryption only when the PUT asked for it, so an unencrypted write shows."""
from __future__ import annotations

import json
import logging
import urllib.parse
from types import SimpleNamespace

import pytest

from tests.unit.test_config import s3  # noqa: F401 - fixture: in-process moto, as the render tests use
from tests.integration.test_dataset import LocalShellHeadNode, aws_conn, empty_bucket, head, moto_endpoint  # noqa: F401
from tests.integration.test_results import HEAD, OutletEvents, job_outputs
from ultracluster import remote_commands as rc
from ultracluster.hooks.artifacts import ArtifactsS3Hook
from ultracluster.operators.results import CollectResultsOperator
from ultracluster.run.s3 import EncryptionError, check_sse, profile_sse, sse_args, sse_headers

BUCKET = "ultracluster-artifacts"
KMS = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "arn:aws:kms:us-east-1:123456789012:key/uc-test"}
RUN_ID = "manual__2026-12-01T08:00:00+00:00"


def encryption(client, key: str, bucket: str = BUCKET) -> tuple[str | None, str | None]:
    head = client.head_object(Bucket=bucket, Key=key)
    return head.get("ServerSideEncryption"), head.get("SSEKMSKeyId")


@pytest.fixture
def artifacts(aws_conn):
    empty_bucket(aws_conn, BUCKET)
    return aws_conn


# --- the setting -------------------------------------------------------------------------------

def test_sse_s3_is_the_default_and_sse_kms_takes_an_optional_key():
    assert sse_args() == sse_args("AES256") == check_sse(None) == {"ServerSideEncryption": "AES256"}
    assert sse_args("aws:kms") == {"ServerSideEncryption": "aws:kms"}  # the account's aws/s3 key
    assert sse_args("aws:kms", "alias/uc") == {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "alias/uc"}
    # A profile's unset ${VAR:-} is "": off.
    assert profile_sse({"s3_encryption": "", "s3_kms_key_id": ""}) == {"ServerSideEncryption": "AES256"}
    assert profile_sse({"s3_encryption": "aws:kms", "s3_kms_key_id": "k"}) == sse_args("aws:kms", "k")
    assert sse_headers(KMS) == [("x-amz-server-side-encryption", "aws:kms"),
                                ("x-amz-server-side-encryption-aws-kms-key-id", KMS["SSEKMSKeyId"])]


@pytest.mark.parametrize("args, message", [
    (("none", None), "s3_encryption must be one of AES256, aws:kms"),
    (("AES256", "alias/uc"), "set s3_encryption to aws:kms or clear the key"),
])
def test_a_bad_setting_fails_clearly(args, message):
    with pytest.raises(EncryptionError, match=message):
        sse_args(*args)


def test_operators_refuse_anything_but_the_encryption_parameters():
    with pytest.raises(EncryptionError, match="ServerSideEncryption"):
        check_sse({"ACL": "public-read"})
    with pytest.raises(EncryptionError):
        ArtifactsS3Hook(aws_conn_id="uc_test_aws", sse={"ServerSideEncryption": "DES"})


def test_both_shipped_profiles_default_to_sse_s3(monkeypatch):
    from ultracluster.run.profiles import load_profile

    monkeypatch.delenv("ULTRACLUSTER_S3_ENCRYPTION", raising=False)
    monkeypatch.delenv("ULTRACLUSTER_S3_KMS_KEY_ID", raising=False)
    for name in ("production", "local"):
        assert profile_sse(load_profile(name)) == {"ServerSideEncryption": "AES256"}
    monkeypatch.setenv("ULTRACLUSTER_S3_ENCRYPTION", "aws:kms")
    monkeypatch.setenv("ULTRACLUSTER_S3_KMS_KEY_ID", "alias/uc")
    assert profile_sse(load_profile("production")) == sse_args("aws:kms", "alias/uc")


# --- the hook and the presigned PUT --------------------------------------------------------------

def test_the_hooks_uploads_are_encrypted(artifacts):
    ArtifactsS3Hook(aws_conn_id="uc_test_aws").load_string("a", "runs/a.json", BUCKET, replace=True)
    ArtifactsS3Hook(aws_conn_id="uc_test_aws", sse=KMS).load_bytes(b"b", "runs/b.bin", BUCKET, replace=True)
    ArtifactsS3Hook(aws_conn_id="uc_test_aws", sse=KMS).put_object(BUCKET, "runs/c.md", b"c", "text/markdown")
    assert encryption(artifacts, "runs/a.json") == ("AES256", None)
    assert encryption(artifacts, "runs/b.bin") == ("aws:kms", KMS["SSEKMSKeyId"])
    assert encryption(artifacts, "runs/c.md") == ("aws:kms", KMS["SSEKMSKeyId"])


def test_a_presigned_put_signs_the_encryption_headers_and_curl_sends_them(artifacts, tmp_path):
    s3 = ArtifactsS3Hook(aws_conn_id="uc_test_aws", sse=KMS)
    url = s3.generate_presigned_url("put_object", {"Bucket": BUCKET, "Key": "runs/up.bin"}, expires_in=600)
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    # Signature V4 (SSE-KMS needs it) with both headers signed: S3 refuses the PUT without them.
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
    assert query["X-Amz-SignedHeaders"] == ["host;x-amz-server-side-encryption;x-amz-server-side-encryption-aws-kms-key-id"]
    local = tmp_path / "up.bin"
    local.write_bytes(b"checkpoint")
    shell = LocalShellHeadNode()
    shell.check(rc.upload_files([(str(local), url)], s3.upload_headers))
    assert encryption(artifacts, "runs/up.bin") == ("aws:kms", KMS["SSEKMSKeyId"])
    assert "x-amz-server-side-encryption" not in shell.commands[0].shell  # headers ride the stdin config
    # Without the headers the object would not be encrypted here (real S3 rejects the signature):
    # what the check above would catch.
    plain = s3.generate_presigned_url("put_object", {"Bucket": BUCKET, "Key": "runs/plain.bin"}, expires_in=600)
    shell.check(rc.upload_files([(str(local), plain)]))
    assert encryption(artifacts, "runs/plain.bin") == (None, None)


def test_upload_to_s3_refuses_a_hook_that_would_not_encrypt(tmp_path):
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    op = CollectResultsOperator(task_id="c", head_node=HEAD, train={"output_dir": "/x"}, artifacts_s3_uri="s3://b")
    with pytest.raises(TypeError, match="ArtifactsS3Hook"):
        op.upload_to_s3(LocalShellHeadNode(), S3Hook(aws_conn_id="uc_test_aws"), BUCKET, "p", [("/x", "x")], "/pid")


# --- every writer of the pipeline ----------------------------------------------------------------

def test_collect_results_uploads_every_file_encrypted(tmp_path, artifacts, head):
    op = CollectResultsOperator(
        task_id="collect_results", head_node=HEAD, train=job_outputs(tmp_path), artifacts_s3_uri=f"s3://{BUCKET}",
        aws_conn_id="uc_test_aws", num_nodes=2, scaling_mode="strong", s3_encryption=KMS)
    ti = SimpleNamespace(dag_id="trn1_bert_pretrain", run_id=RUN_ID, task_id="collect_results",
                         xcom_push=lambda key, value: None)
    op.execute({"ti": ti, "outlet_events": OutletEvents()})
    keys = [o["Key"] for o in artifacts.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert len(keys) == 5  # results.json, both rank logs, the Slurm log, the checkpoint
    assert {k: encryption(artifacts, k) for k in keys} == {k: ("aws:kms", KMS["SSEKMSKeyId"]) for k in keys}


def test_the_compile_cache_archive_is_saved_encrypted_and_restores(tmp_path, aws_conn, head):
    from tests.integration.test_compile_cache import CACHE_URI, CTX, FACTS
    from ultracluster.operators.compile_cache import CompileCacheOperator

    empty_bucket(aws_conn, "uc-compile-cache")
    cache = tmp_path / "c1" / "fsx" / "neuron-compile-cache"
    (cache / "inductor").mkdir(parents=True)
    (cache / "inductor" / "graph.py").write_text("compiled")

    def op(action, cache_dir):
        return CompileCacheOperator(task_id=action, action=action, head_node=HEAD, compile_cache_s3_uri=CACHE_URI,
                                    cache_dir=str(cache_dir), cache_facts=FACTS, aws_conn_id="uc_test_aws",
                                    s3_encryption=KMS)

    saved = op("save", cache).execute(CTX)
    bucket, key = saved["s3_uri"].removeprefix("s3://").split("/", 1)
    assert encryption(aws_conn, key, bucket) == ("aws:kms", KMS["SSEKMSKeyId"])
    other = tmp_path / "c2" / "fsx" / "neuron-compile-cache"
    assert op("restore", other).execute(CTX)["restored"] is True  # a SigV4 presigned GET
    assert (other / "inductor" / "graph.py").read_text() == "compiled"


@pytest.mark.parametrize("driver", ["worker", "trigger"])
def test_usage_json_and_the_rewritten_results_json_are_encrypted(artifacts, moto_endpoint, driver):
    """delete_cluster's bill, by its worker (sync hooks) or by the trigger that ends it (aiobotocore)."""
    import asyncio

    import boto3

    from ultracluster.hooks.cluster_instances import CLUSTER_NAME_TAG
    from ultracluster.hooks.usage import arecord_usage, record_usage

    cluster = f"uc-enc-{driver}"
    ec2 = boto3.client("ec2", endpoint_url=moto_endpoint, region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="c5.xlarge", TagSpecifications=[
        {"ResourceType": "instance", "Tags": [{"Key": CLUSTER_NAME_TAG, "Value": cluster}]}])
    prefix = f"runs/results/trn1_bert_pretrain/{driver}/"
    artifacts.put_object(Bucket=BUCKET, Key=prefix + "results.json", Body=b'{"results": {}}',
                         ServerSideEncryption="AES256")
    spec = {"cluster_name": cluster, "aws_conn_id": "uc_test_aws", "region_name": "us-east-1",
            "results_uri": f"s3://{BUCKET}/{prefix}", "fsx_storage_capacity_gib": None, "s3_encryption": KMS}
    log = logging.getLogger("test")
    usage = (record_usage(log, spec, "2026-12-03T10:00:00+00:00") if driver == "worker"
             else asyncio.run(arecord_usage(log, spec, "2026-12-03T10:00:00+00:00")))
    assert usage["cluster_name"] == cluster and usage["instances"] == 1 and usage["unended"] == 1
    for name in ("usage.json", "results.json"):
        assert encryption(artifacts, prefix + name) == ("aws:kms", KMS["SSEKMSKeyId"])
    written = json.loads(artifacts.get_object(Bucket=BUCKET, Key=prefix + "results.json")["Body"].read())
    assert written == {"results": {}, "usage": usage}


def test_the_sweep_index_and_the_write_probe_are_encrypted(artifacts, monkeypatch):
    from datetime import timedelta

    from ultracluster.operators.preflight import PreflightOperator

    op = PreflightOperator(task_id="preflight", schedule_period=timedelta(days=7),
                           artifacts_s3_uri=f"s3://{BUCKET}/runs", aws_conn_id="uc_test_aws", s3_encryption=KMS,
                           node_kms_policy_arn="arn:aws:iam::123456789012:policy/ultracluster-node-kms")
    point = {"id": "s1", "index": 0, "count": 2, "points": [1, 2], "num_nodes": 1, "scaling_mode": "weak",
             "chosen_by": "point"}
    op._index({"dag": SimpleNamespace(dag_id="trn1_bert_pretrain"), "run_id": RUN_ID}, {"sweep_point": point}, {})
    [key] = [o["Key"] for o in artifacts.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert key.startswith("runs/sweeps/trn1_bert_pretrain/s1/runs/")
    assert encryption(artifacts, key) == ("aws:kms", KMS["SSEKMSKeyId"])
    # The write probe goes up with the same encryption (a KMS key the role cannot use shows there).
    sent = []
    original = ArtifactsS3Hook.load_string
    monkeypatch.setattr(ArtifactsS3Hook, "load_string", lambda self, *a, **kw: (sent.append(self.sse),
                                                                                original(self, *a, **kw))[1])
    from ultracluster.operators.account_checks import unwritable

    assert unwritable(ArtifactsS3Hook(aws_conn_id="uc_test_aws", sse=KMS), "artifacts_s3_uri", f"s3://{BUCKET}/runs",
                     "run-1.probe") == []
    assert sent == [KMS]


def test_render_config_uploads_the_config_and_the_node_script_encrypted(s3):
    from datetime import datetime, timezone

    from tests.unit.test_config import make_context, render_op
    from ultracluster.run.profiles import load_profile

    params = load_profile("production")
    context = make_context(params)
    context["dag_run"] = SimpleNamespace(start_date=datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc))
    result = render_op(params, s3_encryption=KMS,
                       node_kms_policy_arn="arn:aws:iam::123456789012:policy/ultracluster-node-kms").execute(context)
    script = result["on_node_configured_s3_uri"].split("/", 3)[3]
    for key in (result["config_s3_key"], script):
        assert encryption(s3, key) == ("aws:kms", KMS["SSEKMSKeyId"])
