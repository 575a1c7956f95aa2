"""restore_compile_cache / save_compile_cache: the compile cache kept in S3 between runs.

Each run has a cluster, and its FSx, of its own: without this every run compiles from cold (about
13 minutes of a Trn1 cluster for BERT-Large). Restore unpacks the archive of the cache key into the
shared cache directory before parallel_compile; save packs the directory after a successful train
and puts it back. The head node moves the data with presigned URLs (as download_data does), so it
needs no AWS credentials and the archive never travels through the worker. Runs on one cluster (a
sweep's shared cluster) share the cache directory and its archive's path: each restores or saves
under a lock on it (``transfer_lock``), one at a time.
"""
from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from ultracluster import remote_commands
from ultracluster.hooks import DEFAULT_SSH_CONN_ID
from ultracluster.hooks.artifacts import ArtifactsS3Hook
from ultracluster.hooks.head_node import HeadNodeHook
from ultracluster.operators.remote_transfer import RemoteTransferMixin
from ultracluster.run.compile_cache import cache_facts, cache_key, cache_object, compiler_version
from ultracluster.run.s3 import check_sse

if TYPE_CHECKING:
    from airflow.sdk import Context

# A presigned PUT is one request: S3 takes at most 5 GiB in one.
MAX_SINGLE_PUT_BYTES = 5 * 1024**3


class CompileCacheOperator(RemoteTransferMixin, BaseOperator):
    """Restore (``action="restore"``) or save (``"save"``) the compile cache of one key.

    :param head_node: the dict wait_for_fleet returned.
    :param compile_cache_s3_uri: ``s3://bucket/prefix``; empty or None: nothing is kept, and the
        task says so and returns ``{"enabled": False}``.
    :param cache_dir: the shared compile-cache directory on the cluster (COMPILE_CACHE_DIR).
    :param cache_facts: what the key is made of (``compile_cache.cache_facts``).
    :param s3_encryption: server-side encryption of the saved archive (``s3_encryption.sse_args``).
    Returns ``{"enabled", "key", "s3_uri", "restored"|"saved", "bytes"}``.
    """
    template_fields: Sequence[str] = ("head_node", "compile_cache_s3_uri", "cache_dir", "cache_facts")
    ui_color = "#e8daef"

    def __init__(
        self,
        *,
        action: str,
        head_node: dict[str, Any] | str,
        compile_cache_s3_uri: str | None,
        cache_dir: str,
        cache_facts: Mapping[str, Any],
        aws_conn_id: str | None = "aws_default",
        ssh_conn_id: str = DEFAULT_SSH_CONN_ID,
        presigned_url_expiry: int = 6 * 3600,
        transfer_timeout: float = 3 * 3600,
        s3_encryption: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.s3_encryption = check_sse(s3_encryption)  # of the saved archive
        if action not in ("restore", "save"):
            raise ValueError(f"action must be 'restore' or 'save', got {action!r}")
        self.action = action
        self.head_node = head_node
        self.compile_cache_s3_uri = compile_cache_s3_uri
        self.cache_dir = cache_dir
        self.cache_facts = cache_facts
        self.aws_conn_id = aws_conn_id
        self.ssh_conn_id = ssh_conn_id
        self.presigned_url_expiry = presigned_url_expiry
        self.transfer_timeout = transfer_timeout

    def execute(self, context: Context) -> dict[str, Any]:
        if not self.compile_cache_s3_uri:
            self.log.info("compile_cache_s3_uri is not set: no compile cache is kept between runs")
            return {"enabled": False}
        if not posixpath.isabs(self.cache_dir or ""):
            raise ValueError(f"cache_dir must be an absolute path on shared storage, got {self.cache_dir!r}")
        facts = cache_facts(**{"compiler": compiler_version(), **self.cache_facts})
        key = cache_key(facts)
        bucket, object_key = cache_object(self.compile_cache_s3_uri, key)
        result = {"enabled": True, "key": key, "s3_uri": f"s3://{bucket}/{object_key}"}
        self.log.info("Compile cache key %s (%s)", key, ", ".join(f"{k}={v}" for k, v in sorted(facts.items())))
        s3 = ArtifactsS3Hook(aws_conn_id=self.aws_conn_id, sse=self.s3_encryption)
        head_node = HeadNodeHook(ssh_conn_id=self.ssh_conn_id, head_node=self.head_node)
        tar_path = posixpath.join(posixpath.dirname(self.cache_dir.rstrip("/")), f".ultracluster-cache-{key}.tar")
        pid_file = tar_path + ".pid"
        with self.transfer_lock(head_node, tar_path + ".lock", context["ti"].run_id):
            head_node.stop_remote_transfer(pid_file)  # an earlier try's curl, if it still runs
            try:
                if self.action == "restore":
                    return {**result, **self._restore(s3, head_node, bucket, object_key, tar_path, pid_file)}
                return {**result, **self._save(s3, head_node, bucket, object_key, tar_path, pid_file)}
            finally:
                head_node.check(remote_commands.remove_files(tar_path, tar_path + ".part"))

    def _restore(self, s3, head_node, bucket: str, object_key: str, tar_path: str, pid_file: str) -> dict:
        head = s3.head_object(key=object_key, bucket_name=bucket)
        if head is None:
            self.log.info("No archive at s3://%s/%s yet: parallel_compile starts from a cold cache", bucket, object_key)
            return {"restored": False, "bytes": 0}
        size = int(head["ContentLength"])
        url = s3.generate_presigned_url(client_method="get_object", params={"Bucket": bucket, "Key": object_key},
                                        expires_in=self.presigned_url_expiry)
        if not url:
            raise AirflowException(f"Could not presign s3://{bucket}/{object_key}")
        self.run_transfer(head_node, remote_commands.download_to_file(url, tar_path), pid_file,
                          timeout=self.transfer_timeout)
        head_node.check(remote_commands.make_dirs(self.cache_dir))
        head_node.check(remote_commands.unpack_tar(tar_path, self.cache_dir), timeout=self.transfer_timeout)
        self.log.info("Restored %d bytes of compile cache into %s", size, self.cache_dir)
        return {"restored": True, "bytes": size}

    def _save(self, s3, head_node, bucket: str, object_key: str, tar_path: str, pid_file: str) -> dict:
        packed = head_node.check(remote_commands.pack_tar(self.cache_dir, tar_path), timeout=self.transfer_timeout)
        size = int(packed.stdout.strip().splitlines()[-1])
        if size > MAX_SINGLE_PUT_BYTES:
            # Not silent: the task log and XCom say the cache was not kept, and why.
            self.log.warning("Compile cache is %d bytes, over the %d of one presigned PUT: not saved", size,
                             MAX_SINGLE_PUT_BYTES)
            return {"saved": False, "bytes": size, "reason": "larger than one PUT (5 GiB)"}
        url = s3.generate_presigned_url(client_method="put_object", params={"Bucket": bucket, "Key": object_key},
                                        expires_in=self.presigned_url_expiry)
        if not url:
            raise AirflowException(f"Could not presign s3://{bucket}/{object_key}")
        self.run_transfer(head_node, remote_commands.upload_files([(tar_path, url)], s3.upload_headers), pid_file,
                          timeout=self.transfer_timeout)
        self.log.info("Saved %d bytes of compile cache from %s to s3://%s/%s", size, self.cache_dir, bucket, object_key)
        return {"saved": True, "bytes": size}
