"""S3Hook for the dataset, which may sit in a public bucket of another account: anonymous access sends
unsigned requests (``botocore.UNSIGNED``), as ``aws s3 cp --no-sign-request`` does (docs/operations.md,
"Public datasets")."""
from __future__ import annotations

from typing import Any

import boto3
from airflow.providers.amazon.aws.hooks.s3 import S3Hook
from botocore import UNSIGNED
from botocore.config import Config


class DatasetS3Hook(S3Hook):
    """S3Hook whose clients, resources and presigned URLs are unsigned when ``anonymous``.

    The connection still gives the endpoint (moto locally), the region and its own botocore config
    (``config_kwargs``); ``signature_version=UNSIGNED`` is merged into that config, and botocore then
    resolves no credentials. A presigned URL is the object's plain URL.

    :param anonymous: unsigned requests; False: the connection's credentials, Signature V4.
    """

    def __init__(self, *args: Any, anonymous: bool = False, **kwargs: Any) -> None:
        self.anonymous = bool(anonymous)
        super().__init__(*args, **kwargs)

    @property
    def config(self) -> Config:
        # Signed: Signature V4, presigned URLs too (botocore presigns S3 with V2, which S3 refuses in
        # newer regions and for SSE-KMS objects), as ArtifactsS3Hook's.
        return super().config.merge(Config(signature_version=UNSIGNED if self.anonymous else "s3v4"))

    def get_session(self, region_name: str | None = None, deferrable: bool = False) -> boto3.session.Session:
        """Anonymous: a bare session, so no role is assumed (the connection's ``role_arn`` would be
        an STS call) for requests that carry no credentials."""
        if not self.anonymous:
            return super().get_session(region_name=region_name, deferrable=deferrable)
        if deferrable:
            raise NotImplementedError("DatasetS3Hook(anonymous=True) has no async session")
        return boto3.session.Session(region_name=region_name or self.region_name)

    def head(self, bucket: str, key: str) -> dict[str, Any]:
        """HeadObject; ClientError as botocore raises it (403, 404 and all)."""
        return self.get_conn().head_object(Bucket=bucket, Key=key)

    def get_bytes(self, bucket: str, key: str) -> bytes:
        """GetObject's body (for small objects: the checksum sidecar)."""
        return self.get_conn().get_object(Bucket=bucket, Key=key)["Body"].read()
