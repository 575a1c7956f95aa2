"""download_data: the dataset tar from S3 to the cluster's shared storage, unpacked and verified.

The head node has curl but no AWS credentials: the worker makes a presigned GET URL with
``DatasetS3Hook`` (the aws connection's endpoint_url - moto locally - is inside the URL, so no endpoint
in code) and the head node downloads it. The URL is a secret: it travels on curl's stdin (``--config
-``), never in a command line, a log line or XCom. ``anonymous``: every request is unsigned, as ``aws
s3 cp --no-sign-request`` (a public bucket in another account); the URL is then the object's own.

Before the download: the tar's HEAD (403 is access denied, 404 missing: ``run.s3_access``), then its
``.sha256`` sidecar, so a bad or unreadable sidecar is known before gigabytes move.

Idempotent: a marker next to the data records the source URI, ETag and size; a rerun with a
matching marker and enough files skips the download.

Once: runs on one cluster (a sweep's shared cluster) download under a lock on the shared storage
(``remote_commands.take_lock``); a run that finds the lock held waits for it, then finds the
holder's marker and skips.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from botocore.exceptions import ClientError

from ultracluster import remote_commands
from ultracluster.hooks import DEFAULT_SSH_CONN_ID
from ultracluster.hooks.dataset import DatasetS3Hook
from ultracluster.hooks.head_node import HeadNodeHook
from ultracluster.operators.remote_transfer import RemoteTransferMixin
from ultracluster.parsers.files import parse_file_listing
from ultracluster.run import s3_access
from ultracluster.run.errors import is_transient
from ultracluster.run.s3 import split_s3_uri

if TYPE_CHECKING:
    from airflow.sdk import Context

    from ultracluster.hooks.head_node import HeadNodeHook

_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
MARKER_PREFIX = ".ultracluster-dataset-"


def dataset_object(uri: str) -> tuple[str, str]:
    """Bucket and key of the dataset tar; a prefix (no key, or a trailing /) is refused."""
    try:
        bucket, key = split_s3_uri(uri)
    except ValueError:
        key = ""
    if not key or key.endswith("/"):
        raise ValueError(f"dataset_s3_uri must be s3://bucket/key of a tar file, got {uri!r}")
    return bucket, key


def dataset_dir_name(key: str) -> str:
    """``.../bert_..._seqlen128.tar`` -> ``bert_..._seqlen128`` (the directory the tar holds)."""
    name = posixpath.basename(key)
    for suffix in _TAR_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def read_sidecar(s3: DatasetS3Hook, bucket: str, key: str) -> tuple[str | None, str | None]:
    """The tar's SHA-256 from its ``<key>.sha256`` sidecar: ``(digest, note)``. No sidecar (404):
    ``(None, None)``; a 403: ``(None, note)``, the note for the log. A sidecar without a digest raises
    ValueError; other errors raise as botocore raised them."""
    name = s3_access.sidecar_key(key)
    uri = f"s3://{bucket}/{name}"
    try:
        text = s3.get_bytes(bucket, name)
    except ClientError as err:
        if is_transient(err):
            raise
        found = s3_access.verdict(err)
        if found == s3_access.MISSING:
            return None, None
        if found == s3_access.DENIED:
            return None, s3_access.sidecar_denied_note(uri, anonymous=s3.anonymous)
        raise
    return s3_access.sidecar_digest(text, uri), None


def marker_content(source_uri: str, etag: str, size: int, files: int) -> dict[str, Any]:
    return {"source": source_uri, "etag": etag, "size": int(size), "files": int(files)}


def marker_matches(marker_text: str, source_uri: str, etag: str, size: int) -> bool:
    """A completion marker written for exactly this object (same URI, ETag and size)."""
    try:
        marker = json.loads(marker_text)
    except (ValueError, TypeError):
        return False
    return (
        isinstance(marker, dict)
        and marker.get("source") == source_uri
        and marker.get("etag") == etag
        and marker.get("size") == int(size)
    )


class DownloadDatasetOperator(RemoteTransferMixin, BaseOperator):
    """Download and unpack the dataset tar on the head node's shared storage.

    :param head_node: the dict wait_for_fleet returned.
    :param dataset_s3_uri: ``s3://bucket/key.tar``.
    :param data_dir: shared-storage directory the tar is unpacked into; the files end up in
        ``<data_dir>/<tar name without .tar>/`` (or ``data_dir`` itself for a flat tar).
    :param aws_conn_id: connection for S3Hook (its endpoint_url is used locally).
    :param anonymous: unsigned requests (``--no-sign-request``): a public bucket of another account.
    :param ssh_conn_id: SSH connection of the head node.
    :param expected_min_files: the unpacked data must hold at least this many matching files.
    :param file_pattern: glob of the training files.
    :return: ``{"data_dir": <directory holding the files>, "files": <count>, "skipped": bool}``
    """
    template_fields: Sequence[str] = ("head_node", "dataset_s3_uri", "data_dir", "expected_min_files", "anonymous")
    ui_color = "#fdebd0"

    def __init__(
        self,
        *,
        head_node: dict[str, Any] | str,
        dataset_s3_uri: str,
        data_dir: str,
        aws_conn_id: str | None = "aws_default",
        anonymous: bool | str = False,
        ssh_conn_id: str = DEFAULT_SSH_CONN_ID,
        expected_min_files: int | str = 1,
        file_pattern: str = "*_training_*.hdf5",
        presigned_url_expiry: int = 6 * 3600,
        transfer_timeout: float = 6 * 3600,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.head_node = head_node
        self.dataset_s3_uri = dataset_s3_uri
        self.data_dir = data_dir
        self.aws_conn_id = aws_conn_id
        self.anonymous = anonymous
        self.ssh_conn_id = ssh_conn_id
        self.expected_min_files = expected_min_files
        self.file_pattern = file_pattern
        self.presigned_url_expiry = presigned_url_expiry
        # The silent curl/tar/sha256sum of a multi-GB dataset prints nothing for a long time.
        self.transfer_timeout = transfer_timeout

    def _validate(self) -> tuple[str, str]:
        bucket, key = dataset_object(self.dataset_s3_uri)
        if not posixpath.isabs(self.data_dir or ""):
            raise ValueError(f"data_dir must be an absolute path on shared storage, got {self.data_dir!r}")
        try:
            self.expected_min_files = int(self.expected_min_files)
        except (TypeError, ValueError):
            raise ValueError(f"expected_min_files must be an integer, got {self.expected_min_files!r}") from None
        if self.expected_min_files < 1:
            raise ValueError("expected_min_files must be >= 1")
        if self.anonymous not in (True, False):  # a rendered template is a bool (native rendering)
            raise ValueError(f"anonymous must be true or false, got {self.anonymous!r}")
        return bucket, key

    def _head(self, s3: DatasetS3Hook, bucket: str, key: str) -> dict[str, Any]:
        """The tar's HEAD; a 403 or 404 fails the task at once (no retry reads it either)."""
        try:
            return s3.head(bucket, key)
        except ClientError as err:
            found = s3_access.verdict(err)
            if is_transient(err) or found == s3_access.OTHER:
                raise
            if found == s3_access.DENIED:
                raise AirflowFailException(
                    f"Dataset {s3_access.denied_message(self.dataset_s3_uri, anonymous=s3.anonymous)}") from None
            raise AirflowFailException(f"Dataset {self.dataset_s3_uri} does not exist") from None

    def _sidecar(self, s3: DatasetS3Hook, bucket: str, key: str) -> str | None:
        try:
            digest, note = read_sidecar(s3, bucket, key)
        except ValueError as err:
            raise AirflowFailException(str(err)) from None
        if note:
            self.log.warning("%s", note)
        elif digest:
            self.log.info("%s%s states SHA-256 %s", self.dataset_s3_uri, s3_access.SIDECAR_SUFFIX, digest)
        else:
            self.log.info("No %s%s: the download is checked by its size", self.dataset_s3_uri,
                          s3_access.SIDECAR_SUFFIX)
        return digest

    def _count(self, head_node: HeadNodeHook, directory: str) -> int:
        result = head_node.check(remote_commands.count_files(directory, self.file_pattern))
        return int(result.stdout.strip() or 0)

    def _dataset_dir(self, head_node: HeadNodeHook, key: str) -> tuple[str, int]:
        """Where the files are, and how many: the tar's own directory, else data_dir."""
        nested = posixpath.join(self.data_dir, dataset_dir_name(key))
        for directory in (nested, self.data_dir):
            count = self._count(head_node, directory)  # 0 when the directory is missing
            if count:
                return directory, count
        return nested, 0

    def execute(self, context: Context) -> dict[str, Any]:
        bucket, key = self._validate()
        s3 = DatasetS3Hook(aws_conn_id=self.aws_conn_id, anonymous=self.anonymous)
        head = self._head(s3, bucket, key)
        etag, size = str(head.get("ETag", "")).strip('"'), int(head["ContentLength"])
        head_node = HeadNodeHook(ssh_conn_id=self.ssh_conn_id, head_node=self.head_node)
        tar_name = posixpath.basename(key)
        marker_path = posixpath.join(self.data_dir, f"{MARKER_PREFIX}{tar_name}.json")

        present = self._present(head_node, marker_path, key, etag, size)
        if present:
            return present
        lock_dir = posixpath.join(self.data_dir, f".ultracluster-download-{tar_name}.lock")
        with self.transfer_lock(head_node, lock_dir, context["ti"].run_id):
            # Another run may have downloaded it while this one waited for the lock.
            return self._present(head_node, marker_path, key, etag, size) or self._download(
                head_node, s3, bucket, key, etag, size, marker_path)

    def _present(self, head_node: HeadNodeHook, marker_path: str, key: str, etag: str,
                 size: int) -> dict[str, Any] | None:
        """The return value when the dataset is already there (the marker matches, enough files)."""
        marker = head_node.check(remote_commands.read_file(marker_path, 4096)).stdout
        if marker_matches(marker, self.dataset_s3_uri, etag, size):
            directory, count = self._dataset_dir(head_node, key)
            if count >= self.expected_min_files:
                self.log.info(
                    "Dataset already in %s (%d files, ETag %s): skipping the download", directory, count, etag
                )
                return {"data_dir": directory, "files": count, "skipped": True}
            self.log.warning("Marker matches but only %d file(s) in %s: downloading again", count, directory)
        return None

    def _download(self, head_node: HeadNodeHook, s3: DatasetS3Hook, bucket: str, key: str, etag: str, size: int,
                  marker_path: str) -> dict[str, Any]:
        tar_name = posixpath.basename(key)
        digest = self._sidecar(s3, bucket, key)  # before the download: a bad sidecar fails first
        tar_path = posixpath.join(self.data_dir, tar_name)
        url = s3.generate_presigned_url(
            client_method="get_object", params={"Bucket": bucket, "Key": key}, expires_in=self.presigned_url_expiry
        )
        if not url:
            raise AirflowException(f"Could not presign {self.dataset_s3_uri}")
        self.log.info("Downloading %s (%d bytes) to %s on the head node", self.dataset_s3_uri, size, tar_path)
        head_node.check(remote_commands.remove_files(marker_path))
        pid_file = posixpath.join(self.data_dir, ".ultracluster-download.pid")
        head_node.stop_remote_transfer(pid_file)  # an earlier try's curl, if it still runs
        self.run_transfer(head_node, remote_commands.download_to_file(url, tar_path), pid_file,
                          timeout=self.transfer_timeout)
        self._verify_tar(head_node, tar_path, size, digest)

        head_node.check(remote_commands.unpack_tar(tar_path, self.data_dir), timeout=self.transfer_timeout)
        directory, count = self._dataset_dir(head_node, key)
        if count < self.expected_min_files:
            raise AirflowException(
                f"Dataset unpacked into {self.data_dir} holds {count} file(s) matching {self.file_pattern}, "
                f"expected at least {self.expected_min_files}"
            )
        manifest = head_node.run(remote_commands.verify_checksum_manifest(directory), timeout=self.transfer_timeout)
        if not manifest.ok:
            raise AirflowException(
                f"Checksum manifest check failed in {directory}: {(manifest.stdout + manifest.stderr).strip()[-2000:]}"
            )
        self.log.info("Checksums: %s", manifest.stdout.strip().splitlines()[0] if manifest.stdout.strip() else "ok")

        head_node.check(
            remote_commands.write_file(marker_path, json.dumps(marker_content(self.dataset_s3_uri, etag, size, count)))
        )
        head_node.check(remote_commands.remove_files(tar_path))
        self.log.info("Dataset ready in %s: %d file(s)", directory, count)
        return {"data_dir": directory, "files": count, "skipped": False}

    def _verify_tar(self, head_node: HeadNodeHook, tar_path: str, size: int, digest: str | None) -> None:
        """Size always; SHA-256 too when the sidecar stated one (``digest``, read before the download)."""
        listing = head_node.check(remote_commands.list_files(posixpath.dirname(tar_path), max_depth=1)).stdout
        sizes = parse_file_listing(listing)
        got = sizes.get(posixpath.basename(tar_path))
        if got != size:
            raise AirflowException(f"Downloaded {tar_path} is {got} bytes, S3 says {size}")
        if digest:
            actual = (
                head_node.check(remote_commands.sha256_of(tar_path), timeout=self.transfer_timeout)
                .stdout.split()[0]
                .lower()
            )
            if actual != digest:
                raise AirflowException(f"SHA-256 of {tar_path} is {actual}, {self.dataset_s3_uri}"
                                       f"{s3_access.SIDECAR_SUFFIX} says {digest}")
            self.log.info("SHA-256 of the tar matches %s%s", self.dataset_s3_uri, s3_access.SIDECAR_SUFFIX)
