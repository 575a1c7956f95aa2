"""tests/log_scan.py, the end-to-end runs' secrets scan: it catches each kind of secret, and only secrets."""
from __future__ import annotations

import pytest

from tests.fixtures_localcluster import FAKE_AWS
from tests.log_scan import FAKE_MARKER, Finding, read_logs, scan

PASSWORD = "uc-secret-api-5f0c1d2e3a4b"


def kinds(line: str, known: dict | None = None) -> list[str]:
    return [f.kind for f in scan({"task.log": line}, known)]


@pytest.mark.parametrize(("line", "kind"), [
    ("Using credentials AKIAIOSFODNN7EXAMPLE from the environment", "access key id"),
    ("temporary key ASIAY34FZKBOKMUTVV7A expires", "access key id"),
    ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "secret access key"),
    ('{"SecretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}', "secret access key"),
    ("AWS_SESSION_TOKEN=IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLWVhc3QtMSJHMEUCIQ", "session token"),
    ("curl https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=0f1e2d3c",
     "presigned URL signature"),
    ("GET /k?X-Amz-Credential=AKIA%2F20261203%2Fus-east-1%2Fs3%2Faws4_request", "presigned URL signature"),
    ("https://b.s3.amazonaws.com/k?AWSAccessKeyId=x&Signature=abc%3D&Expires=1", "presigned URL signature"),
    ("x-amz-security-token=FwoGZXIvYXdzEHoaDGV4YW1wbGU", "presigned URL signature"),
    (f"login {FAKE_MARKER.upper()}-anything", "local fake credential"),
])
def test_each_kind_of_secret_is_caught(line, kind):
    assert kind in kinds(line)


def test_the_local_fake_credentials_are_recognisable():
    """The local deployment's fake keys are what the scan recognises, by shape and by marker."""
    assert kinds(FAKE_AWS["AWS_ACCESS_KEY_ID"]) == ["access key id", "local fake credential"]
    assert kinds(FAKE_AWS["AWS_SECRET_ACCESS_KEY"]) == ["local fake credential"]
    assert len(FAKE_AWS["AWS_ACCESS_KEY_ID"]) == 20 and len(FAKE_AWS["AWS_SECRET_ACCESS_KEY"]) == 40


def test_a_known_secret_is_reported_by_its_name_never_by_its_value():
    found = scan({"a/attempt=1.log": f"one\nadmin logs in with {PASSWORD}\n"}, {"the API password": PASSWORD})
    assert found == [Finding("a/attempt=1.log", 2, "the API password")]
    assert PASSWORD not in str(found[0]) and str(found[0]) == "a/attempt=1.log:2: the API password"
    with pytest.raises(ValueError, match="too short"):
        scan({}, {"a password": "abc"})


@pytest.mark.parametrize("line", [
    "aws_secret_access_key = ***",                       # Airflow's secrets masker did its job
    '{"password": "***", "aws_session_token": "***"}',
    "Uploading s3://ultracluster-artifacts/runs/trn1_bert_pretrain/x/results.json (presigned PUT)",
    "UC_PROGRESS step=12 total=40 loss=7.123456 lr=0.000100 throughput=35.21 eta_s=83",
    "Signature verification passed for the pinned host key SHA256:AAAAC3NzaC1lZDI1NTE5",
    "secret_access_key: not set in the connection",
])
def test_what_is_not_a_secret_passes(line):
    assert kinds(line, {"the API password": PASSWORD}) == []


def test_read_logs_reads_every_file_but_the_skipped(tmp_path):
    (tmp_path / "dag_id=d" / "run_id=r").mkdir(parents=True)
    (tmp_path / "dag_id=d" / "run_id=r" / "attempt=1.log").write_text(f"key {FAKE_AWS['AWS_ACCESS_KEY_ID']}\n")
    (tmp_path / "passwords.json").write_text(f'{{"admin": "{PASSWORD}"}}')
    texts = read_logs(tmp_path, skip=["passwords.json"])
    assert list(texts) == ["dag_id=d/run_id=r/attempt=1.log"]
    assert [f.kind for f in scan(texts)] == ["access key id", "local fake credential"]
