"""The one s3:// URI parser."""
from __future__ import annotations

import pytest

from ultracluster.run.s3 import split_s3_uri


@pytest.mark.parametrize(("uri", "expected"), [
    ("s3://bucket/a/b.tar", ("bucket", "a/b.tar")), ("s3://bucket", ("bucket", "")), ("s3://bucket/", ("bucket", "")),
])
def test_split_s3_uri(uri, expected):
    assert split_s3_uri(uri) == expected


@pytest.mark.parametrize("uri", ["https://bucket/x", "s3:///key", "bucket/key", "s3://Bad_Bucket/k", "s3://ab/k"])
def test_split_s3_uri_rejects_others(uri):
    with pytest.raises(ValueError):
        split_s3_uri(uri)
