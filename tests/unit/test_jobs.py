"""run.jobs: what a Slurm job's end means for its task, and the auto-resume rules."""
from __future__ import annotations

import pytest

from ultracluster.run.events import event
from ultracluster.run.jobs import (
    FINAL, NODE_FAULT, REFUSED, RETRY, SUCCEEDED, job_outcome, resume_point, resume_refusal,
)


@pytest.mark.parametrize("payload, reasons, outcome", [
    (event("complete", state="COMPLETED"), (), SUCCEEDED),
    (event("budget_exceeded"), (), FINAL),
    (event("host_key_mismatch"), (), FINAL),
    (event("job_failed", state="NODE_FAIL"), ("DATA_DIR is empty",), REFUSED),
    (event("job_failed", state="NODE_FAIL"), (), NODE_FAULT),
    (event("job_failed", state="FAILED", job_reason="NodeDown"), (), NODE_FAULT),
    (event("job_failed", state="FAILED", job_reason="NonZeroExitCode"), (), RETRY),
    (event("unreachable"), (), RETRY),
])
def test_job_outcome(payload, reasons, outcome):
    assert job_outcome(payload, reasons) == outcome


def test_resume_refusal_names_why():
    assert resume_refusal(0, []) == "auto-resume is off: auto_resume_attempts=0"
    assert resume_refusal(2, ["3"]) is None
    assert resume_refusal(2, ["3", "5"]).startswith("Node fault again after 2 of 2 auto-resume attempt(s) "
                                                     "(earlier failed jobs: 3, 5)")


def test_resume_point_takes_the_newest_checkpoint():
    assert resume_point([(10, "/o/6"), (None, "/o/7")], None) == (10, "/o/6")
    assert resume_point([(10, "/o/6")], 12) == (12, None)  # the run's own resume_from checkpoint is newer
    assert resume_point([(None, "/o/6")], None) == (None, None)
