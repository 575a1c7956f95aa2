"""A public dataset in another account (issue 21, item 4): anonymous access sends no signed request, a
403 is access denied (not "does not exist"), and the ``.sha256`` sidecar is read before the download.

The moto server answers what it can: the object, its sidecar, unsigned requests (a public-read object
answers them, a private one refuses them with a 403), the download itself (curl in a local shell
standing in for the head node, as tests/integration/test_dataset.py). moto has no other account whose
bucket refuses this one's signed requests, and answers 404, not 403, for a missing key: those 403s
come from botocore's Stubber on the dataset's own client; every other call still goes to moto.
"""
from __future__ import annotations

import hashlib
import json
import logging

import pytest
from airflow.sdk.exceptions import AirflowFailException
from botocore.stub import Stubber

from tests.integration.test_dataset import (  # noqa: F401 - fixtures
    CTX, FILES, KEY, URI, aws_conn, empty_bucket, head, make_tar, moto_endpoint, operator)
from ultracluster import remote_commands as rc
from ultracluster.hooks.dataset import DatasetS3Hook
from ultracluster.operators.account_checks import account_problems, unwritable
from ultracluster.run.cost import load_prices
from ultracluster.run.profiles import load_profile
from ultracluster.run.s3_access import sidecar_key

LOG = logging.getLogger("test")
SIDECAR = sidecar_key(KEY)
PUBLIC = "uc-public-dataset"   # its objects are public-read: what anonymous access may read
PUBLIC_URI = f"s3://{PUBLIC}/{KEY}"


@pytest.fixture
def public(aws_conn):
    """Put a public-read object into the public bucket."""
    empty_bucket(aws_conn, PUBLIC)
    return lambda key, body: aws_conn.put_object(Bucket=PUBLIC, Key=key, Body=body, ACL="public-read")


@pytest.fixture
def requests(monkeypatch):
    """Every HTTP request a DatasetS3Hook client sends, as botocore is about to send it (its
    ``before-send`` event): ``(operation, method, url, headers)``. The requests still reach moto."""
    sent: list[tuple[str, str, str, dict]] = []
    real = DatasetS3Hook.get_client_type

    def client(self, *args, **kwargs):
        made = real(self, *args, **kwargs)

        def record(request, event_name, **_):
            sent.append((event_name.rsplit(".", 1)[-1], request.method, request.url, dict(request.headers)))

        made.meta.events.register("before-send.s3", record)
        return made

    monkeypatch.setattr(DatasetS3Hook, "get_client_type", client)
    return sent


@pytest.fixture
def anonymous_conn(moto_endpoint, monkeypatch):
    """A connection that could sign (keys) and would assume a role through an STS that is not there
    (a closed loopback port): anonymous access must use neither."""
    monkeypatch.setenv("AIRFLOW_CONN_UC_TEST_ANON", json.dumps({
        "conn_type": "aws", "login": "testing", "password": "testing",
        "extra": {"endpoint_url": moto_endpoint, "region_name": "us-east-1",
                  "role_arn": "arn:aws:iam::123456789012:role/never-assumed",
                  "service_config": {"sts": {"endpoint_url": "http://127.0.0.1:9"}},
                  "config_kwargs": {"retries": {"max_attempts": 1}}},
    }))
    return "uc_test_anon"


def signed(headers: dict) -> bool:
    return any(name.lower() in ("authorization", "x-amz-security-token") for name in headers)


def test_anonymous_download_sends_no_signed_request(tmp_path, public, anonymous_conn, head, requests):
    body = make_tar(FILES)
    public(KEY, body)
    public(SIDECAR, f"{hashlib.sha256(body).hexdigest()}  x.tar\n".encode())

    result = operator(tmp_path, dataset_s3_uri=PUBLIC_URI, aws_conn_id=anonymous_conn, anonymous=True).execute(CTX)

    assert result["files"] == 3 and result["skipped"] is False
    assert [op for op, *_ in requests] == ["HeadObject", "GetObject"]  # the tar's HEAD, then its sidecar
    assert not any(signed(headers) for *_, headers in requests), requests
    # The head node's URL is the object's own: no signature, no credential, no token.
    curl = next(c for c in head.commands if "curl" in c.shell)
    assert "X-Amz-" not in curl.stdin and "Signature=" not in curl.stdin and "AWSAccessKeyId" not in curl.stdin
    assert f"/{PUBLIC}/{KEY}" in curl.stdin


def test_anonymous_access_to_a_private_object_is_access_denied(tmp_path, aws_conn, anonymous_conn, head):
    """moto's own 403: the object is not public, and an unsigned request may not read it."""
    aws_conn.put_object(Bucket="neuron-s3", Key=KEY, Body=make_tar(FILES))
    with pytest.raises(AirflowFailException, match=r"access denied \(HTTP 403\) to anonymous access"):
        operator(tmp_path, aws_conn_id=anonymous_conn, anonymous=True).execute(CTX)
    assert head.commands == []
    plan = {**load_profile("local"), "dataset_s3_uri": URI, "dataset_anonymous": True,
            "artifacts_s3_uri": "s3://neuron-s3/runs", "key_name": None}
    problems = account_problems(plan, "uc_test_aws", "run-1.probe", load_prices(), LOG)
    assert problems[0].startswith(f"dataset_s3_uri: {URI}: access denied (HTTP 403) to anonymous access"), problems


def test_the_same_download_signed_does_sign(tmp_path, aws_conn, head, requests):
    """The probe can tell: with the connection's credentials every request carries a signature."""
    aws_conn.put_object(Bucket="neuron-s3", Key=KEY, Body=make_tar(FILES))
    operator(tmp_path).execute(CTX)
    assert requests and all(signed(headers) for *_, headers in requests)
    assert "Signature=" in next(c for c in head.commands if "curl" in c.shell).stdin


def test_anonymous_preflight_reads_the_dataset_unsigned(public, requests):
    public(KEY, b"tar")
    plan = {**load_profile("local"), "dataset_s3_uri": PUBLIC_URI, "dataset_anonymous": True,
            "artifacts_s3_uri": "s3://neuron-s3/runs", "key_name": None}
    problems = account_problems(plan, "uc_test_aws", "run-1.probe", load_prices(), LOG)
    # The dataset is fine (only the key pair, left empty here, is a problem); no request was signed.
    assert [p.split(":")[0] for p in problems] == ["key_name"]
    assert [op for op, *_ in requests] == ["HeadObject", "GetObject"]
    assert not any(signed(headers) for *_, headers in requests)


def test_the_sidecar_is_read_before_the_download(tmp_path, aws_conn, head, requests, monkeypatch):
    """One timeline of S3 requests and head-node commands: the sidecar's GET comes before the curl."""
    body = make_tar(FILES)
    aws_conn.put_object(Bucket="neuron-s3", Key=KEY, Body=body)
    aws_conn.put_object(Bucket="neuron-s3", Key=SIDECAR, Body=f"{hashlib.sha256(body).hexdigest()}  x.tar\n".encode())
    real_run = head.run

    def run(command, *, timeout=None):
        requests.append(("head", command.description, "", {}))  # the same list, in the order things happen
        return real_run(command, timeout=timeout)

    monkeypatch.setattr(head, "run", run)
    operator(tmp_path).execute(CTX)
    timeline = [(what, detail if what == "head" else url) for what, detail, url, _ in requests]
    sidecar = timeline.index(("GetObject", next(url for what, url in timeline if url.endswith(".sha256"))))
    download = next(i for i, (what, detail) in enumerate(timeline) if what == "head" and "(cancellable)" in detail)
    assert sidecar < download, timeline
    assert timeline[0][0] == "HeadObject"


def test_a_sidecar_without_a_digest_fails_before_any_download(tmp_path, aws_conn, head):
    aws_conn.put_object(Bucket="neuron-s3", Key=KEY, Body=make_tar(FILES))
    aws_conn.put_object(Bucket="neuron-s3", Key=SIDECAR, Body=b"<html>not a checksum</html>")
    with pytest.raises(AirflowFailException, match=r"\.sha256 holds no SHA-256 digest"):
        operator(tmp_path).execute(CTX)
    assert not any("curl" in c.shell for c in head.commands)


def test_preflight_fails_on_a_sidecar_without_a_digest(aws_conn):
    aws_conn.put_object(Bucket="neuron-s3", Key=KEY, Body=b"tar")
    aws_conn.put_object(Bucket="neuron-s3", Key=SIDECAR, Body=b"nonsense")
    plan = {**load_profile("local"), "dataset_s3_uri": URI, "artifacts_s3_uri": "s3://neuron-s3/runs", "key_name": None}
    problems = account_problems(plan, "uc_test_aws", "run-1.probe", load_prices(), LOG)
    assert problems[0].startswith(f"dataset_s3_uri: {URI}.sha256 holds no SHA-256 digest"), problems


# --- 403s: moto cannot refuse this account, botocore's Stubber answers for the dataset's client ----------

@pytest.fixture
def stub(monkeypatch):
    """The responses the next DatasetS3Hook client gives, in order, instead of moto's; an unexpected
    call fails the test (Stubber raises)."""
    queue: list[tuple[str, dict]] = []
    stubbers: list[Stubber] = []
    real = DatasetS3Hook.get_client_type

    def client(self, *args, **kwargs):
        made = real(self, *args, **kwargs)
        stubber = Stubber(made)
        for method, response in queue:
            if "error" in response:
                stubber.add_client_error(method, service_error_code=response["error"],
                                         http_status_code=response["status"], expected_params=response.get("params"))
            else:
                stubber.add_response(method, response["body"], response.get("params"))
        stubber.activate()
        stubbers.append(stubber)
        return made

    monkeypatch.setattr(DatasetS3Hook, "get_client_type", client)
    yield queue
    for stubber in stubbers:
        stubber.assert_no_pending_responses()


FORBIDDEN = {"error": "403", "status": 403}


def plan(**changes) -> dict:
    return {**load_profile("local"), "dataset_s3_uri": URI, "artifacts_s3_uri": "s3://neuron-s3/runs",
            "key_name": None, **changes}


def dataset_problems(**changes) -> tuple[list[str], list[str]]:
    warnings: list[str] = []
    problems = account_problems(plan(**changes), "uc_test_aws", "run-1.probe", load_prices(), LOG, warnings=warnings)
    return [p for p in problems if p.startswith("dataset_s3_uri")], warnings


def test_preflight_reports_a_403_as_access_denied_not_missing(aws_conn, stub):
    stub.append(("head_object", {**FORBIDDEN, "params": {"Bucket": "neuron-s3", "Key": KEY}}))
    problems, _ = dataset_problems()
    assert len(problems) == 1, problems
    assert "access denied (HTTP 403): the bucket exists, but these credentials cannot read it" in problems[0]
    assert "set dataset_anonymous to true" in problems[0]
    assert "does not exist" not in problems[0] and "not visible" not in problems[0]


def test_a_403_to_anonymous_access_says_so(aws_conn, stub):
    stub.append(("head_object", FORBIDDEN))
    problems, _ = dataset_problems(dataset_anonymous=True)
    assert "access denied (HTTP 403) to anonymous access" in problems[0]
    assert "set dataset_anonymous to false" in problems[0]


def test_a_public_bucket_that_refuses_head_bucket_passes_preflight(aws_conn, stub):
    """The seed's bucket: HeadBucket would answer 403 (no s3:ListBucket for the public), the object
    is readable, and the absent sidecar answers 403 as well. Preflight never asks HeadBucket (the
    Stubber fails an unexpected call), passes, and warns that only the size will be checked."""
    stub.append(("head_object", {"body": {"ContentLength": 3, "ETag": '"abc"'}}))
    stub.append(("get_object", {**FORBIDDEN, "params": {"Bucket": "neuron-s3", "Key": SIDECAR}}))
    problems, warnings = dataset_problems()
    assert problems == []
    assert len(warnings) == 1 and "access denied (HTTP 403)" in warnings[0] and "size only" in warnings[0]


def test_a_404_is_missing_and_head_bucket_tells_bucket_from_key(aws_conn, stub):
    stub.append(("head_object", {"error": "404", "status": 404}))
    stub.append(("head_bucket", {"error": "404", "status": 404}))
    problems, _ = dataset_problems()
    assert problems == ["dataset_s3_uri: bucket neuron-s3 does not exist"]


def test_a_403_on_the_artifacts_bucket_is_access_denied(aws_conn):
    """unwritable's HeadBucket through a stubbed S3Hook client (the artifacts bucket of another account)."""
    s3 = DatasetS3Hook(aws_conn_id="uc_test_aws")
    client = s3.get_conn()
    with Stubber(client) as stubber:
        stubber.add_client_error("head_bucket", service_error_code="403", http_status_code=403)
        problems = unwritable(s3, "artifacts_s3_uri", "s3://someone-elses/runs", "p")
    assert problems == [("artifacts_s3_uri: bucket someone-elses: access denied (HTTP 403): the bucket exists, but "
                         "these credentials may not use it (the pipeline writes here: it must be the deployment's own)")]


def test_download_data_fails_at_once_on_a_403(tmp_path, aws_conn, head, stub):
    stub.append(("head_object", FORBIDDEN))
    with pytest.raises(AirflowFailException, match=r"access denied \(HTTP 403\)"):
        operator(tmp_path).execute(CTX)
    assert head.commands == []


def test_a_403_on_the_sidecar_downloads_with_the_size_check_and_says_so(tmp_path, aws_conn, head, stub, capsys):
    """The tar is moto's (curl fetches it); the dataset client's answers are stubbed: its HEAD as moto
    gives it, then a 403 for the sidecar, read before the download."""
    body = make_tar(FILES)
    aws_conn.put_object(Bucket="neuron-s3", Key=KEY, Body=body)
    real_head = aws_conn.head_object(Bucket="neuron-s3", Key=KEY)
    stub.append(("head_object", {"body": {"ContentLength": real_head["ContentLength"], "ETag": real_head["ETag"]}}))
    stub.append(("get_object", {**FORBIDDEN, "params": {"Bucket": "neuron-s3", "Key": SIDECAR}}))
    result = operator(tmp_path).execute(CTX)
    assert result["files"] == 3
    assert "taken as no checksum sidecar" in capsys.readouterr().out  # the task log
    tar = str(tmp_path / "fsx" / "data" / KEY.rsplit("/", 1)[-1])
    assert rc.sha256_of(tar).shell not in [c.shell for c in head.commands]  # no digest to check against


def test_a_dataset_uri_without_a_key_is_a_problem_not_a_crash(aws_conn):
    problems, _ = dataset_problems(dataset_s3_uri="s3://neuron-s3/training_datasets/")
    assert problems == [("dataset_s3_uri: dataset_s3_uri must be s3://bucket/key of a tar file, "
                         "got 's3://neuron-s3/training_datasets/'")]
