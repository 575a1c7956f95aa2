"""A call AWS denies fails its task at once (run.errors, operators.retry_policy); throttling and every
other failure keep the task's retries."""
from __future__ import annotations

import pytest
from airflow.sdk.definitions.retry_policy import RetryAction
from botocore.exceptions import ClientError

from ultracluster.operators.retry_policy import DeniedCallsFail
from ultracluster.run.errors import denial_in, is_transient

DENIED = ("User: arn:aws:iam::123456789012:user/uc-airflow is not authorized to perform: "
          "cloudformation:CreateStack on resource: arn:aws:cloudformation:us-east-1:123456789012:stack/uc-vpc-x/*")


def client_error(code: str, message: str = "", operation: str = "CreateStack") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, operation)


@pytest.mark.parametrize("code", ["AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "403",
                                  "InvalidClientTokenId", "AuthFailure", "SignatureDoesNotMatch"])
def test_a_denial_fails_at_once_and_says_what_aws_said(code):
    decision = DeniedCallsFail().evaluate(client_error(code, DENIED), try_number=1, max_tries=3)
    assert decision.action == RetryAction.FAIL
    assert f"({code}: {DENIED})" in decision.reason and "cloudformation:CreateStack" in decision.reason
    assert not is_transient(client_error(code))


def test_a_denial_wrapped_by_the_operator_still_fails_at_once():
    """create_vpc raises its own error from the ClientError; a later handler's error keeps it as context."""
    try:
        try:
            raise client_error("AccessDenied", DENIED)
        except ClientError as err:
            raise RuntimeError("Creating stack uc-vpc-x failed") from err
    except RuntimeError as wrapped:
        assert denial_in(wrapped) is wrapped.__cause__
        assert DeniedCallsFail().evaluate(wrapped, 1, 3).action == RetryAction.FAIL
    try:
        try:
            raise client_error("UnauthorizedOperation", "You are not authorized to perform this operation.")
        except ClientError:
            raise ValueError("while cleaning up")  # noqa: B904 - the implicit chain is the point
    except ValueError as implicit:
        assert DeniedCallsFail().evaluate(implicit, 1, 3).action == RetryAction.FAIL


@pytest.mark.parametrize("exception", [
    client_error("Throttling"), client_error("ValidationError", "Stack [x] does not exist"),
    client_error("InternalError"), RuntimeError("the head node is unreachable"), TimeoutError(),
])
def test_anything_else_keeps_the_tasks_retries(exception):
    assert DeniedCallsFail().evaluate(exception, try_number=1, max_tries=3).action == RetryAction.DEFAULT
    assert denial_in(exception) is None


def test_a_cycle_in_the_chain_ends():
    first, second = RuntimeError("a"), RuntimeError("b")
    first.__context__, second.__context__ = second, first
    assert denial_in(first) is None


def test_the_policy_serializes_by_name():
    policy = DeniedCallsFail()
    assert isinstance(DeniedCallsFail.deserialize(policy.serialize()), DeniedCallsFail)
