"""The reaper's rules (ultracluster.reaper.classify) and the tags they read (ultracluster.run.tags).

The deletes themselves run against the real moto server and the local pcluster CLI:
tests/localcluster/test_reaper_local.py.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from ultracluster.reaper.classify import judge
from ultracluster.run.tags import (
    CREATED_BY_TAG,
    DAG_ID_TAG,
    EXPIRES_AT_TAG,
    RUN_ID_TAG,
    expires_at,
    ownership_tags,
    parse_expiry,
    run_tags,
    s3_tagging,
    tag_problems,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
DAG, RUN = "trn1_bert_pretrain", "manual__2026-11-30T08:00:00+00:00"


def tags(*, marker: bool = True, expires: datetime | None = NOW - timedelta(hours=1), run: str | None = RUN):
    found = {DAG_ID_TAG: DAG}
    if run:
        found[RUN_ID_TAG] = run
    if marker:
        found[CREATED_BY_TAG] = "ultracluster"
    if expires:
        found[EXPIRES_AT_TAG] = expires.strftime("%Y-%m-%dT%H:%M:%SZ")
    return found


def states(**by_run):
    asked = []

    def run_state(dag_id, run_id):
        asked.append((dag_id, run_id))
        return by_run.get(run_id)
    run_state.asked = asked
    return run_state


@pytest.mark.parametrize("state", ["success", "failed"])
def test_a_marked_resource_of_an_ended_run_is_reaped_expired_or_not(state):
    far = NOW + timedelta(days=30)
    verdict = judge("cluster", "uc-a", tags(expires=far), states(**{RUN: state}), NOW)
    assert (verdict.reap, verdict.reason, verdict.run_id, verdict.dag_id) == (True, f"run ended ({state})", RUN, DAG)


@pytest.mark.parametrize("state", ["queued", "running", "RUNNING", "some-new-state"])
def test_a_live_run_s_resource_is_never_reaped_even_long_expired(state):
    verdict = judge("stack", "uc-vpc-a", tags(expires=NOW - timedelta(days=30)), states(**{RUN: state}), NOW)
    assert verdict.reap is False and verdict.reason == f"kept: run is {state.lower()}"


def test_an_unmarked_resource_is_never_reaped_and_its_run_is_not_even_looked_up():
    lookup = states(**{RUN: "success"})
    verdict = judge("stack", "someone-elses", tags(marker=False), lookup, NOW)
    assert verdict.reap is False and "no ultracluster:created-by=ultracluster marker" in verdict.reason
    assert lookup.asked == []
    # A marker with another value is no marker.
    other = {**tags(), CREATED_BY_TAG: "someone"}
    assert judge("stack", "x", other, lookup, NOW).reap is False


def test_an_unknown_run_s_resource_is_reaped_only_once_expired():
    lookup = states()  # no such run anywhere
    expired = judge("cluster", "uc-b", tags(expires=NOW - timedelta(seconds=1)), lookup, NOW)
    assert (expired.reap, expired.reason) == (True, "expired 2026-12-01T11:59:59Z and run unknown")
    fresh = judge("cluster", "uc-b", tags(expires=NOW + timedelta(hours=2)), lookup, NOW)
    assert (fresh.reap, fresh.reason) == (False, "kept: run unknown, expires 2026-12-01T14:00:00Z")
    assert lookup.asked == [(DAG, RUN), (DAG, RUN)]


@pytest.mark.parametrize("value", [None, "", "tomorrow", "2026-12-01 11:00"])
def test_an_unknown_run_s_resource_without_a_valid_expiry_is_kept(value):
    found = tags(expires=None)
    if value is not None:
        found[EXPIRES_AT_TAG] = value
    verdict = judge("stack", "s", found, states(), NOW)
    assert verdict.reap is False and "no valid ultracluster:expires-at" in verdict.reason


def test_a_marked_resource_without_a_run_id_goes_by_its_expiry_alone():
    lookup = states()
    assert judge("stack", "s", tags(run=None), lookup, NOW).reap is True
    assert judge("stack", "s", tags(run=None, expires=NOW + timedelta(hours=1)), lookup, NOW).reap is False
    assert lookup.asked == []


def test_a_failing_state_lookup_fails_the_verdict_instead_of_looking_like_a_gone_run():
    def unreachable(dag_id, run_id):
        raise ConnectionError("API server down")

    with pytest.raises(ConnectionError):
        judge("cluster", "c", tags(), unreachable, NOW)


def test_the_dagrun_state_enum_is_read_by_its_value():
    from airflow.utils.state import DagRunState

    assert judge("cluster", "c", tags(), lambda d, r: DagRunState.SUCCESS, NOW).reap is True
    assert judge("cluster", "c", tags(), lambda d, r: DagRunState.RUNNING, NOW).reap is False


def test_ownership_tags_carry_the_marker_and_the_run_start_plus_the_ttl():
    start = datetime(2026, 11, 30, 8, 0, 30, tzinfo=timezone.utc)
    assert ownership_tags(DAG, RUN, started_at=start, ttl_hours=168) == {
        DAG_ID_TAG: DAG, RUN_ID_TAG: RUN, CREATED_BY_TAG: "ultracluster", EXPIRES_AT_TAG: "2026-12-07T08:00:30Z"}
    assert expires_at(start.replace(tzinfo=None), 1) == "2026-11-30T09:00:30Z"  # naive: UTC
    assert parse_expiry("2026-12-07T08:00:30Z") == datetime(2026, 12, 7, 8, 0, 30, tzinfo=timezone.utc)
    with pytest.raises(ValueError, match="resource_ttl_hours must be positive"):
        expires_at(start, 0)


def test_run_tags_use_the_dag_run_s_start():
    context = {"dag": SimpleNamespace(dag_id=DAG), "run_id": RUN,
               "dag_run": SimpleNamespace(start_date=datetime(2026, 11, 30, 8, 0, tzinfo=timezone.utc))}
    assert run_tags(context, "24")[EXPIRES_AT_TAG] == "2026-12-01T08:00:00Z"  # a templated param is a string


def test_s3_tagging_is_url_encoded_and_reads_back():
    from urllib.parse import parse_qsl

    found = ownership_tags(DAG, RUN, started_at=NOW, ttl_hours=2)
    assert dict(parse_qsl(s3_tagging(found))) == found


def test_tag_problems_count_the_pipeline_s_five_own_tags():
    assert tag_problems({f"k{i}": "v" for i in range(45)}) == []
    assert tag_problems({f"k{i}": "v" for i in range(46)}) == [
        "extra_tags: 46 tags plus the pipeline's 5 exceed AWS's 50 per resource"]
