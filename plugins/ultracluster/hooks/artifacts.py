"""S3Hook for the pipeline's own objects: every write carries the deployment's server-side encryption
(``ultracluster.run.s3``; docs/operations.md, "Encryption")."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.providers.amazon.aws.hooks.s3 import S3Hook
from botocore.config import Config
from botocore.exceptions import ClientError

from ultracluster.run.s3 import check_sse, sse_headers


class ArtifactsS3Hook(S3Hook):
    """S3Hook whose uploads (``load_string``, ``load_bytes``, ...) send ``sse`` as ``extra_args``.

    :param sse: ``ultracluster.run.s3.sse_args(...)``; None: SSE-S3.
    """

    def __init__(self, *args: Any, sse: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        self.sse = check_sse(sse)
        self._presign_client = None
        super().__init__(*args, extra_args={**(kwargs.pop("extra_args", None) or {}), **self.sse}, **kwargs)

    @property
    def upload_headers(self) -> list[tuple[str, str]]:
        """Headers a presigned PUT of this hook must be sent with (they are signed into the URL)."""
        return sse_headers(self.sse)

    def put_object(self, bucket: str, key: str, body: bytes, content_type: str) -> None:
        self.get_conn().put_object(Bucket=bucket, Key=key, Body=body, ContentType=content_type, **self.sse)

    def generate_presigned_url(self, client_method: str, params: dict | None = None, expires_in: int = 3600,
                               http_method: str | None = None) -> str | None:
        """Signature V4, which SSE-KMS objects require (botocore presigns S3 with V2 by default);
        a ``put_object`` URL has the encryption headers signed in, so the upload must send them."""
        params = dict(params or {})
        if client_method == "put_object":
            params.update(self.sse)
        # One client for every URL: building a botocore client loads its JSON models (~0.1-0.6 s), and
        # a 64-node run presigns a URL per node log.
        if self._presign_client is None:
            sigv4 = (self.config or Config()).merge(Config(signature_version="s3v4"))
            self._presign_client = self.get_client_type(config=sigv4)
        try:
            return self._presign_client.generate_presigned_url(
                ClientMethod=client_method, Params=params, ExpiresIn=expires_in, HttpMethod=http_method)
        except ClientError as err:
            self.log.error(err.response["Error"]["Message"])
            return None
