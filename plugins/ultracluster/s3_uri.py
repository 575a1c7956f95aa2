"""``s3://bucket/key`` URIs: the one parser the pipeline uses, and the pattern its params check.

Stdlib only: the DAG file imports this (through params and the operators) at parse time.
"""
from __future__ import annotations

import re

_BUCKET = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"  # S3's bucket naming rules (length 3-63)
S3_URI_PATTERN = rf"^s3://{_BUCKET}(/.*)?$"
_S3_URI = re.compile(rf"^s3://({_BUCKET})(?:/(.*))?$")


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``; ``s3://bucket`` -> ``("bucket", "")``."""
    match = _S3_URI.match(uri or "")
    if not match:
        raise ValueError(f"Not an s3:// URI (s3://bucket[/key]): {uri!r}")
    return match.group(1), match.group(2) or ""
