"""resume_from: the checkpoint a run starts from, named by an S3 URI (docs/operations.md, "Resuming a run").

The URI names a checkpoint object the training program wrote (``.../ckpt_<step>.pt``) or a prefix
holding some, as collect_results (``<artifacts>/results/<dag_id>/<run>/``) and save_failure_artifacts
(``<artifacts>/failed/<dag_id>/<run>/``) leave them; under a prefix the highest step wins. preflight
checks that it resolves before anything is spent (``account_checks``); restore_checkpoint downloads
it onto shared storage with a presigned GET (the head node needs no AWS credentials, the file never
travels through the worker) and train's job gets its path as RESUME_CKPT.
"""
from __future__ import annotations

import posixpath
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from ultracluster import remote_commands
from ultracluster.hooks import DEFAULT_SSH_CONN_ID
from ultracluster.hooks.artifacts import ArtifactsS3Hook
from ultracluster.hooks.head_node import HeadNodeHook
from ultracluster.operators.remote_transfer import RemoteTransferMixin
from ultracluster.run.contracts import CHECKPOINT_KEY
from ultracluster.run.s3 import split_s3_uri

if TYPE_CHECKING:
    from airflow.sdk import Context


class ResumeFromError(ValueError):
    """resume_from names nothing a run can resume from (deterministic: no retry helps)."""


def resolve_checkpoint(s3: Any, uri: str) -> tuple[str, str, int]:
    """``(bucket, key, step)`` of the checkpoint ``uri`` names (S3Hook ``s3``); ResumeFromError if none.
    Transient AWS errors raise as they are."""
    try:
        bucket, key = split_s3_uri(uri)
    except ValueError as err:
        raise ResumeFromError(str(err)) from None
    if not s3.check_for_bucket(bucket):
        raise ResumeFromError(f"bucket {bucket} does not exist (or is not visible to these credentials)")
    match = CHECKPOINT_KEY.search(key)
    if match:
        if s3.head_object(key, bucket) is None:
            raise ResumeFromError(f"no object {uri}")
        return bucket, key, int(match.group(1))
    prefix = f"{key.strip('/')}/" if key.strip("/") else ""
    found = [(int(m.group(1)), k) for k in s3.list_keys(bucket_name=bucket, prefix=prefix) or []
             if (m := CHECKPOINT_KEY.search(k))]
    if not found:
        raise ResumeFromError(f"no checkpoint (ckpt_<step>.pt) at or under {uri}")
    step, key = max(found)
    return bucket, key, step


class RestoreCheckpointOperator(RemoteTransferMixin, BaseOperator):
    """Download the ``resume_from`` checkpoint to ``destination_dir/ckpt_<step>.pt`` on shared storage.

    :param head_node: the dict wait_for_fleet returned.
    :param resume_from: an S3 URI (see the module doc); empty or None: a run from step 0, and the task
        says so and returns ``{"enabled": False, "path": None}``.
    :param destination_dir: absolute directory on shared storage that every node reads.
    Returns ``{"enabled", "s3_uri", "step", "path", "bytes"}``; ``path`` is train's RESUME_CKPT.
    """

    template_fields: Sequence[str] = ("head_node", "resume_from", "destination_dir")
    ui_color = "#e8daef"

    def __init__(
        self,
        *,
        head_node: dict[str, Any] | str,
        resume_from: str | None,
        destination_dir: str,
        aws_conn_id: str | None = "aws_default",
        ssh_conn_id: str = DEFAULT_SSH_CONN_ID,
        presigned_url_expiry: int = 3 * 3600,
        transfer_timeout: float = 3 * 3600,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.head_node = head_node
        self.resume_from = resume_from
        self.destination_dir = destination_dir
        self.aws_conn_id = aws_conn_id
        self.ssh_conn_id = ssh_conn_id
        self.presigned_url_expiry = presigned_url_expiry
        self.transfer_timeout = transfer_timeout

    def execute(self, context: Context) -> dict[str, Any]:
        if self.resume_from in (None, "", "None"):
            self.log.info("resume_from is not set: train starts from step 0 (or from its own checkpoints)")
            return {"enabled": False, "path": None}
        if not posixpath.isabs(self.destination_dir or ""):
            raise ValueError(f"destination_dir must be an absolute path on shared storage, got {self.destination_dir!r}")
        s3 = ArtifactsS3Hook(aws_conn_id=self.aws_conn_id)   # its presigned URLs are Signature V4
        try:
            bucket, key, step = resolve_checkpoint(s3, self.resume_from)
        except ResumeFromError as err:  # preflight checked it: gone since, so no retry helps
            raise AirflowFailException(f"resume_from: {err}") from None
        size = int((s3.head_object(key, bucket) or {}).get("ContentLength") or 0)
        url = s3.generate_presigned_url(client_method="get_object", params={"Bucket": bucket, "Key": key},
                                        expires_in=self.presigned_url_expiry)
        if not url:
            raise AirflowException(f"Could not presign s3://{bucket}/{key}")
        path = posixpath.join(self.destination_dir, f"ckpt_{step}.pt")
        head_node = HeadNodeHook(ssh_conn_id=self.ssh_conn_id, head_node=self.head_node)
        pid_file = path + ".pid"
        head_node.check(remote_commands.make_dirs(self.destination_dir))  # the pid file goes there first
        head_node.stop_remote_transfer(pid_file)  # an earlier try's curl, if it still runs
        self.run_transfer(head_node, remote_commands.download_to_file(url, path), pid_file,
                          timeout=self.transfer_timeout)
        self.log.info("Checkpoint of step %d (%d bytes) from s3://%s/%s is at %s: train resumes from it",
                      step, size, bucket, key, path)
        return {"enabled": True, "s3_uri": f"s3://{bucket}/{key}", "step": step, "path": path, "bytes": size}
