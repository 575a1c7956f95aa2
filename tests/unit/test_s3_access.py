"""run.s3_access: what an S3 error says (403 denied, 404 missing) and the checksum sidecar's digest."""
from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from ultracluster.run import s3_access
from ultracluster.run.s3_access import DENIED, MISSING, OTHER, sidecar_digest, sidecar_key, verdict


def client_error(code: str, status: int, operation: str = "HeadObject") -> ClientError:
    """As botocore raises it: a HEAD has no body, so its code is the bare status."""
    return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       operation)


@pytest.mark.parametrize(("code", "status", "expected"), [
    ("403", 403, DENIED),                     # HeadObject / HeadBucket refused
    ("AccessDenied", 403, DENIED),            # GetObject refused
    ("AllAccessDisabled", 403, DENIED),
    ("SomethingNew", 403, DENIED),            # the status decides when the code is unknown
    ("404", 404, MISSING),                    # HeadObject / HeadBucket: no such thing
    ("NoSuchKey", 404, MISSING),
    ("NoSuchBucket", 404, MISSING),
    ("NoSuchKey", None, MISSING),             # the code decides without a status
    ("SlowDown", 503, OTHER),
    ("InternalError", 500, OTHER),
])
def test_verdict(code, status, expected):
    assert verdict(client_error(code, status)) == expected


def test_verdict_of_something_without_a_response():
    assert verdict(ValueError("x")) == OTHER


def test_access_denied_names_the_uri_and_the_param_that_helps():
    signed = s3_access.denied_message("s3://b/k.tar", anonymous=False)
    assert signed.startswith("s3://b/k.tar: access denied (HTTP 403): the bucket exists, but these credentials")
    assert "set dataset_anonymous to true" in signed and "--no-sign-request" in signed
    anonymous = s3_access.denied_message("s3://b/k.tar", anonymous=True)
    assert "to anonymous access" in anonymous and "set dataset_anonymous to false" in anonymous
    assert "does not exist" not in signed + anonymous


def test_missing_says_which():
    assert s3_access.missing_message("b", "k", bucket_missing=True) == "bucket b does not exist"
    assert s3_access.missing_message("b", "k", bucket_missing=False) == "no object s3://b/k"


def test_the_sidecar_is_the_tars_key_plus_sha256():
    assert sidecar_key("d/x.tar") == "d/x.tar.sha256"


@pytest.mark.parametrize("text", [
    "E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855  x.tar\n",
    b"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n",
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 *x.tar",
])
def test_sidecar_digest_reads_sha256sum_output(text):
    assert sidecar_digest(text, "s3://b/x.tar.sha256") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


@pytest.mark.parametrize("text", ["", "   \n", "abc  x.tar", "<html>AccessDenied</html>", "g" * 64, "a" * 63])
def test_a_sidecar_without_a_digest_is_refused(text):
    with pytest.raises(ValueError, match=r"s3://b/x\.tar\.sha256 holds no SHA-256 digest"):
        sidecar_digest(text, "s3://b/x.tar.sha256")


def test_a_denied_sidecar_note_says_what_is_still_checked():
    note = s3_access.sidecar_denied_note("s3://b/x.tar.sha256", anonymous=True)
    assert "access denied (HTTP 403) to anonymous access" in note and "size only" in note
