"""S3 in a run: ``s3://bucket/key`` URIs, and the server-side encryption of every object the
pipeline writes (docs/operations.md, "Encryption").

The deployment's profile chooses the encryption: ``s3_encryption`` is ``AES256`` (SSE-S3, the
default) or ``aws:kms`` (SSE-KMS) with ``s3_kms_key_id`` (a key id, key ARN or alias; empty: the
account's ``aws/s3`` key). Operators take the result of ``sse_args``: the S3 request parameters
every write carries.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_BUCKET = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"  # S3's bucket naming rules (length 3-63)
S3_URI_PATTERN = rf"^s3://{_BUCKET}(/.*)?$"
_S3_URI = re.compile(rf"^s3://({_BUCKET})(?:/(.*))?$")


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``; ``s3://bucket`` -> ``("bucket", "")``."""
    match = _S3_URI.match(uri or "")
    if not match:
        raise ValueError(f"Not an s3:// URI (s3://bucket[/key]): {uri!r}")
    return match.group(1), match.group(2) or ""


def join_key(*parts: str) -> str:
    """Key parts joined with "/", empty parts and edge slashes dropped."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


SSE_S3 = "AES256"
SSE_KMS = "aws:kms"
MODES = (SSE_S3, SSE_KMS)
DEFAULT_SSE: dict[str, str] = {"ServerSideEncryption": SSE_S3}

# The S3 request parameters and the headers a presigned PUT must send (they are signed into it).
_HEADERS = {"ServerSideEncryption": "x-amz-server-side-encryption",
            "SSEKMSKeyId": "x-amz-server-side-encryption-aws-kms-key-id"}


class EncryptionError(ValueError):
    """The profile's (or an operator's) encryption setting is not one S3 accepts."""


def sse_args(mode: str | None = None, kms_key_id: str | None = None) -> dict[str, str]:
    """``{"ServerSideEncryption": ..., ["SSEKMSKeyId": ...]}`` for a mode and an optional KMS key."""
    mode = mode or SSE_S3
    if mode not in MODES:
        raise EncryptionError(f"s3_encryption must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == SSE_S3:
        if kms_key_id:
            raise EncryptionError(f"s3_kms_key_id {kms_key_id!r} is set but s3_encryption is {SSE_S3}: "
                                  f"set s3_encryption to {SSE_KMS} or clear the key")
        return dict(DEFAULT_SSE)
    return {"ServerSideEncryption": SSE_KMS, **({"SSEKMSKeyId": kms_key_id} if kms_key_id else {})}


def profile_sse(profile: Mapping[str, Any]) -> dict[str, str]:
    """The profile's setting as S3 request parameters."""
    return sse_args(profile.get("s3_encryption") or None, profile.get("s3_kms_key_id") or None)


def check_sse(args: Mapping[str, str] | None) -> dict[str, str]:
    """``args`` validated (None: SSE-S3); anything else than what ``sse_args`` returns is refused."""
    if args is None:
        return dict(DEFAULT_SSE)
    unknown = set(args) - set(_HEADERS)
    if unknown or "ServerSideEncryption" not in args:
        raise EncryptionError(f"S3 encryption must be ServerSideEncryption [+ SSEKMSKeyId], got {dict(args)!r}")
    return sse_args(args["ServerSideEncryption"], args.get("SSEKMSKeyId"))


# The account's AWS managed key for S3: its key policy lets the account's principals use it through S3.
AWS_MANAGED_S3_KEY = "alias/aws/s3"


def customer_kms_key(args: Mapping[str, str] | None) -> str | None:
    """The customer managed KMS key ``args`` encrypt with (its id, ARN or alias as the profile names it),
    or None: SSE-S3, or SSE-KMS under the account's ``aws/s3`` key, which needs no IAM grant to read."""
    args = check_sse(args)
    key = (args.get("SSEKMSKeyId") or "").strip()
    if args["ServerSideEncryption"] != SSE_KMS or not key or key.endswith(AWS_MANAGED_S3_KEY):
        return None
    return key


def sse_headers(args: Mapping[str, str]) -> list[tuple[str, str]]:
    """The HTTP headers that carry ``args`` (what curl sends with a presigned PUT)."""
    return [(_HEADERS[name], value) for name, value in check_sse(args).items()]
