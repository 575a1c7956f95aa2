"""Transfers the head node runs for an operator (curl to or from S3), stoppable from the worker.

Closing an SSH channel does not stop a remote curl writing to a file: ``remote_commands.cancellable``
runs it in a process group whose id goes to a pid file, and ``HeadNodeHook.stop_remote_transfer``
stops that group. A try stops an earlier try's transfer before it starts its own (two curls would
write the same .part file); a kill or a failed try stops its own. Runs sharing a cluster (a sweep's
shared cluster) transfer to the same files one at a time, under ``transfer_lock``.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException

from ultracluster import remote_commands
from ultracluster.hooks.head_node import HeadNodeHook

if TYPE_CHECKING:
    from ultracluster.hooks.head_node import HeadNodeHook
    from ultracluster.remote_commands import RemoteCommand


# Seconds between tries of a lock another run holds.
LOCK_POLL_S = 5
# Files per curl call: a 128-node run's logs, results and checkpoint shards go in one remote command;
# bounded so one stdin config (about 1 KB a presigned URL) stays a few hundred KB.
_UPLOAD_BATCH = 256


class RemoteTransferMixin:
    ssh_conn_id: str
    head_node: Any
    log: Any
    _pid_file: str | None = None  # set while a transfer of this try runs
    presigned_url_expiry: int
    transfer_timeout: float

    def run_transfer(self, head_node: HeadNodeHook, command: RemoteCommand, pid_file: str, *, timeout: float) -> None:
        self._pid_file = pid_file
        try:
            head_node.check(remote_commands.cancellable(command, pid_file), timeout=timeout)
        except Exception:
            # Timeout or SSH loss: the detached curl may still run; the retry must not meet it.
            self._stop_transfer(head_node, pid_file)
            raise
        finally:
            self._pid_file = None

    @contextmanager
    def transfer_lock(self, head_node: HeadNodeHook, lock_dir: str, owner: str) -> Iterator[None]:
        """Hold ``lock_dir`` on the shared storage (``remote_commands.take_lock``) for the block: other
        runs on the cluster wait for it; one held past ``transfer_timeout`` is taken as dead."""
        deadline = time.monotonic() + self.transfer_timeout
        while True:
            taken = head_node.run(remote_commands.take_lock(lock_dir, owner, self.transfer_timeout))
            if taken.ok:
                break
            if taken.exit_status != 3 or time.monotonic() > deadline:
                raise AirflowException(f"Could not take the lock {lock_dir}: "
                                       f"{(taken.stdout + taken.stderr).strip()[-500:]}")
            self.log.info("Run %s holds %s (the same transfer on this cluster): waiting", taken.stdout.strip(),
                          lock_dir)
            time.sleep(LOCK_POLL_S)
        try:
            yield
        finally:
            head_node.run(remote_commands.release_lock(lock_dir, owner))

    def on_kill(self) -> None:
        """Stop the remote curl: closing the SSH channel alone would leave it running."""
        if self._pid_file:

            # A fresh connection: the task's own one is busy in the blocked execute().
            self._stop_transfer(HeadNodeHook(ssh_conn_id=self.ssh_conn_id, head_node=self.head_node), self._pid_file)

    def _stop_transfer(self, head_node: HeadNodeHook, pid_file: str) -> None:
        try:
            head_node.stop_remote_transfer(pid_file)
            self.log.info("Stopped the remote transfer recorded in %s", pid_file)
        except Exception:
            self.log.exception("Could not stop the remote transfer recorded in %s", pid_file)

    def upload_to_s3(self, head_node: HeadNodeHook, s3: Any, bucket: str, prefix: str,
                     uploads: list[tuple[str, str]], pid_file: str) -> None:
        """PUT each (head-node path, key under prefix) straight from the head node, then check every
        key exists. The presigned URLs go to curl on stdin only. ``s3``: an ArtifactsS3Hook, whose URLs
        have the server-side encryption headers signed in; curl sends them."""
        headers = getattr(s3, "upload_headers", None)
        if headers is None:
            raise TypeError(f"upload_to_s3 needs an ArtifactsS3Hook (encrypted uploads), got {type(s3).__name__}")
        for start in range(0, len(uploads), _UPLOAD_BATCH):
            signed = []
            for local, rel in uploads[start : start + _UPLOAD_BATCH]:
                url = s3.generate_presigned_url(
                    client_method="put_object",
                    params={"Bucket": bucket, "Key": f"{prefix}/{rel}"},
                    expires_in=self.presigned_url_expiry,
                )
                if not url:
                    raise AirflowException(f"Could not presign s3://{bucket}/{prefix}/{rel}")
                signed.append((local, url))
            self.run_transfer(head_node, remote_commands.upload_files(signed, headers), pid_file,
                              timeout=self.transfer_timeout)
        # One listing of the prefix (a request per 1000 keys), not a HEAD per file.
        present = set(s3.list_keys(bucket_name=bucket, prefix=f"{prefix}/") or ())
        missing = [rel for _, rel in uploads if f"{prefix}/{rel}" not in present]
        if missing:
            raise AirflowException(f"Uploaded but not found in s3://{bucket}/{prefix}/: {missing}")
        self.log.info("Uploaded %d file(s) to s3://%s/%s/", len(uploads), bucket, prefix)
