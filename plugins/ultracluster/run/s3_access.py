"""What an S3 error says about a read, and how the pipeline words it: access denied (HTTP 403) is not
"missing" (HTTP 404, NoSuchBucket, NoSuchKey); the dataset's ``.sha256`` sidecar (docs/operations.md,
"Public datasets").

botocore's ClientError carries the HTTP status in ``err.response["ResponseMetadata"]["HTTPStatusCode"]``
and the code in ``err.response["Error"]["Code"]``; a HEAD request has no body, so its code is the bare
status ("403", "404").
"""
from __future__ import annotations

import re
from typing import Any

DENIED, MISSING, OTHER = "denied", "missing", "other"

MISSING_CODES = frozenset({"404", "NoSuchBucket", "NoSuchKey", "NotFound"})
DENIED_CODES = frozenset({"403", "AccessDenied", "Forbidden", "AllAccessDisabled"})

# What the param asks for (params.py), named in the messages.
ANONYMOUS_PARAM = "dataset_anonymous"
SIDECAR_SUFFIX = ".sha256"
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")


def verdict(err: Any) -> str:
    """``DENIED``, ``MISSING`` or ``OTHER`` for a botocore ClientError (or anything shaped like one)."""
    response = getattr(err, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in DENIED_CODES or status == 403:
        return DENIED
    if code in MISSING_CODES or status == 404:
        return MISSING
    return OTHER


def denied_message(uri: str, *, anonymous: bool) -> str:
    """A 403: the bucket is there (S3 answers 404 for one that is not), the caller may not read it."""
    if anonymous:
        return (f"{uri}: access denied (HTTP 403) to anonymous access: the bucket exists but does not let "
                "the public read this (S3 also answers 403 for a missing object when the caller may not "
                f"list the bucket); for a private bucket set {ANONYMOUS_PARAM} to false to use the AWS "
                "connection's credentials")
    return (f"{uri}: access denied (HTTP 403): the bucket exists, but these credentials cannot read it "
            "(S3 also answers 403 for a missing object when the caller may not list the bucket); a public "
            f"bucket in another account is read anonymously: set {ANONYMOUS_PARAM} to true, as "
            "`aws s3 cp --no-sign-request` does")


def missing_message(bucket: str, key: str = "", *, bucket_missing: bool) -> str:
    if bucket_missing:
        return f"bucket {bucket} does not exist"
    return f"no object s3://{bucket}/{key}"


def sidecar_key(key: str) -> str:
    """The checksum object next to the tar: ``<key>.sha256`` (``sha256sum`` output: digest first)."""
    return key + SIDECAR_SUFFIX


def sidecar_digest(text: str | bytes, uri: str) -> str:
    """The lower-case SHA-256 a sidecar states; ValueError when it states none."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    words = text.split()
    if not words or not _SHA256.match(words[0]):
        raise ValueError(f"{uri} holds no SHA-256 digest (expected `sha256sum` output: 64 hex digits first), "
                         f"got {text[:80]!r}")
    return words[0].lower()


def sidecar_denied_note(uri: str, *, anonymous: bool) -> str:
    """A 403 on the sidecar: taken as "no sidecar" (the seed's public bucket answers so for a key it
    lacks), said in the log, and the tar's size is still checked."""
    who = "anonymous access" if anonymous else "these credentials"
    return (f"{uri}: access denied (HTTP 403) to {who}, taken as no checksum sidecar (S3 answers 403 for a "
            "missing object when the caller may not list the bucket): the download is checked by its size only")
