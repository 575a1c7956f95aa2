"""resume_from: resolving the URI (object or saved-run prefix) against the real moto S3 server,
preflight's check, and restore_checkpoint's presigned download run by a local bash as the head node."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException

from tests.integration.test_account_checks import account, check  # noqa: F401 - fixtures
from tests.integration.test_dataset import (  # noqa: F401 - fixtures
    HEAD,
    stop_leftover_transfers,
    aws_conn,
    empty_bucket,
    head,
    moto_endpoint,
)
from ultracluster.operators.checkpoint import RestoreCheckpointOperator, ResumeFromError, resolve_checkpoint

BUCKET = "ultracluster-artifacts"
RUN = "runs/failed/trn1_bert_pretrain/manual-2026-12-01t08-00-00-00-00-abc"


@pytest.fixture
def saved(aws_conn):  # noqa: F811
    """A failed run's saved prefix: two jobs' checkpoints, a half-written one, logs."""
    empty_bucket(aws_conn, BUCKET)
    for key, body in [(f"{RUN}/output_3/log_ph1_bf16_0_2", b"log"),
                      (f"{RUN}/output_4/checkpoints/ckpt_20.pt", b"step 20"),
                      (f"{RUN}/output_5/checkpoints/ckpt_30.pt", b"step 30"),
                      (f"{RUN}/output_5/checkpoints/.ckpt_40.pt.tmp", b"half"),
                      ("runs/other/ckpt_90.pt", b"another run")]:
        aws_conn.put_object(Bucket=BUCKET, Key=key, Body=body)
    return aws_conn


@pytest.fixture
def s3(saved):
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    return S3Hook(aws_conn_id="uc_test_aws")


@pytest.mark.parametrize("uri, key, step", [
    (f"s3://{BUCKET}/{RUN}/output_4/checkpoints/ckpt_20.pt", f"{RUN}/output_4/checkpoints/ckpt_20.pt", 20),
    (f"s3://{BUCKET}/{RUN}/", f"{RUN}/output_5/checkpoints/ckpt_30.pt", 30),  # the newest under the prefix
    (f"s3://{BUCKET}/{RUN}", f"{RUN}/output_5/checkpoints/ckpt_30.pt", 30),
])
def test_an_object_or_the_newest_checkpoint_under_a_prefix(s3, uri, key, step):
    assert resolve_checkpoint(s3, uri) == (BUCKET, key, step)


@pytest.mark.parametrize("uri, message", [
    (f"s3://{BUCKET}/{RUN}/output_4/checkpoints/ckpt_21.pt", "no object"),
    (f"s3://{BUCKET}/{RUN}/output_3", "no checkpoint (ckpt_<step>.pt) at or under"),
    (f"s3://{BUCKET}/{RUN}/output", "no checkpoint"),  # a prefix is a directory, not a string start
    ("s3://no-such-bucket-uc/ckpt_1.pt", "bucket no-such-bucket-uc does not exist"),
    ("https://x/ckpt_1.pt", "Not an s3:// URI"),
])
def test_what_names_no_checkpoint_is_refused(s3, uri, message):
    with pytest.raises(ResumeFromError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_checkpoint(s3, uri)


def test_preflight_checks_resume_from_before_anything_is_spent(account, saved):  # noqa: F811
    assert check(resume_from=f"s3://{BUCKET}/{RUN}/") == []
    assert check(resume_from=None) == []
    problems = check(resume_from=f"s3://{BUCKET}/{RUN}/nothing-here/")
    assert problems == [f"resume_from: no checkpoint (ckpt_<step>.pt) at or under s3://{BUCKET}/{RUN}/nothing-here/"]


def context():
    return {"ti": SimpleNamespace(dag_id="trn1_bert_pretrain", run_id="r2", task_id="restore_checkpoint")}


def test_the_checkpoint_lands_on_shared_storage_for_train(tmp_path, saved, head, caplog):  # noqa: F811
    destination = tmp_path / "fsx" / "job" / ".resume"
    op = RestoreCheckpointOperator(task_id="restore_checkpoint", head_node=HEAD, resume_from=f"s3://{BUCKET}/{RUN}/",
                                   destination_dir=str(destination), aws_conn_id="uc_test_aws")
    with caplog.at_level(logging.INFO):
        result = op.execute(context())
    assert result == {"enabled": True, "s3_uri": f"s3://{BUCKET}/{RUN}/output_5/checkpoints/ckpt_30.pt", "step": 30,
                      "path": str(destination / "ckpt_30.pt"), "bytes": 7}
    assert (destination / "ckpt_30.pt").read_bytes() == b"step 30"
    assert sorted(p.name for p in destination.iterdir()) == ["ckpt_30.pt"]  # no .part or .pid left
    # The presigned URL goes to curl on stdin: never in a command line or the log. Signature V4.
    assert all("Signature=" not in c.shell for c in head.commands)
    assert any("X-Amz-Algorithm=AWS4-HMAC-SHA256" in (c.stdin or "") for c in head.commands if "curl" in c.shell)
    assert "Signature=" not in caplog.text


def test_without_resume_from_nothing_is_touched(tmp_path, head):  # noqa: F811
    op = RestoreCheckpointOperator(task_id="r", head_node=HEAD, resume_from=None, destination_dir=str(tmp_path))
    assert op.execute(context()) == {"enabled": False, "path": None}
    assert head.commands == []


def test_a_checkpoint_gone_since_preflight_fails_without_retries(tmp_path, saved, head):  # noqa: F811
    op = RestoreCheckpointOperator(task_id="r", head_node=HEAD, resume_from=f"s3://{BUCKET}/runs/gone/",
                                   destination_dir=str(tmp_path), aws_conn_id="uc_test_aws")
    with pytest.raises(AirflowFailException, match="resume_from: no checkpoint"):
        op.execute(context())
    assert head.commands == []
